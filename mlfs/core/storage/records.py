"""Record datasets: many rows per tick, or none, kept as Arrow batches from source to Parquet.

A tick dataset has one row per tick, built as a Python dict; a record source (the
kernel's log, per-request block I/O, a population of drives) hands over thousands of rows
per tick, and one Python object per row would cost more than the rows are worth.  So a
record batch stays columnar all the way: the backend gives a `pyarrow.RecordBatch`, a
`pyarrow.Table` or a numpy structured array (`Sample.records`); `to_table` casts it to
the declared schema in one call, the core adds `record_seq` and `tick` as whole columns,
the write-ahead log takes the batch as one Arrow IPC message, and sealing concatenates
the batches and writes them with `pyarrow.parquet.write_table`.

What a batch costs on the way (3 M sim.disks rows in 50,000-row batches on this 2-core
VM, docs/results/records-ingest.md): the cast is the one copy pyarrow alone makes too; the
write-ahead file gets the batch's own buffers (arrow_wal.py: serializing it and copying
the bytes into a bytearray, as the tick store does with its short JSON lines, cost ten
times the write itself); the two core columns are encoded as deltas, not dictionaries
(`record_seq` never repeats: a dictionary would be built for nothing, then dropped).

`RecordStore` is a `PortionStore` (same sealing, retention, faults, watch and fleet
cursors) whose pending rows are Arrow tables and whose write-ahead files
(`wal.N.arrows`) hold one checksummed frame per batch (arrow_wal.py).  Replay keeps
every intact batch whose `record_seq` is above the newest sealed one, wherever it lies;
a torn frame the writer never acknowledged is skipped, and any other damage costs only
the batches it touches: the file is copied to quarantine/, the records it lost are
counted in `records_lost` and a WARNING says so (`check_replay`).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mlfs.abi import EXTRA_RECORDS_LOST, RECORD_CORE_COLUMNS, RECORD_TYPES
from mlfs.base.durable import write_durably
from mlfs.base.portion import (
    Batch,
    Portion,
    StoreError,
    StorePolicy,
    StoreWatch,
    portion_name,
    write_portion_file,
)

from .arrow_wal import (
    FILE_HEADER,
    Frame,
    TornWal,
    WalScan,
    file_header,
    read_wal,
    wal_first_seq,
    write_batches,
)
from .quarantine import keep_copy
from .store import PortionStore

log = logging.getLogger("mlfs.records")

_WAL_SUFFIX = ".arrows"
_WAL_PREFIX = "wal."
#: Parquet row groups of a record portion: as large as pyarrow's default, so a reader
#: decodes few, large groups (a portion of 3 M rows is three)
RECORD_ROW_GROUP_ROWS = 1 << 20

ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(), "uint64": pa.uint64(), "int32": pa.int32(), "uint32": pa.uint32(),
    "uint16": pa.uint16(), "uint8": pa.uint8(), "float64": pa.float64(), "bool": pa.bool_(),
    "string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"),
}
assert set(ARROW_TYPES) == set(RECORD_TYPES)
#: a record_seq at or above this is damage, not a count: at a billion records a second
#: a store would take 292 years to reach it (and pyarrow compares uint64 with int64)
RECORD_SEQ_LIMIT = 1 << 63


class RecordsRefused(ValueError):
    """A batch that does not match the declared fields; str(err) says why."""


def record_schema(fields: dict[str, str]) -> pa.Schema:
    """The record dataset's schema: the core's columns, then the declared fields."""
    seq, tick = RECORD_CORE_COLUMNS
    return pa.schema([(seq, pa.uint64()), (tick, pa.int64())]
                     + [(name, ARROW_TYPES[kind]) for name, kind in fields.items()])


def to_table(records: object, fields: dict[str, str]) -> pa.Table:
    """`Sample.records` as a table of exactly the declared fields, cast in one call each.

    Refuses (RecordsRefused) a batch with a missing or undeclared column, or a value
    that does not cast safely (an overflow, a float into an int column): such a batch is
    the backend's error and is never half-stored.
    """
    if isinstance(records, np.ndarray):
        if records.dtype.names is None:
            raise RecordsRefused("a numpy array without named fields (need a structured dtype)")
        names = list(records.dtype.names)
        columns = {name: records[name] for name in names}
    elif isinstance(records, pa.RecordBatch | pa.Table):
        names = list(records.schema.names)
        columns = {name: records.column(name) for name in names}
    else:
        raise RecordsRefused(f"records of type {type(records).__name__} (need a pyarrow "
                             "RecordBatch or Table, or a numpy structured array)")
    extra = [n for n in names if n not in fields]
    missing = [n for n in fields if n not in columns]
    if extra or missing:
        raise RecordsRefused(f"fields {sorted(extra)} not declared, {sorted(missing)} missing")
    arrays = []
    for name, kind in fields.items():
        try:
            arrays.append(pa.array(columns[name], type=ARROW_TYPES[kind], from_pandas=False)
                          if isinstance(columns[name], np.ndarray)
                          else pc.cast(columns[name], ARROW_TYPES[kind], safe=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                TypeError, ValueError, OverflowError) as exc:
            raise RecordsRefused(f"field {name!r} is not {kind}: {exc}") from None
    return pa.Table.from_arrays(arrays, names=list(fields))


class RecordStore(PortionStore):
    """A record dataset's portions; pending rows are Arrow tables, the WAL Arrow IPC."""

    def __init__(self, directory: Path, fields: dict[str, str], policy: StorePolicy,
                 watch: StoreWatch | None = None, kind: str = "records") -> None:
        self.fields = dict(fields)
        self._tables: list[pa.Table] = []
        #: batches not yet in the write-ahead file, and their bytes
        self._wal_batches: deque[pa.RecordBatch] = deque()
        self._wal_bytes = 0
        #: records the write-ahead files should have held and did not, found at replay
        self.replay_lost = 0
        self._wal_first = 0  # the first record_seq of the current write-ahead file
        super().__init__(directory, record_schema(fields), "record_seq", policy, watch, kind)

    # ---- write-ahead files ------------------------------------------------------
    def _wal_path(self) -> Path:
        return self.directory / f"{_WAL_PREFIX}{self._wal_seq}{_WAL_SUFFIX}"

    def _wal_waiting(self) -> int:
        return self._wal_bytes

    def flush_wal(self, raise_errors: bool = False) -> bool:
        """As PortionStore's, but a new write-ahead file is first made whole with its
        header under a temporary name, then renamed: an empty or header-less
        `wal.N.arrows` is then always damage, never a crash at creation."""
        if self._wal_waiting() and not self._wal_created:
            path = self._wal_path()
            try:
                if path.exists():  # made by a flush that failed after creating it
                    with open(path, "rb") as fh:
                        self._wal_first = wal_first_seq(fh.read(FILE_HEADER))
                else:
                    self._wal_first = int(self._wal_batches[0].column(0)[0].as_py())
                    _create_wal(path, self._wal_first)
            except OSError as exc:
                self._fail("flush", exc)
                if raise_errors:
                    raise
                return False
        return super().flush_wal(raise_errors)

    def _write_wal(self, fd: int) -> None:
        try:
            write_batches(fd, self.schema, self._wal_batches, self._wal_first)
        except TornWal:
            # the torn file keeps its whole batches (and stays in _wal_paths until the
            # seal); the next flush starts a new file
            self._wal_seq += 1
            self._wal_created = False
            raise
        finally:
            self._wal_bytes = sum(batch.nbytes for batch in self._wal_batches)

    def _replay(self) -> None:
        for tmp in self.directory.glob(f".{_WAL_PREFIX}*{_WAL_SUFFIX}.tmp"):
            tmp.unlink(missing_ok=True)  # a creation cut short: it acknowledged nothing
        super()._replay()

    def _wal_pattern(self) -> str:
        return f"{_WAL_PREFIX}*{_WAL_SUFFIX}"

    def _wal_seq_of(self, path: Path) -> int | None:
        return _seq(path)

    def _replay_file(self, wal: Path, newest: bool) -> int | None:
        """Replay one framed (or pre-frame) write-ahead file; the rows buffered, or None
        when it must stay where it is (unreadable, or its copy could not be made).

        Every intact batch above the newest sealed record_seq is kept, whatever lies
        around it.  A file with anything else in it (damage below its ack mark, a batch
        out of range) is copied to quarantine/, the records it should have held and does
        not are counted in `replay_lost` (the runtime's `records_lost`) and a WARNING
        says so; only a torn frame beyond the ack mark (never acknowledged) is skipped
        with an INFO line.  `newest` plays no part: the ack mark tells a torn write from
        damage in any file.
        """
        try:
            data = wal.read_bytes()
        except OSError as exc:
            log.warning("%s: write-ahead file not readable (%s); left in place", wal, exc)
            return None
        scan = read_wal(data, self.schema)
        tables, lost, problems, top = check_replay(scan, self.schema, self.last_key)
        if problems and not self._keep_damaged(wal, data, scan, lost, problems):
            return None
        if scan.torn:
            log.info("%s: a torn last frame (%d bytes, never acknowledged) skipped", wal,
                     scan.torn)
        replayed = 0
        for table in tables:
            self._buffer_table(table, int(table.column(0)[-1].as_py()))
            replayed += table.num_rows
        if top is not None and (self.last_key is None or top > self.last_key):
            # the lost records' numbers are not given to new ones: a record_seq names
            # one record, the one in the quarantine copy if anywhere
            self.last_key = top
        return replayed

    def _keep_damaged(self, wal: Path, data: bytes, scan: WalScan, lost: int,
                      problems: list[str]) -> bool:
        """Copy a damaged file to quarantine/ and count and log what it lost; False when
        the copy failed (the file then stays where it is, outside any batch)."""
        more = "at least " if scan.acked_next is None else ""
        try:
            kept = keep_copy(self.directory, wal.name, data)
        except OSError as exc:
            log.error("%s: write-ahead file damaged (%s) and not copied to quarantine (%s); "
                      "left in place", wal, "; ".join(problems[:3]), exc)
            return False
        self.replay_lost += lost
        log.warning("%s: write-ahead file damaged (%s%s); its intact batches are kept, "
                    "%s%d records lost; a copy is kept in %s", wal, "; ".join(problems[:3]),
                    f"; {len(problems) - 3} more" if len(problems) > 3 else "", more,
                    lost, kept)
        return True

    # ---- batches in ---------------------------------------------------------------
    def _buffer_table(self, table: pa.Table, last_seq: int) -> None:
        if self._pending == 0:
            self._oldest_pending = time.monotonic()
        self._tables.append(table)
        self._pending += table.num_rows
        self.rows_total += table.num_rows
        self.last_key = last_seq

    def next_seq(self) -> int:
        """The record_seq the next batch starts at (one past the newest kept or pending)."""
        return 0 if self.last_key is None else self.last_key + 1

    def append_table(self, table: pa.Table, tick: int) -> int:
        """Number the rows, queue the batch for the WAL, hold it pending; returns its rows.

        `table` has exactly the declared fields (see `to_table`).  StoreError when the
        store is full: nothing changed, the caller counts the rows as lost.
        """
        rows = table.num_rows
        if rows == 0:
            return 0
        if self.full:
            raise StoreError(errno.ENOSPC, f"{self.waiting} records wait to be sealed "
                             f"(max_waiting_rows {self.policy.max_waiting_rows})")
        first = self.next_seq()
        seq = pa.array(np.arange(first, first + rows, dtype=np.uint64))
        ticks = pa.array(np.full(rows, tick, dtype=np.int64))
        full = pa.Table.from_arrays([seq, ticks, *table.columns], schema=self.schema)
        for batch in full.to_batches():
            self._wal_batches.append(batch)
            self._wal_bytes += batch.nbytes
        self._buffer_table(full, first + rows - 1)
        self.watch.dirty.add(self)
        return rows

    def append(self, row: dict, strict: bool = False) -> None:
        raise TypeError("a record store takes batches (append_table), not rows")

    # ---- sealing --------------------------------------------------------------------
    def _take_pending(self) -> dict:
        tables, self._tables = self._tables, []
        return {"table": pa.concat_tables(tables) if len(tables) != 1 else tables[0]}

    def write_batch(self, batch: Batch) -> Portion | None:
        """Write one portion atomically (worker thread): tmp, fsync, rename, fsync dir."""
        write_durably(self._counter_path(), f"{batch.number + 1}\n".encode())
        table = batch.columns["table"]
        final = self.directory / portion_name(batch.number)
        st = write_portion_file(table, final, row_group_size=RECORD_ROW_GROUP_ROWS,
                                use_dictionary=list(self.fields),
                                column_encoding=dict.fromkeys(RECORD_CORE_COLUMNS,
                                                              "DELTA_BINARY_PACKED"))
        for wal in batch.wal_paths:
            wal.unlink(missing_ok=True)
        return Portion(batch.number, final, st.st_size, table.num_rows, st.st_mtime_ns)


def keep_records(runtime, tick: int, sample) -> pa.Table | None:
    """A tick's records into the runtime's record store: numbered, logged, counted.

    Called from the tick's recording half (trio thread).  A batch that does not match the
    declared fields is refused whole (counted in `records_refused`, an error line, the
    log); one the store cannot take now (full) is counted lost, as the source's own
    losses (`Sample.extra[EXTRA_RECORDS_LOST]`) are.
    """
    lost = sample.extra.get(EXTRA_RECORDS_LOST) if isinstance(sample.extra, dict) else None
    if isinstance(lost, int) and not isinstance(lost, bool) and lost > 0:
        runtime.records_lost += lost
    store = runtime.records
    if store is None or sample.records is None:
        return None
    try:
        table = to_table(sample.records, store.fields)
    except RecordsRefused as exc:
        runtime.records_refused += 1
        runtime.mount.count_error(runtime.name, "records")
        log.error("%s: tick %d's records refused: %s", runtime.name, tick, exc)
        return None
    try:
        store.append_table(table, tick)
    except StoreError as exc:
        runtime.records_lost += table.num_rows
        log.error("%s: %d records of tick %d lost: %s", runtime.name, table.num_rows, tick,
                  exc.strerror)
    return table


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
        os.write(fd, file_header(first_seq))
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _seq(path: Path) -> int | None:
    middle = path.name[len(_WAL_PREFIX):-len(_WAL_SUFFIX)]
    return int(middle) if middle.isdigit() else None
