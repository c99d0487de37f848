"""The JSON-lines codec of the write-ahead engine (wal.py): one row a line, `.jsonl`.

The codec of tick stores (a subsystem's dataset, a model's feedback and journal).  Lines
are queued as bytes and written with one write(2) per flush: one os.write per row was
half the cost of a tick.  A line is its own frame: the newline ends it, a damaged line
costs only itself and the next one starts afresh, so replay needs no resynchronising.  A
line has no ack mark, so only the newest file's torn last line (bytes after the last
newline) can be a write that never returned: every older file was complete before a
newer one was begun.  Anything else that is not a row of the store's schema is refused
(the engine keeps it in quarantine/ as the line it was).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from .quarantine import check_line
from .wal import Replayed


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


def encode_row(row: dict) -> bytes:
    """A row as its write-ahead line, newline included."""
    return json.dumps(row, separators=(",", ":")).encode() + b"\n"


class LineCodec:
    """JSON lines of rows whose columns have `types`, keyed (rising) by column `key`."""

    suffix = ".jsonl"
    what = "line"

    def __init__(self, types: dict[str, pa.DataType], key: str) -> None:
        self.types = types
        self.key = key
        self.buffer = bytearray()  # lines not yet written

    def queue(self, line: bytes) -> None:
        self.buffer += line

    def waiting(self) -> int:
        return len(self.buffer)

    def begin(self, path: Path) -> None:
        """Nothing: a line file needs no header (the engine creates it O_APPEND)."""

    def write(self, fd: int) -> None:
        """The queued bytes to `fd` (O_APPEND); what was written leaves the queue, also
        when a later write raises (a line cut in the middle is completed by the next
        flush)."""
        while self.buffer:
            written = os.write(fd, self.buffer)
            del self.buffer[:written]

    def take_back(self, before: int, size: int) -> int:
        """Give back the last queued line (`size` bytes queued behind `before`); how
        many of its bytes reached the file."""
        written = before + size - len(self.buffer)
        del self.buffer[max(before - written, 0):]
        return max(written - before, 0)

    def replay(self, data: bytes, newest: bool, floor: int | None) -> Replayed:
        """A file's rows above `floor` (keys rise: a row at or below it is kept already)."""
        scan = read_lines(data, self.types, newest)
        out = Replayed(torn=scan.torn, refused=scan.bad)
        for row in scan.rows:
            key = row.get(self.key)
            if key is not None:
                if floor is not None and key <= floor:
                    continue  # sealed already
                floor = key
            out.units.append(row)
        out.rows = len(out.units)
        return out
