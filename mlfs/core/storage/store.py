"""Parquet portion stores: rows in, immutable sealed portions out.

A store owns one directory of the state dir (a subsystem's dataset, a model's
feedback or recommendation journal).  Rows are appended to an in-memory
column buffer *and* to a write-ahead file (one JSON line per row: the engine
of wal.py with the codec of wal_lines.py).  Sealing
swaps the buffer and the WAL out on the trio thread, encodes Parquet in a
worker thread (tmp file, fsync, rename: a portion is complete before its name
exists) and only then publishes it.  Portion numbers come from a persisted
counter and are never reused, even after `discard`.

Faults are conditions, not crashes (see docs/operators.md, limits and faults):
- A write-ahead file is deleted only after the portion holding its rows (or
  the quarantine file holding rows that cannot be encoded) is durable.
- A batch whose write fails (ENOSPC, EIO, EMFILE) stays in memory with its WAL
  files and is retried *before* any later batch: portions stay in key order, so
  replay's rule "a row at or below the newest sealed key is kept" stays true.
- Rows no portion can hold go to `quarantine/` (quarantine.py), never dropped;
  only a torn tail the writer was never told was written is skipped (wal.py).
- A store with work to do (queued lines, pending rows, failed batches) sits in
  its `StoreWatch.dirty` set; the seal loop visits only those.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mlfs.base.durable import write_durably
from mlfs.base.portion import (
    COUNTER_FILE,
    Batch,
    Portion,
    StoreError,
    StoreOwner,
    StorePolicy,
    StoreWatch,
    errno_name,
    held_back,
    portion_name,
    read_counter,
    retention_due,
    scan_portions,
    state_root,
    write_portion_file,
)
from mlfs.base.shipped import ShippedCursors

from .quarantine import ENCODE_ERRORS, quarantine, row_lines, split_unencodable
from .wal import Codec, Replayed, WriteAhead
from .wal_lines import LineCodec, encode_row

log = logging.getLogger("mlfs.store")

SEAL_RETRY_SECONDS = 1.0  # between retries of a failed seal (each encodes the batch again)


class PortionStore:
    """One directory of sealed Parquet portions plus the rows still pending."""

    def __init__(self, directory: Path, schema: pa.Schema, key: str, policy: StorePolicy,
                 watch: StoreWatch | None = None, kind: str = "") -> None:
        self.directory = Path(directory)
        self.schema = schema
        self.key = key
        self.policy = policy
        self.watch = watch if watch is not None else StoreWatch()
        self.kind = kind or self.directory.name
        self.directory.mkdir(parents=True, exist_ok=True)
        self.portions: dict[int, Portion] = {}
        self._types = {f.name: f.type for f in schema}
        self._columns: dict[str, list] = {f.name: [] for f in schema}
        self._pending = 0
        self._oldest_pending = 0.0
        #: the write-ahead files of the pending rows (wal.py), in this store's codec
        self.wal = WriteAhead(self.directory, self._codec(), policy.durable)
        self._failed: list[Batch] = []  # in key order; retried before anything newer
        self._retry_at = 0.0
        self._flush_error: tuple[int, str] | None = None
        self._seal_error: tuple[int, str] | None = None
        self.closed = False
        #: who the store belongs to, for the event announcing a new portion (None: no event)
        self.owner: StoreOwner | None = None
        self.strict_path = self.wal.path  # the WAL of the last strict row
        self.sealing = 0  # batches handed to a thread, not yet committed
        self.rows_total = 0
        self.sealed_total = 0
        self.removed_total = 0
        self.failures_total = 0
        self.quarantined_rows = 0
        #: rows the write-ahead files should have held and did not, found at replay
        #: (damaged Arrow frames: a record store's `records_lost`)
        self.replay_lost = 0
        #: unshipped portions retention removed anyway (the fleet backlog limit)
        self.fleet_lost_total = 0
        self.last_key: int | None = None
        root = state_root(self.directory)
        self._shipped = ShippedCursors(root) if root is not None else None
        self._recover()

    # ---- start-up -------------------------------------------------------
    def _counter_path(self) -> Path:
        return self.directory / COUNTER_FILE

    def _recover(self) -> None:
        self.portions, highest = scan_portions(self.directory)
        self._next = max(read_counter(self.directory, highest), highest + 1, 1)
        if self.portions:
            last = self.portions[max(self.portions)]
            column = pq.read_table(last.path, columns=[self.key]).column(0)
            top = pc.max(column).as_py() if len(column) else None
            if top is not None:
                self.last_key = int(top)
        self._replay()

    def _codec(self) -> Codec:
        """What this store's write-ahead files hold: JSON lines of rows."""
        return LineCodec(self._types, self.key)

    def _replay(self) -> None:
        """Rows of write-ahead files not yet in a portion come back pending (wal.py's
        one replay and quarantine path, in this store's codec)."""
        totals = self.wal.replay(lambda: self.last_key, self._hold)
        self.quarantined_rows += totals.quarantined_lines
        self.replay_lost += totals.lost
        self.watch.quarantined_rows_total += totals.quarantined_lines
        if self.wal.paths:
            self.watch.dirty.add(self)

    def _hold(self, scan: Replayed) -> None:
        """A replayed file's rows, pending again."""
        for row in scan.units:
            self._buffer(row)

    # ---- rows -------------------------------------------------------------
    @property
    def pending(self) -> int:
        return self._pending

    @property
    def next_number(self) -> int:
        return self._next

    @property
    def waiting(self) -> int:
        """Rows held in memory until a portion holds them."""
        return self._pending + sum(b.rows for b in self._failed)  # in flight included

    @property
    def full(self) -> bool:
        return self.waiting >= self.policy.max_waiting_rows

    @property
    def retrying(self) -> bool:
        """Batches that failed wait to be written again (before any newer one)."""
        return bool(self._failed)

    @property
    def error(self) -> tuple[int, str] | None:
        """(errno, "ENOSPC") of the last failed flush or seal, while it lasts."""
        return self._flush_error or self._seal_error

    def _buffer(self, row: dict) -> None:
        for name, values in self._columns.items():
            values.append(row.get(name))
        if self._pending == 0:
            self._oldest_pending = time.monotonic()
        self._pending += 1
        self.rows_total += 1
        key = row.get(self.key)
        if key is not None:
            self.last_key = key

    def append(self, row: dict, strict: bool = False) -> None:
        """Buffer one row and queue its write-ahead line.

        Lines reach the WAL file in batches (`flush_wal`, every ~50 ms from the
        seal loop): one os.write per row was half the cost of a tick.  A
        SIGKILL loses at most the lines of that interval, inside the
        contract's one second.

        `strict` (a writer waits for this row, the recommendation journal): the
        line is written now; if that fails, or the store is full, StoreError
        carries the errno and nothing changed (the line is taken back).  The
        caller then makes it durable off the trio thread with `sync`.
        """
        line = encode_row(row)
        if strict:
            if self.full:
                raise StoreError(errno.ENOSPC, f"{self.waiting} rows wait to be sealed "
                                 f"(max_waiting_rows {self.policy.max_waiting_rows})")
            try:
                self.strict_path = self.wal.write_now(line)
            except OSError as exc:
                self._fail("flush", exc)
                code = exc.errno or errno.EIO
                raise StoreError(code, os.strerror(code)) from exc
            self._flushed()
        else:
            self.wal.codec.queue(line)
            if self.policy.durable:
                self.flush_wal()
        self._buffer(row)
        self.watch.dirty.add(self)

    def flush_wal(self, raise_errors: bool = False) -> bool:
        """Write the queued write-ahead items (wal.py); True when all are out.

        An error (ENOSPC, EIO, EMFILE) keeps the unwritten items queued and marks
        the store failing until a flush succeeds.
        """
        try:
            self.wal.flush()
        except OSError as exc:
            self._fail("flush", exc)
            if raise_errors:
                raise
            return False
        self._flushed()
        return True

    def _flushed(self) -> None:
        if self._flush_error is not None:
            self._flush_error = None
            self._update_failing("write-ahead file writable again")

    def _wal_waiting(self) -> int:
        """Bytes queued for the write-ahead file."""
        return self.wal.codec.waiting()

    def sync(self, path: Path) -> None:
        """fdatasync a WAL file (worker thread; a writer waits for it).

        `path` is `strict_path` taken right after the strict append (a seal
        may rotate the WAL meanwhile).
        """
        self.wal.sync(path)

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self._failed:
            return now >= self._retry_at
        if self._pending == 0:
            return False
        if self._pending >= self.policy.seal_rows:
            return True
        return now - self._oldest_pending >= self.policy.seal_seconds

    def settle(self) -> None:
        """Leave the seal loop's dirty set when nothing is left to do."""
        if not (self._wal_waiting() or self._pending or self._failed or self.sealing
                or self.error or self.wal.paths):
            self.watch.dirty.discard(self)

    # ---- faults -------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> None:
        code = getattr(exc, "errno", None) or errno.EIO
        state = (code, errno_name(exc))
        self.failures_total += 1
        self.watch.failures_total += 1
        first = self.error is None
        if what == "flush":
            self._flush_error = state
        else:
            self._seal_error = state
            self._retry_at = time.monotonic() + SEAL_RETRY_SECONDS
        self.watch.dirty.add(self)
        self._update_failing(None)
        if first:
            log.error("%s: %s failed (%s); rows wait in memory (%d), retried until it works",
                      self.directory, what, exc, self.waiting)

    def _update_failing(self, recovered: str | None) -> None:
        error = self.error
        if error is None:
            if self.watch.failing.pop(self, None) is not None:
                log.warning("%s: storage works again (%s)", self.directory,
                            recovered or "sealed")
        else:
            self.watch.failing[self] = error[1]

    # ---- sealing ----------------------------------------------------------
    def take_batch(self) -> Batch | None:
        """The oldest failed batch, or the pending rows once their WAL lines are written
        (trio thread; cheap): never a newer batch while an older one waits for a retry."""
        if self.sealing:
            return None
        if self._failed:
            batch = self._failed[0]
        else:
            if self._pending == 0 or not self.flush_wal():
                return None
            batch = Batch(self._next, self._take_pending(), self._pending, self.wal.rotate())
            self._next += 1
            self._pending = 0
            self._failed.append(batch)  # until committed
        self.sealing += 1
        return batch

    def _take_pending(self) -> dict:  # the pending rows, as a batch's payload
        columns, self._columns = self._columns, {f.name: [] for f in self.schema}
        return columns

    def write_batch(self, batch: Batch) -> Portion | None:
        """Encode and write one portion atomically (worker thread).

        Rows that can never be encoded go to `quarantine/<number>.jsonl`
        first; the portion holds the rest (None when there is no rest).
        The WAL files go only after both are durable.
        """
        write_durably(self._counter_path(), f"{batch.number + 1}\n".encode())
        try:
            table = self._encode(batch.columns)
        except ENCODE_ERRORS as exc:
            good, bad_rows = split_unencodable(batch.columns, self.schema)
            self._quarantine_rows(batch.number, bad_rows, exc)
            table = self._encode(good) if len(good[self.schema[0].name]) else None
        final = self.directory / portion_name(batch.number)
        portion = None
        if table is not None:
            st = write_portion_file(table, final)
            portion = Portion(batch.number, final, st.st_size, table.num_rows, st.st_mtime_ns)
        self.wal.release(batch.wal_paths)
        return portion

    def _encode(self, columns: dict[str, list]) -> pa.Table:
        arrays = [pa.array(columns[f.name], type=f.type) for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _quarantine_rows(self, number: int, rows: list[dict], exc: BaseException) -> None:
        target = quarantine(self.directory, f"{number:010d}.jsonl", row_lines(rows))
        self.quarantined_rows += len(rows)
        self.watch.quarantined_rows_total += len(rows)
        log.error("%s: %d row(s) of portion %d cannot be encoded (%s); quarantined in %s",
                  self.directory, len(rows), number, exc, target)

    def commit(self, portion: Portion | None, batch: Batch | None = None) -> list[Portion]:
        """Publish a written portion; apply retention; return removed portions."""
        self.sealing -= 1
        number = batch.number if batch is not None else portion.number
        self._failed = [b for b in self._failed if b.number != number]
        if not self._failed and self._seal_error is not None:
            self._seal_error = None
            self._update_failing("failed batches sealed")
        if portion is None:
            return []
        self.portions[portion.number] = portion
        self.sealed_total += 1
        return self._retain()

    def abort(self, batch: Batch, exc: BaseException | None = None) -> None:
        """A write failed: the batch stays (memory and WAL) and is retried first."""
        self.sealing -= 1
        self._fail("seal", exc if exc is not None else OSError(errno.EIO, "seal failed"))

    def seal_now(self) -> Portion | None:
        """Synchronous seal (tests, shutdown); OSError propagates, the batch stays."""
        batch = self.take_batch()
        if batch is None:
            return None
        try:
            portion = self.write_batch(batch)
        except Exception as exc:
            self.abort(batch, exc)
            raise
        self.commit(portion, batch)
        return portion

    def _retain(self) -> list[Portion]:
        """Remove the oldest portions beyond `retention_count` / `retention_bytes`.

        Of those, the ones a fleet pusher has not shipped yet are held back
        while their bytes stay within `fleet_backlog_bytes`; past that the
        oldest of them go after all (retention wins), each counted and logged
        here, and counted again by the pusher, which finds the gap.
        """
        due = retention_due(self.portions, self.policy)
        if not due:
            return []
        shipped = self._shipped.shipped(self.directory) if self._shipped is not None else None
        held, lost = held_back(self.portions, due, shipped, self.policy.fleet_backlog_bytes)
        removed: list[Portion] = []
        for number in due:
            if number in held:
                continue
            oldest = self.portions.pop(number)
            oldest.path.unlink(missing_ok=True)
            removed.append(oldest)
        if lost:
            self.fleet_lost_total += len(lost)
            log.error("%s: retention removed portions %d..%d (%d) before the fleet pusher "
                      "shipped them: unshipped portions over [store] fleet_backlog_bytes = %d",
                      self.directory, lost[0], lost[-1], len(lost),
                      self.policy.fleet_backlog_bytes)
        self.removed_total += len(removed)
        return removed

    def discard(self) -> list[Portion]:
        """Remove every sealed portion (numbers are still never reused)."""
        removed = list(self.portions.values())
        self.portions.clear()
        for portion in removed:
            portion.path.unlink(missing_ok=True)
        self.removed_total += len(removed)
        return removed

    def bytes(self) -> int:
        return sum(p.size for p in self.portions.values())

    def close(self) -> None:
        """Write what is queued (best effort: a failing disk keeps what it refuses)."""
        if not self.flush_wal():
            log.error("%s: %d bytes of write-ahead lines could not be written at close (%s)",
                      self.directory, self._wal_waiting(), self.error)
        self.closed = True
        self.watch.dirty.discard(self)
        self.watch.failing.pop(self, None)

    def read_all(self) -> pa.Table:
        """Every sealed portion as one table (tests and tools, not the hot path)."""
        tables = [pq.read_table(p.path) for _, p in sorted(self.portions.items())]
        if not tables:
            return self.schema.empty_table()
        return pa.concat_tables(tables)


