"""One exception type that carries an errno and a human reason.

Everything the core refuses raises `Refused`; the FUSE adapter turns it into
`FUSEError(errno)` and the reason goes to `errors`, the log and an event.
"""

from __future__ import annotations

import errno as _errno

from mlfs.base.clock import rfc3339


class Refused(Exception):
    """An input that was checked and refused; nothing was changed."""

    def __init__(self, errno: int, reason: str) -> None:
        super().__init__(reason)
        self.errno = errno
        self.reason = reason


def invalid(reason: str) -> Refused:
    return Refused(_errno.EINVAL, reason)


def busy(reason: str) -> Refused:
    return Refused(_errno.EBUSY, reason)


def error_line(file: str, reason: str, shown: str) -> str:
    """One line of an `errors` file: `<RFC 3339 time> <file> <reason>: <escaped input>`."""
    return f"{rfc3339()} {file} {reason}: {shown}"
