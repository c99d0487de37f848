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

`RecordStore` is a `PortionStore` (same sealing, retention, faults, watch, fleet cursors,
and the same write-ahead engine, wal.py) whose pending rows are Arrow tables and whose
write-ahead codec is arrow_codec.py: `wal.N.arrows` holds one checksummed frame per
batch.  Replay keeps every intact batch whose `record_seq` is above the newest sealed
one, wherever it lies; a torn frame the writer never acknowledged is skipped, and any
other damage costs only the batches it touches: the file is copied to quarantine/, the
records it lost are counted in `records_lost` and a WARNING says so (`check_replay`).
"""

from __future__ import annotations

import errno
import logging
import time
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

from .arrow_codec import RECORD_SEQ_LIMIT, ArrowCodec, check_replay
from .store import PortionStore
from .wal import Replayed

__all__ = ["RECORD_SEQ_LIMIT", "ArrowCodec", "RecordStore", "RecordsRefused",
           "check_replay", "keep_records", "record_schema", "to_table"]

log = logging.getLogger("mlfs.records")

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
        super().__init__(directory, record_schema(fields), "record_seq", policy, watch, kind)

    def _codec(self) -> ArrowCodec:
        """What this store's write-ahead files hold: checksummed Arrow frames."""
        return ArrowCodec(self.schema)

    def _hold(self, scan: Replayed) -> None:
        """A replayed file's intact batches, pending again; the numbers of records it
        lost are not given to new ones (a record_seq names one record, the one in the
        quarantine copy if anywhere)."""
        for table in scan.units:
            self._buffer_table(table, int(table.column(0)[-1].as_py()))
        if scan.top is not None and (self.last_key is None or scan.top > self.last_key):
            self.last_key = scan.top

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
            self.wal.codec.queue(batch)
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
        self.wal.release(batch.wal_paths)
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
