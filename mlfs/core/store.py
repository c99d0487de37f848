"""Parquet portion stores: rows in, immutable sealed portions out.

A store owns one directory of the state dir (a subsystem's dataset, a model's
feedback or recommendation journal).  Rows are appended to an in-memory
column buffer *and* to a write-ahead file (one JSON line per row, written with
a single os.write so a SIGKILL loses nothing the kernel has accepted).
Sealing swaps the buffer and the WAL out on the trio thread, encodes Parquet
in a worker thread (tmp file, fsync, rename: a portion is complete before its
name exists) and only then publishes it.  Portion numbers come from a
persisted counter and are never reused, even after `discard`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger("mlfs.store")

PORTION_SUFFIX = ".parquet"
_WAL_PREFIX = "wal."


def portion_name(number: int) -> str:
    return f"{number:010d}{PORTION_SUFFIX}"


@dataclass(frozen=True)
class Portion:
    number: int
    path: Path
    size: int
    rows: int
    mtime_ns: int

    @property
    def name(self) -> str:
        return portion_name(self.number)


@dataclass
class Batch:
    """Rows taken out of the buffer, waiting to be written as one portion."""

    number: int
    columns: dict[str, list]
    rows: int
    wal_path: Path


@dataclass(frozen=True)
class StorePolicy:
    seal_rows: int = 4096
    seal_seconds: float = 10.0
    retention_bytes: int = 1 << 30
    retention_count: int = 1000
    #: fsync the WAL on every append (the recommendation journal)
    durable: bool = False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PortionStore:
    """One directory of sealed Parquet portions plus the rows still pending."""

    def __init__(self, directory: Path, schema: pa.Schema, key: str, policy: StorePolicy):
        self.directory = Path(directory)
        self.schema = schema
        self.key = key
        self.policy = policy
        self.directory.mkdir(parents=True, exist_ok=True)
        self.portions: dict[int, Portion] = {}
        self._columns: dict[str, list] = {f.name: [] for f in schema}
        self._pending = 0
        self._oldest_pending = 0.0
        self._wal_seq = 0
        self._wal_fd = -1
        self._wal_lines: list[bytes] = []
        self._wal_path = self.directory / "wal.0.jsonl"
        self.sealing = 0  # batches handed to a thread, not yet committed
        self.rows_total = 0
        self.sealed_total = 0
        self.removed_total = 0
        self.last_key: int | None = None
        self._recover()

    # ---- start-up -------------------------------------------------------
    def _counter_path(self) -> Path:
        return self.directory / "next_portion"

    def _read_counter(self) -> int:
        try:
            return int(self._counter_path().read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _recover(self) -> None:
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        highest = 0  # damaged portions count too: a name once shown is never reused
        for path in sorted(self.directory.glob("*" + PORTION_SUFFIX)):
            stem = path.name[: -len(PORTION_SUFFIX)]
            if not stem.isdigit():
                continue
            highest = max(highest, int(stem))
            st = path.stat()
            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except Exception as exc:  # a damaged file is kept aside, never served
                log.error("portion %s is unreadable (%s); moved aside", path, exc)
                path.rename(path.with_suffix(".damaged"))
                continue
            self.portions[int(stem)] = Portion(int(stem), path, st.st_size, rows, st.st_mtime_ns)
        self._next = max(self._read_counter(), highest + 1, 1)
        if self.portions:
            last = self.portions[max(self.portions)]
            column = pq.read_table(last.path, columns=[self.key]).column(0)
            top = pc.max(column).as_py() if len(column) else None
            if top is not None:
                self.last_key = int(top)
        # replay write-ahead files: rows not yet in a portion come back pending
        wals = sorted(
            self.directory.glob(_WAL_PREFIX + "*.jsonl"),
            key=lambda p: int(p.name.split(".")[1]) if p.name.split(".")[1].isdigit() else 0,
        )
        replay: list[dict] = []
        floor = self.last_key  # keys rise: a row at or below it is already kept
        for wal in wals:
            with open(wal, "rb") as fh:
                for raw in fh:
                    try:
                        row = json.loads(raw)
                    except ValueError:
                        continue  # a torn last line
                    key = row.get(self.key)
                    if key is not None:
                        if floor is not None and key <= floor:
                            continue  # sealed already, or copied twice by a crashed recovery
                        floor = key
                    replay.append(row)
        if wals:
            self._wal_seq = max(int(p.name.split(".")[1]) for p in wals) + 1
        self._open_wal()
        for row in replay:
            self.append(row)
        for wal in wals:
            wal.unlink(missing_ok=True)
        if replay:
            log.info("%s: %d rows recovered from the write-ahead file", self.directory, len(replay))

    def _open_wal(self) -> None:
        self._wal_path = self.directory / f"{_WAL_PREFIX}{self._wal_seq}.jsonl"
        self._wal_fd = os.open(self._wal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self.policy.durable:
            _fsync_dir(self.directory)

    # ---- rows -------------------------------------------------------------
    @property
    def pending(self) -> int:
        return self._pending

    @property
    def next_number(self) -> int:
        return self._next

    def append(self, row: dict) -> None:
        """Buffer one row and queue its write-ahead line.

        Lines reach the WAL file in batches (`flush_wal`, every ~50 ms from the
        seal loop, and at once for a durable store): one os.write per row was
        half the cost of a tick.  A SIGKILL loses at most the lines of that
        interval, inside the contract's one second.  Durable stores (the
        recommendation journal) are fsynced by the caller, off the trio
        thread, through `sync_fd`.
        """
        self._wal_lines.append(json.dumps(row, separators=(",", ":")).encode() + b"\n")
        if self.policy.durable:
            self.flush_wal()
        for name, values in self._columns.items():
            values.append(row.get(name))
        if self._pending == 0:
            self._oldest_pending = time.monotonic()
        self._pending += 1
        self.rows_total += 1
        key = row.get(self.key)
        if key is not None:
            self.last_key = key

    def flush_wal(self) -> None:
        """Write the queued write-ahead lines with one write(2)."""
        if not self._wal_lines or self._wal_fd < 0:
            return
        data = memoryview(b"".join(self._wal_lines))
        self._wal_lines.clear()
        while data:
            written = os.write(self._wal_fd, data)
            data = data[written:]

    def sync_fd(self) -> int:
        """A duplicate of the WAL descriptor to fdatasync in a worker thread.

        A duplicate, because sealing may close and rotate the WAL on the trio
        thread while the sync runs; the caller closes it.
        """
        self.flush_wal()
        return os.dup(self._wal_fd)

    def due(self, now: float | None = None) -> bool:
        if self._pending == 0:
            return False
        if self._pending >= self.policy.seal_rows:
            return True
        now = time.monotonic() if now is None else now
        return now - self._oldest_pending >= self.policy.seal_seconds

    # ---- sealing ----------------------------------------------------------
    def take_batch(self) -> Batch | None:
        """Swap out pending rows and the WAL (trio thread; cheap)."""
        if self._pending == 0:
            return None
        self.flush_wal()
        batch = Batch(self._next, self._columns, self._pending, self._wal_path)
        self._next += 1
        self._columns = {f.name: [] for f in self.schema}
        self._pending = 0
        os.close(self._wal_fd)
        self._wal_seq += 1
        self._open_wal()
        self.sealing += 1
        return batch

    def write_batch(self, batch: Batch) -> Portion:
        """Encode and write one portion atomically (worker thread)."""
        self._counter_path().with_suffix(".tmp").write_text(f"{batch.number + 1}\n")
        os.replace(self._counter_path().with_suffix(".tmp"), self._counter_path())
        arrays = [pa.array(batch.columns[f.name], type=f.type) for f in self.schema]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        final = self.directory / portion_name(batch.number)
        tmp = final.with_suffix(".tmp")
        pq.write_table(table, tmp, compression="zstd")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        batch.wal_path.unlink(missing_ok=True)
        st = final.stat()
        return Portion(batch.number, final, st.st_size, batch.rows, st.st_mtime_ns)

    def commit(self, portion: Portion) -> list[Portion]:
        """Publish a written portion; apply retention; return removed portions."""
        self.sealing -= 1
        self.portions[portion.number] = portion
        self.sealed_total += 1
        return self._retain()

    def abort(self, batch: Batch) -> None:
        """A write failed: its rows stay in the old WAL and come back on restart."""
        self.sealing -= 1

    def seal_now(self) -> Portion | None:
        """Synchronous seal (tests, shutdown)."""
        batch = self.take_batch()
        if batch is None:
            return None
        portion = self.write_batch(batch)
        self.commit(portion)
        return portion

    def _retain(self) -> list[Portion]:
        removed: list[Portion] = []
        total = sum(p.size for p in self.portions.values())
        while len(self.portions) > 1 and (
            len(self.portions) > self.policy.retention_count
            or total > self.policy.retention_bytes
        ):
            oldest = self.portions.pop(min(self.portions))
            total -= oldest.size
            oldest.path.unlink(missing_ok=True)
            removed.append(oldest)
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
        self.flush_wal()
        if self._wal_fd >= 0:
            os.close(self._wal_fd)
            self._wal_fd = -1

    def read_all(self) -> pa.Table:
        """Every sealed portion as one table (tests and tools, not the hot path)."""
        tables = [pq.read_table(p.path) for _, p in sorted(self.portions.items())]
        if not tables:
            return self.schema.empty_table()
        return pa.concat_tables(tables)
