"""The write-ahead engine of every portion store, whatever its rows look like.

A store's rows are held in memory until a Parquet portion holds them; until then they
are also in write-ahead files `wal.N<suffix>` beside the portions, so a crash loses
none.  `WriteAhead` is the one engine of the three kinds of store (a subsystem's tick
dataset, a model's feedback and journal, a record dataset): it numbers the files,
creates, appends, syncs, cuts a torn tail, rotates at a seal, and on start-up replays
and quarantines.  What a file holds is its codec's business, one of two:

- `LineCodec` (wal_lines.py): one JSON line per row (`.jsonl`), for tick rows.  A line
  is its own frame, so a damaged line costs itself only.
- `ArrowCodec` (arrow_codec.py over arrow_wal.py): one checksummed frame per Arrow batch
  behind a header with an ack mark (`.arrows`), for record batches.

The rules both share, and which live here only:
- Queued items reach the file in one flush (every ~50 ms from the seal loop); a flush
  that fails keeps what was not written queued, and a file whose failed write could not
  be cut back (`TornWal`) takes nothing more: the next flush begins a new file.
- A file's rows are handed to the seal with it (`rotate`); it is deleted only after the
  portion holding them is durable (`release`).
- Replay reads every file, oldest first, and holds its intact rows pending before it
  sets anything aside: keys rise across files, so a file left on disk but not replayed
  would later have its rows cut off below the newest sealed key.  What a codec refuses
  goes to quarantine/ (quarantine.py): refused lines as lines, a damaged frame file as
  a byte copy.  A file whose refusal cannot be kept stays where it is, outside any
  batch, and the next start tries again.  Only a tail the writer was never told was
  written (a torn last line of the newest file, a torn frame beyond the ack mark) is
  skipped, with an INFO line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mlfs.base.durable import fdatasync_file, fsync_dir
from mlfs.base.portion import WAL_PREFIX

from .quarantine import keep_copy, quarantine, wal_files

log = logging.getLogger("mlfs.store")


class TornWal(OSError):
    """A write failed part-way and the torn tail could not be cut off: the file holds
    its whole items, then the tear; append nothing more to it."""


@dataclass
class Replayed:
    """One write-ahead file as its codec read it back, with the floor applied.

    `units`: what to hold pending, in order (rows as dicts, or Arrow tables), `rows` of
    them in all; `top`: the newest key the file holds or should hold (None: nothing
    known).  `refused`: lines kept aside one by one, with why; `damage`: why the whole
    file is kept aside as a copy, and `lost`: the rows its damage cost (`at_least`: the
    file had no readable count, so that is a floor).  `torn`: bytes of a tail the writer
    was never told was written, skipped.
    """

    units: list[Any] = field(default_factory=list)
    rows: int = 0
    top: int | None = None
    torn: int = 0
    refused: list[tuple[bytes, str]] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)
    lost: int = 0
    at_least: bool = False


class Codec(Protocol):
    """What a write-ahead file holds and how; one instance per store (it holds the
    queue of items not yet written)."""

    suffix: str
    what: str  # "line" or "frame", for log lines

    def queue(self, item: Any) -> None: ...
    def waiting(self) -> int: ...  # bytes queued
    def begin(self, path: Path) -> None: ...  # before the first write to a new file
    def write(self, fd: int) -> None: ...  # the queue out; written items leave it
    def take_back(self, before: int, size: int) -> int: ...
    def replay(self, data: bytes, newest: bool, floor: int | None) -> Replayed: ...


@dataclass
class ReplayTotals:
    """What a store's replay found, for its counters."""

    rows: int = 0
    quarantined_lines: int = 0
    lost: int = 0
    top: int | None = None


class WriteAhead:
    """A store's write-ahead files: `wal.<seq><codec.suffix>` in `directory`.

    `paths`: the files holding the rows pending now (handed to the seal by `rotate`).
    No descriptor is held between writes (each flush opens the file): an idle store
    costs none (10,000 models at 2 fds each exhausted RLIMIT_NOFILE).
    """

    def __init__(self, directory: Path, codec: Codec, durable: bool = False) -> None:
        self.directory = Path(directory)
        self.codec = codec
        self.durable = durable
        self.seq = 0
        self.created = False
        self.paths: list[Path] = []

    @property
    def path(self) -> Path:
        """The file the next flush writes to."""
        return self.directory / f"{WAL_PREFIX}{self.seq}{self.codec.suffix}"

    def seq_of(self, path: Path) -> int | None:
        """A write-ahead file's number, None for a name that is not one."""
        name, suffix = path.name, self.codec.suffix
        if not (name.startswith(WAL_PREFIX) and name.endswith(suffix)):
            return None
        middle = name[len(WAL_PREFIX):-len(suffix)]
        return int(middle) if middle.isdigit() and middle.isascii() else None

    # ---- writing ----------------------------------------------------------------------
    def flush(self) -> None:
        """Write what is queued (OSError: what was not written stays queued).

        The file is opened O_APPEND per flush; a new one is first begun by the codec
        (an Arrow file gets its header under a temporary name, then a rename) and, for
        a durable store, its directory entry is synced.
        """
        if not self.codec.waiting():
            return
        path = self.path
        if not self.created:
            self.codec.begin(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            if not self.created:
                self.paths.append(path)
                self.created = True
                if self.durable:
                    fsync_dir(self.directory)
            try:
                self.codec.write(fd)
            except TornWal:
                # the torn file keeps its whole items (and stays in `paths` until the
                # seal); the next flush begins a new file
                self._next_file()
                raise
        finally:
            os.close(fd)

    def write_now(self, item: Any) -> Path:
        """Write one item before returning (a writer waits for it); the file it is in.

        On OSError nothing changed: the item is taken back from the queue, and the part
        of it that reached the file is cut off (when even that fails, the file takes
        nothing more, as after `TornWal`).
        """
        before = self.codec.waiting()
        self.codec.queue(item)
        size = self.codec.waiting() - before
        path = self.path
        try:
            self.flush()
        except OSError:
            written = self.codec.take_back(before, size)
            if written and path == self.path:
                self.cut(path, written)
            raise
        return path

    def cut(self, path: Path, tail: int) -> None:
        """Cut the last `tail` bytes (a write that failed half-way) off `path`; when that
        fails too, begin a new file for the next write (logged)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, os.fstat(fd).st_size - tail)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("%s: a half-written %s could not be cut off (%s); the next write "
                      "begins a new file", path, self.codec.what, exc)
            self._next_file()

    def _next_file(self) -> None:
        self.seq += 1
        self.created = False

    @staticmethod
    def sync(path: Path) -> None:
        """fdatasync one file (worker thread).  One already removed is fine: it goes only
        after the portion holding its rows is durable."""
        fdatasync_file(path)

    def rotate(self) -> list[Path]:
        """The files of the rows pending now, handed to a seal; the next row begins a
        new file."""
        paths, self.paths = self.paths, []
        self._next_file()
        return paths

    @staticmethod
    def release(paths: list[Path]) -> None:
        """A sealed batch's files go, once its portion (or quarantine file) is durable."""
        for path in paths:
            path.unlink(missing_ok=True)

    # ---- replay -------------------------------------------------------------------------
    def replay(self, floor: Callable[[], int | None],
               hold: Callable[[Replayed], None]) -> ReplayTotals:
        """Hold every file's intact rows pending, oldest file first; set aside the rest.

        `floor()`: the newest key already kept (sealed, or held from an earlier file);
        the codec drops rows at or below it.  `hold(scan)`: buffer a file's units.  The
        files stay (they hold those rows until the next portion is durable: rewriting
        them would need space a full disk may not have), unless no row came back: then
        every row is in a portion or in quarantine already, and they go.
        """
        for tmp in self.directory.glob(f".{WAL_PREFIX}*{self.codec.suffix}.tmp"):
            tmp.unlink(missing_ok=True)  # a creation cut short: it acknowledged nothing
        wals = wal_files(self.directory, f"{WAL_PREFIX}*{self.codec.suffix}", self.seq_of)
        totals = ReplayTotals()
        for index, wal in enumerate(wals):
            try:
                data = wal.read_bytes()
            except OSError as exc:
                log.warning("%s: write-ahead file not readable (%s); left in place", wal, exc)
                continue  # outside any batch: the next start tries again
            scan = self.codec.replay(data, index == len(wals) - 1, floor())
            hold(scan)
            totals.rows += scan.rows
            if scan.top is not None:
                totals.top = scan.top if totals.top is None else max(totals.top, scan.top)
            if scan.torn:
                log.info("%s: a torn last %s (%d bytes, never acknowledged) skipped", wal,
                         self.codec.what, scan.torn)
            if not self._set_aside(wal, data, scan, totals):
                continue  # its rows are pending; the file stays for the next start
            self.paths.append(wal)
        if wals:
            self.seq = self.seq_of(wals[-1]) + 1
        if totals.rows:
            log.info("%s: %d rows recovered from the write-ahead files", self.directory,
                     totals.rows)
        else:
            self.release(self.paths)
            self.paths = []
        return totals

    def _set_aside(self, wal: Path, data: bytes, scan: Replayed,
                   totals: ReplayTotals) -> bool:
        """Keep what `wal`'s codec refused in quarantine/, counted and logged; False when
        that failed (the file then stays where it is, outside any batch).

        The records a damaged file lost are counted now either way: they are gone
        whether or not the copy is made, and once the rows around them are sealed a
        later start cannot count them again (its floor is past them)."""
        totals.lost += scan.lost
        try:
            if scan.refused:
                for raw, why in scan.refused:
                    log.error("%s: write-ahead line refused (%s): %.200r", wal, why, raw)
                kept = quarantine(self.directory, wal.name, [raw for raw, _ in scan.refused])
            if scan.damage:
                kept = keep_copy(self.directory, wal.name, data)
        except OSError as exc:
            log.error("%s: write-ahead file damaged (%s; %d records lost) and not kept in "
                      "quarantine (%s); left in place", wal, _problems(scan), scan.lost, exc)
            return False
        if scan.refused:
            totals.quarantined_lines += len(scan.refused)
            log.error("%s: %d write-ahead line(s) quarantined in %s", self.directory,
                      len(scan.refused), kept)
        if scan.damage:
            log.warning("%s: write-ahead file damaged (%s); its intact batches are kept, "
                        "%s%d records lost; a copy is kept in %s", wal, _problems(scan),
                        "at least " if scan.at_least else "", scan.lost, kept)
        return True


def _problems(scan: Replayed) -> str:
    problems = scan.damage or [why for _, why in scan.refused]
    more = f"; {len(problems) - 3} more" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more
