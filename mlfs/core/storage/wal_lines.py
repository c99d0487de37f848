"""A tick store's write-ahead file read back: JSON lines, one row each.

The JSON-lines codec of the stores' one replay path (`PortionStore._replay` in store.py;
the Arrow codec of record stores is arrow_wal.py).  A line is its own frame: the newline
ends it, a damaged line costs only itself and the next one starts afresh, so replay
needs no resynchronising.  A line has no ack mark, so only the newest file's torn last
line (bytes after the last newline) can be a write that never returned: every older file
was complete before a newer one was begun.  Anything else that is not a row of the
store's schema goes to quarantine/ as the line it was (quarantine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from .quarantine import check_line


@dataclass
class LineScan:
    """A file's rows in order, its refused lines (and why), and a torn last line skipped."""

    rows: list[dict] = field(default_factory=list)
    bad: list[tuple[bytes, str]] = field(default_factory=list)
    torn: int = 0


def read_lines(data: bytes, types: dict[str, pa.DataType], newest: bool) -> LineScan:
    """The rows of one JSON-lines write-ahead file, checked against the column types."""
    scan = LineScan()
    lines = data.split(b"\n")
    torn = lines.pop()  # after the last newline: b"" or a line never finished
    if torn and newest:
        scan.torn = len(torn)
    elif torn:
        scan.bad.append((torn, "a torn line in a file a newer one followed"))
    for raw in lines:
        row, why = check_line(raw, types)
        if row is None:
            scan.bad.append((raw, why))
        else:
            scan.rows.append(row)
    return scan
