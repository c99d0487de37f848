"""Crash reports in a Linux kernel log, titled as syzbot titles them.

`parse_log(log)` finds the first report in a console log and returns a `Report`: its title
(the kind and the guilty function, with what varies between hits masked), whether it is
corrupted, its alternative titles and the guilty source file.  Pure Python, no FUSE:
`formats` is the table of report kinds (assembled from one `formats_*` module per
family, entries shaped by `schema`), `skip` the frames and files never to blame,
`parse` the generic parser over the table, `linux` the rules of the kernel's console.
"""

from mlfs.crash.linux import Report, guilty_file, parse_log

__all__ = ["Report", "guilty_file", "parse_log"]
