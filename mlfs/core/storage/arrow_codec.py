"""The Arrow codec of the write-ahead engine (wal.py): one checksummed frame a batch.

The codec of record datasets (`wal.N.arrows`).  The frame format and its reader are
arrow_wal.py; this module is what the engine asks of a codec: queue a batch, begin a new
file (whole with its header, under its name in one rename, so an empty or header-less
file is always damage, never a crash at creation), write the queue, and read a file back
as the batches to keep (`check_replay`).

Replay keeps every intact batch whose `record_seq` is above the newest sealed one,
wherever it lies; a torn frame the writer never acknowledged is skipped, and any other
damage costs only the batches it touches: the engine copies the file to quarantine/,
and the records it lost are counted (the store's `replay_lost`, the runtime's
`records_lost`).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from pathlib import Path

import numpy as np
import pyarrow as pa

from .arrow_wal import (
    FILE_HEADER,
    Frame,
    WalScan,
    file_header,
    read_wal,
    wal_first_seq,
    write_batches,
)
from .wal import Replayed

#: a record_seq at or above this is damage, not a count: at a billion records a second
#: a store would take 292 years to reach it (and pyarrow compares uint64 with int64)
RECORD_SEQ_LIMIT = 1 << 63


class ArrowCodec:
    """Frames of Arrow batches of `schema`, whose first column is `record_seq`."""

    suffix = ".arrows"
    what = "frame"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        #: batches not yet in the write-ahead file, and their bytes
        self.batches: deque[pa.RecordBatch] = deque()
        self.nbytes = 0
        self.first_seq = 0  # the first record_seq of the current file

    def queue(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.nbytes += batch.nbytes

    def waiting(self) -> int:
        return self.nbytes

    def begin(self, path: Path) -> None:
        """Make `path` whole with its header, or take the header of one a failed flush
        made already."""
        if path.exists():
            with open(path, "rb") as fh:
                self.first_seq = wal_first_seq(fh.read(FILE_HEADER))
        else:
            self.first_seq = int(self.batches[0].column(0)[0].as_py())
            _create_wal(path, self.first_seq)

    def write(self, fd: int) -> None:
        """The queued batches, one frame each, then the ack mark (arrow_wal.py): a batch
        leaves the queue once written whole; a failed write is cut back to the last
        whole frame (`TornWal` when that fails too)."""
        try:
            write_batches(fd, self.schema, self.batches, self.first_seq)
        finally:
            self.nbytes = sum(batch.nbytes for batch in self.batches)

    def take_back(self, before: int, size: int) -> int:
        """Give back the last queued batch if it is still queued (a frame is never left
        half-written: `write` cuts it back itself)."""
        if size and self.batches and self.nbytes > before:
            self.nbytes -= self.batches.pop().nbytes
        return 0

    def replay(self, data: bytes, newest: bool, floor: int | None) -> Replayed:
        """A file's intact batches above `floor`, and its damage (`newest` plays no part:
        the ack mark tells a torn write from damage in any file)."""
        scan = read_wal(data, self.schema)
        tables, lost, problems, top = check_replay(scan, self.schema, floor)
        return Replayed(units=tables, rows=sum(t.num_rows for t in tables), top=top,
                        torn=scan.torn, damage=problems, lost=lost,
                        at_least=scan.acked_next is None)


def check_replay(scan: WalScan, schema: pa.Schema, floor: int | None
                 ) -> tuple[list[pa.Table], int, list[str], int | None]:
    """The batches of one scanned file to keep pending, the records lost, the problems,
    and the newest record_seq the file holds or should hold (None: nothing known).

    A batch is kept when it has the store's schema and its record_seq is what a writer
    makes: contiguous (+1 a row), above the batch before it, below RECORD_SEQ_LIMIT, and
    as its frame header says; its rows at or below `floor` (the newest sealed, or kept
    from an earlier file) are in a portion already and are cut off.  Any other batch is
    set aside (a problem; its rows lost).  The records lost are those of the range the
    file should hold (from its first record_seq, or above `floor`, up to its ack mark or
    the newest record_seq any trusted header names) that no kept batch holds: damaged
    frames, lost bytes and batches set aside alike.
    """
    problems = list(scan.damage)
    tables: list[pa.Table] = []
    base = -1 if floor is None else floor
    starts = [scan.first_seq] if scan.first_seq is not None else []
    ends = [scan.acked_next] if scan.acked_next is not None else []
    for first, rows in scan.damaged:
        if rows and first + rows < RECORD_SEQ_LIMIT:  # rows 0: the schema frame
            starts.append(first)
            ends.append(first + rows)
    kept = 0
    previous: int | None = None
    for frame in scan.frames:
        why = _batch_problem(frame, schema, previous)
        if why:
            problems.append(f"batch at byte {frame.offset} set aside: {why}")
            if frame.first_seq is not None and frame.rows \
                    and frame.first_seq + frame.rows < RECORD_SEQ_LIMIT:
                starts.append(frame.first_seq)
                ends.append(frame.first_seq + (frame.rows or 0))
            continue
        rows = frame.batch.num_rows
        if not rows:
            continue
        first = int(frame.batch.column(0)[0].as_py())
        previous = first + rows
        starts.append(first)
        ends.append(previous)
        table = pa.Table.from_batches([frame.batch]).slice(max(0, base + 1 - first))
        if table.num_rows:
            tables.append(table)
            kept += table.num_rows
            base = previous - 1
    # the file's header names its first record_seq; without it, the lowest one seen
    start = scan.first_seq if scan.first_seq is not None else min(starts, default=0)
    low = max(start, -1 if floor is None else floor + 1)
    if scan.acked_next is not None and scan.acked_next > max(low, base + 1):
        problems.append(f"records {max(low, base + 1)}..{scan.acked_next - 1} were "
                        "acknowledged and are not there")
    lost = max(0, max(ends, default=low) - low - kept) if problems else 0
    top = max(ends) - 1 if ends and max(ends) > 0 else None
    return tables, lost, problems, top


def _batch_problem(frame: Frame, schema: pa.Schema, previous: int | None) -> str:
    """Why a decoded batch cannot be a batch the writer wrote ('' when it can)."""
    batch = frame.batch
    if batch.schema != schema:
        return "another schema"
    seq = batch.column(0)
    if seq.null_count:
        return "a null record_seq"
    if not batch.num_rows:
        return "" if not frame.rows else "no rows where its frame says there are"
    values = seq.to_numpy(zero_copy_only=False)
    first, last = int(values[0]), int(values[-1])
    if last >= RECORD_SEQ_LIMIT or first >= RECORD_SEQ_LIMIT:
        return f"record_seq {max(first, last)} out of range"
    if batch.num_rows > 1 and not (np.diff(values.astype(np.int64)) == 1).all():
        return f"record_seq not contiguous ({first}..{last} over {batch.num_rows} rows)"
    if previous is not None and first < previous:
        return f"record_seq goes back ({first} after {previous - 1})"
    if frame.first_seq is not None and (frame.first_seq, frame.rows) != (first,
                                                                         batch.num_rows):
        return "its rows are not the ones its frame header names"
    return ""


def _create_wal(path: Path, first_seq: int) -> None:
    """A new write-ahead file, whole with its header, under its name in one rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # left by a crash at creation
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        written = os.write(fd, file_header(first_seq))
        if written != FILE_HEADER:
            raise OSError(errno.EIO, f"{tmp}: header cut short ({written} bytes)")
    finally:
        os.close(fd)
    os.rename(tmp, path)
