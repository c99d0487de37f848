"""The only pyfuse3 code: node kinds, the inode table and Operations."""
