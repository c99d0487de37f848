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
VM, docs/bench/records-ingest.md): the cast is the one copy pyarrow alone makes too; the
write-ahead file gets the batch's own buffers (arrow_wal.py: serializing it and copying
the bytes into a bytearray, as the tick store does with its short JSON lines, cost ten
times the write itself); the two core columns are encoded as deltas, not dictionaries
(`record_seq` never repeats: a dictionary would be built for nothing, then dropped).

`RecordStore` is a `PortionStore` (same sealing, retention, faults, watch and fleet
cursors) whose pending rows are Arrow tables and whose write-ahead files
(`wal.N.arrows`) are Arrow IPC streams: a schema message, then one message per batch.
Replay reads each file's messages in order and keeps every batch whose `record_seq`
is above the newest sealed one; a torn last message (a write that never returned) ends
that file's replay, and anything unreadable before it is set aside, never dropped.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import deque
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mlfs.abi import EXTRA_RECORDS_LOST, RECORD_CORE_COLUMNS, RECORD_TYPES

from .arrow_wal import TornWal, read_batches, write_batches
from .durable import set_aside, write_durably
from .portion import (
    Batch,
    Portion,
    StoreError,
    StorePolicy,
    StoreWatch,
    portion_name,
    write_portion_file,
)
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
        super().__init__(directory, record_schema(fields), "record_seq", policy, watch, kind)

    # ---- write-ahead files ------------------------------------------------------
    def _wal_path(self) -> Path:
        return self.directory / f"{_WAL_PREFIX}{self._wal_seq}{_WAL_SUFFIX}"

    def _wal_waiting(self) -> int:
        return self._wal_bytes

    def _write_wal(self, fd: int) -> None:
        try:
            write_batches(fd, self.schema, self._wal_batches)
        except TornWal:
            # the torn file keeps its whole batches (and stays in _wal_paths until the
            # seal); the next flush starts a new file
            self._wal_seq += 1
            self._wal_created = False
            raise
        finally:
            self._wal_bytes = sum(batch.nbytes for batch in self._wal_batches)

    def _replay(self) -> None:
        """Batches of write-ahead files not yet in a portion come back pending."""
        self._tables = []
        wals = sorted((p for p in self.directory.glob(_WAL_PREFIX + "*" + _WAL_SUFFIX)
                       if _seq(p) is not None), key=_seq)
        floor = self.last_key
        replayed = 0
        for index, wal in enumerate(wals):
            batches, problem = read_batches(wal.read_bytes())
            if problem and index != len(wals) - 1:
                # not the newest file: its writes all returned, so this is damage
                kept = self.directory / "quarantine" / wal.name
                try:
                    kept.parent.mkdir(exist_ok=True)
                    write_durably(kept, wal.read_bytes())
                    log.error("%s: write-ahead file damaged (%s) after %d batches; a copy "
                              "is kept in %s", wal, problem, len(batches), kept)
                except OSError as exc:
                    log.error("%s: damaged (%s) and not copied aside: %s", wal, problem, exc)
            elif problem:
                log.info("%s: a torn last batch (never acknowledged) skipped: %s", wal, problem)
            for batch in batches:
                table = pa.Table.from_batches([batch])
                if table.schema != self.schema:
                    log.error("%s: a batch of another schema set aside", wal)
                    set_aside(wal, "write-ahead batch of another schema")
                    break
                if floor is not None:
                    table = table.filter(pc.greater(table.column("record_seq"), floor))
                if table.num_rows:
                    self._buffer_table(table, int(pc.max(table.column("record_seq")).as_py()))
                    floor = self.last_key
                    replayed += table.num_rows
            self._wal_paths.append(wal)
        if wals:
            self._wal_seq = _seq(wals[-1]) + 1
        if replayed:
            log.info("%s: %d records recovered from the write-ahead files", self.directory,
                     replayed)
        else:
            for wal in self._wal_paths:
                wal.unlink(missing_ok=True)
            self._wal_paths = []
        if self._wal_paths:
            self.watch.dirty.add(self)

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


def _seq(path: Path) -> int | None:
    middle = path.name[len(_WAL_PREFIX):-len(_WAL_SUFFIX)]
    return int(middle) if middle.isdigit() else None
