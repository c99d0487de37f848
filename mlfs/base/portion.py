"""The shapes of a portion store: its files, its batches, its policy and its watch.

A store's directory holds sealed portions named by a number that is never
reused (`0000000007.parquet`), write-ahead files (`wal.N.jsonl`, a record
store's `wal.N.arrows`) and the `next_portion` counter.  These names, the
`Portion` a reader sees, the `Batch` a seal writes, the `StorePolicy` the
configuration sets and the `StoreWatch` the seal loop visits are shared by the
tick store (`store.py`) and the record store (`records.py`), and the fleet
reads the same names (`mlfs/fleet/layout.py`).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mlfs.base.durable import fsync_dir, set_aside
from mlfs.base.statedir import FORMAT_FILE

PORTION_SUFFIX = ".parquet"
WAL_PREFIX = "wal."
#: the next portion number, persisted: a number is never reused, even after `discard`
COUNTER_FILE = "next_portion"
#: every portion's Parquet compression (the record ingest bench's reference uses it too)
PORTION_COMPRESSION = "zstd"


def portion_name(number: int) -> str:
    return f"{number:010d}{PORTION_SUFFIX}"


def portion_number(name: str) -> int | None:
    """The number of `0000000007.parquet` and of its set-aside `.damaged` names."""
    stem = name.split(".", 1)[0]
    return int(stem) if stem.isdigit() and len(stem) == 10 else None


def errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, type(exc).__name__) if code else type(exc).__name__



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
    """Rows taken out of the buffer, waiting to be written as one portion.

    `wal_paths` hold its rows on disk until the portion is durable (more than
    one after a restart: replayed rows stay in the files they came from).
    """

    number: int
    columns: dict[str, list]
    rows: int
    wal_paths: list[Path]

    @property
    def wal_path(self) -> Path:
        return self.wal_paths[-1]


@dataclass(frozen=True)
class StoreOwner:
    """Whose store it is, as the event announcing each new portion says it.

    `event` is the event's kind ("portion" for a subsystem's dataset and records,
    "feedback" for a model's feedback); `where` the store's path in the mount.
    """

    subsystem: str
    event: str
    where: str
    model: str | None = None


@dataclass(frozen=True)
class StorePolicy:
    seal_rows: int = 4096
    seal_seconds: float = 10.0
    retention_bytes: int = 1 << 30
    retention_count: int = 1000
    #: fsync the WAL on every append (the recommendation journal)
    durable: bool = False
    #: rows kept in memory (pending, failed batches) before the store is full
    max_waiting_rows: int = 65536
    #: bytes of portions a fleet pusher has not shipped yet that retention keeps
    #: beyond `retention_bytes` (mlfs/base/shipped.py); 0: retention never waits
    fleet_backlog_bytes: int = 1 << 28


@dataclass
class StoreWatch:
    """The stores of one owner (a subsystem and its models) that need attention.

    `dirty`: stores with queued lines, pending rows or failed batches (the
    seal loop visits only these, so idle models cost nothing per pass).
    `failing`: stores whose last flush or seal failed, with the reason; while
    one fails the subsystem is in a critical state.
    """

    dirty: set = field(default_factory=set)
    failing: dict = field(default_factory=dict)
    failures_total: int = 0
    quarantined_rows_total: int = 0

    def reason(self) -> str | None:
        for store, reason in self.failing.items():
            return f"storage: {reason} writing {store.kind}"
        return None

    def full(self) -> bool:
        return any(store.full for store in self.dirty)

    def error(self) -> tuple[int, str] | None:
        """(errno, "ENOSPC writing dataset") of the first failing store."""
        for store, reason in self.failing.items():
            return (store.error or (errno.EIO, ""))[0], f"{reason} writing {store.kind}"
        return None


class StoreError(OSError):
    """A write that cannot be made durable now (carries the underlying errno)."""


def write_portion_file(table: pa.Table, final: Path, **options) -> os.stat_result:
    """Write `table` as the Parquet file `final` so that it is complete before its name
    exists (a tmp file, fsync, rename, fsync the directory); its stat."""
    tmp = final.with_suffix(".tmp")
    pq.write_table(table, tmp, compression=PORTION_COMPRESSION, **options)
    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return final.stat()


def state_root(directory: Path) -> Path | None:
    """The state directory holding `directory` (the nearest parent with the
    `format` file), None for a store outside one (tests, tools)."""
    for parent in list(Path(directory).resolve().parents)[:4]:  # <state>/S/models/M/<kind>
        if (parent / FORMAT_FILE).exists():
            return parent
    return None


def scan_portions(directory: Path) -> tuple[dict[int, Portion], int]:
    """The sealed portions of a store's directory, and the highest number ever shown.

    Left-over tmp files go; a portion that cannot be read is set aside, never
    served, and its number still counts (a name once shown is never reused).
    """
    for tmp in directory.glob("*.tmp"):
        tmp.unlink(missing_ok=True)
    portions: dict[int, Portion] = {}
    highest = 0
    for path in sorted(directory.iterdir()):
        number = portion_number(path.name)
        if number is None:
            continue
        highest = max(highest, number)
        if path.name != portion_name(number):
            continue  # a portion set aside earlier
        try:
            st = path.stat()
            rows = pq.ParquetFile(path).metadata.num_rows
        except Exception as exc:  # a damaged file is kept aside, never served
            set_aside(path, f"unreadable portion: {exc}")
            continue
        portions[number] = Portion(number, path, st.st_size, rows, st.st_mtime_ns)
    return portions, highest


def read_counter(directory: Path, highest: int) -> int:
    """The persisted next portion number (0: none); a damaged counter is set aside."""
    path = directory / COUNTER_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    except (OSError, UnicodeDecodeError) as exc:
        text = f"<unreadable: {exc}>"
    if text.isdigit() and int(text) < 1 << 62:
        return int(text)
    set_aside(path, f"next_portion {text[:40]!r} is not a number; recomputed as "
                    f"{highest + 1} from the portions")
    return 0


def retention_due(portions: dict[int, Portion], policy: StorePolicy) -> list[int]:
    """The oldest portions beyond `retention_count` / `retention_bytes` (the newest stays)."""
    order = sorted(portions)
    count, total = len(order), sum(p.size for p in portions.values())
    due = 0
    while count - due > 1 and (count - due > policy.retention_count
                               or total > policy.retention_bytes):
        total -= portions[order[due]].size
        due += 1
    return order[:due]


def held_back(portions: dict[int, Portion], due: list[int], shipped: int | None,
              backlog_bytes: int) -> tuple[list[int], list[int]]:
    """Of the portions due, those a fleet pusher has not shipped and retention keeps
    (while their bytes stay within `backlog_bytes`), and those it removes anyway."""
    held = [n for n in due if shipped is not None and n > shipped]
    held_bytes = sum(portions[n].size for n in held)
    lost: list[int] = []
    while held and held_bytes > backlog_bytes:
        number = held.pop(0)
        held_bytes -= portions[number].size
        lost.append(number)
    return held, lost
