"""mlfs: the kernel <-> user-space ML exchange, as a FUSE filesystem."""

__version__ = "0.1.0"
