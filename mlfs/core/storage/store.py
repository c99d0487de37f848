"""Parquet portion stores: rows in, immutable sealed portions out.

A store owns one directory of the state dir (a subsystem's dataset, a model's
feedback or recommendation journal).  Rows are appended to an in-memory
column buffer *and* to a write-ahead file (one JSON line per row).  Sealing
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
  only a torn last line of the newest WAL (a write that never returned) is skipped.
- No descriptor is held between writes (the WAL is opened per flush): an idle
  store costs none (10,000 models at 2 fds each exhausted RLIMIT_NOFILE).
- A store with work to do (queued lines, pending rows, failed batches) sits in
  its `StoreWatch.dirty` set; the seal loop visits only those.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mlfs.base.durable import cut_tail, fdatasync_file, fsync_dir, write_durably
from mlfs.base.portion import (
    COUNTER_FILE,
    WAL_PREFIX,
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
    wal_seq,
    write_portion_file,
)
from mlfs.base.shipped import ShippedCursors

from .quarantine import (
    ENCODE_ERRORS,
    quarantine,
    row_lines,
    split_unencodable,
    wal_files,
)
from .wal_lines import read_lines

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
        self._wal_seq = 0
        self._wal_buf = bytearray()  # lines not yet written to the current WAL
        self._wal_created = False
        self._wal_paths: list[Path] = []  # files holding the pending rows
        self._failed: list[Batch] = []  # in key order; retried before anything newer
        self._retry_at = 0.0
        self._flush_error: tuple[int, str] | None = None
        self._seal_error: tuple[int, str] | None = None
        self.closed = False
        #: who the store belongs to, for the event announcing a new portion (None: no event)
        self.owner: StoreOwner | None = None
        self.strict_path = self._wal_path()  # the WAL of the last strict row
        self.sealing = 0  # batches handed to a thread, not yet committed
        self.rows_total = 0
        self.sealed_total = 0
        self.removed_total = 0
        self.failures_total = 0
        self.quarantined_rows = 0
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

    def _replay(self) -> None:
        """Rows of write-ahead files not yet in a portion come back pending.

        The one replay path of both kinds of store: the files are listed (anything not
        a regular file moved to quarantine/, `wal_files`), each is read by the store's
        codec (`_replay_file`: JSON lines here, Arrow frames in a record store), and
        the files are kept: they hold those rows until the next portion is durable
        (rewriting them would need space a full disk may not have).  When no row came
        back, every row is in a portion or in quarantine already, and they go.
        """
        wals = wal_files(self.directory, self._wal_pattern(), self._wal_seq_of)
        replayed = 0
        for index, wal in enumerate(wals):
            rows = self._replay_file(wal, newest=index == len(wals) - 1)
            if rows is None:
                continue  # left on disk, outside any batch: the next start tries again
            replayed += rows
            self._wal_paths.append(wal)
        if wals:
            self._wal_seq = self._wal_seq_of(wals[-1]) + 1
        if replayed:
            log.info("%s: %d rows recovered from the write-ahead files", self.directory,
                     replayed)
        else:
            for wal in self._wal_paths:
                wal.unlink(missing_ok=True)
            self._wal_paths = []
        if self._wal_paths:
            self.watch.dirty.add(self)

    def _wal_pattern(self) -> str:
        """The glob naming this store's write-ahead files."""
        return WAL_PREFIX + "*.jsonl"

    def _wal_seq_of(self, path: Path) -> int | None:
        """A write-ahead file's number, None for a name that is not one."""
        return wal_seq(path)

    def _replay_file(self, wal: Path, newest: bool) -> int | None:
        """Replay one JSON-lines write-ahead file (wal_lines.py): the rows buffered, or
        None when the file must stay where it is (unreadable, or its refused lines
        could not be quarantined)."""
        try:
            scan = read_lines(wal.read_bytes(), self._types, newest)
        except OSError as exc:
            log.warning("%s: write-ahead file not readable (%s); left in place", wal, exc)
            return None
        if scan.torn:
            log.info("%s: a torn last line (%d bytes, never acknowledged) skipped", wal,
                     scan.torn)
        for raw, why in scan.bad:
            log.error("%s: write-ahead line refused (%s): %.200r", wal, why, raw)
        floor = self.last_key  # keys rise: a row at or below it is already kept
        replayed = 0
        for row in scan.rows:
            key = row.get(self.key)
            if key is not None:
                if floor is not None and key <= floor:
                    continue  # sealed already
                floor = key
            self._buffer(row)
            replayed += 1
        if scan.bad and not self._quarantine_lines(wal.name, [raw for raw, _ in scan.bad]):
            return None  # its rows are pending; the file stays for the next start
        return replayed

    def _quarantine_lines(self, name: str, lines: list[bytes]) -> bool:
        """Keep lines no portion can hold beside the store (idempotent per WAL)."""
        try:
            target = quarantine(self.directory, name, lines)
        except OSError as exc:
            log.error("%s: %d write-ahead line(s) refused and not quarantined (%s); the "
                      "write-ahead file is kept", self.directory, len(lines), exc)
            return False
        self.quarantined_rows += len(lines)
        self.watch.quarantined_rows_total += len(lines)
        log.error("%s: %d write-ahead line(s) quarantined in %s", self.directory, len(lines),
                  target)
        return True

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
        line = json.dumps(row, separators=(",", ":")).encode() + b"\n"
        if strict:
            if self.full:
                raise StoreError(errno.ENOSPC, f"{self.waiting} rows wait to be sealed "
                                 f"(max_waiting_rows {self.policy.max_waiting_rows})")
            self._write_strict(line)
            self.strict_path = self._wal_path()
        else:
            self._wal_buf += line
            if self.policy.durable:
                self.flush_wal()
        self._buffer(row)
        self.watch.dirty.add(self)

    def _write_strict(self, line: bytes) -> None:
        earlier = len(self._wal_buf)
        self._wal_buf += line
        try:
            self.flush_wal(raise_errors=True)
        except OSError as exc:
            # give back what was not written; cut a half-written own line off the file
            written = earlier + len(line) - len(self._wal_buf)
            if written > earlier:
                cut_tail(self._wal_path(), written - earlier)
            del self._wal_buf[max(earlier - written, 0):]
            raise StoreError(exc.errno or errno.EIO, os.strerror(exc.errno or errno.EIO)) \
                from exc

    def _wal_path(self) -> Path:
        return self.directory / f"{WAL_PREFIX}{self._wal_seq}.jsonl"

    def flush_wal(self, raise_errors: bool = False) -> bool:
        """Write the queued write-ahead lines with one write(2); True when all are out.

        An error (ENOSPC, EIO, EMFILE) keeps the unwritten bytes queued (a line
        cut in the middle is completed by the next try, O_APPEND) and marks
        the store failing until a flush succeeds.
        """
        if not self._wal_waiting():
            return True
        path = self._wal_path()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                if not self._wal_created:
                    self._wal_paths.append(path)
                    self._wal_created = True
                    if self.policy.durable:
                        fsync_dir(self.directory)
                self._write_wal(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self._fail("flush", exc)
            if raise_errors:
                raise
            return False
        if self._flush_error is not None:
            self._flush_error = None
            self._update_failing("write-ahead file writable again")
        return True

    def _wal_waiting(self) -> int:
        """Bytes queued for the write-ahead file."""
        return len(self._wal_buf)

    def _write_wal(self, fd: int) -> None:
        """Write the queued bytes to `fd` (O_APPEND); what was written leaves the queue,
        also when a later write raises."""
        while self._wal_buf:
            written = os.write(fd, self._wal_buf)
            del self._wal_buf[:written]

    def sync(self, path: Path) -> None:
        """fdatasync a WAL file (worker thread; a writer waits for it).

        `path` is `strict_path` taken right after the strict append (a seal
        may rotate the WAL meanwhile).  A WAL already removed is fine: it goes
        only after the portion holding its rows is durable.
        """
        fdatasync_file(path)

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
                or self.error or self._wal_paths):
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
            batch = Batch(self._next, self._take_pending(), self._pending, self._wal_paths)
            self._next += 1
            self._pending = 0
            self._wal_paths = []
            self._wal_created = False
            self._wal_seq += 1
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
        for wal in batch.wal_paths:
            wal.unlink(missing_ok=True)
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


