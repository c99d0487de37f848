"""`mlfs fleet push`: ship every sealed portion of a mount to a fleet store, once.

The pusher reads sealed portions from the mount (immutable Parquet files, so
any reader may copy them), appends the host columns (`layout.HOST_COLUMNS`)
and writes each as one object of the store (`layout.Source.object_path`).

Exactly once, in three parts:

* a portion's object name depends only on the portion, so shipping it again
  replaces it with the same rows: a pusher killed after an upload and before
  its cursor moved duplicates nothing;
* on a directory store an object is written under a hidden, unpredictable
  temporary name (`.<name>.<random>.tmp`, which DuckDB's `*.parquet` globs and
  pyarrow's dataset discovery both skip), fsynced and renamed
  (mlfs/base/durable.py): a reader never sees half a portion; on an object
  store (S3) a PUT is whole by itself;
* the cursor, the last shipped portion number of each source, is written
  durably (`write_durably`) to `<state dir>/fleet/push-<store key>.json`
  after each upload, so a restart resumes after the last shipped portion.

A store that cannot be written is a condition, not a crash: the pusher logs
the error, keeps the portions in the mount (its backlog), retries with
exponential backoff and drains the backlog when the store returns.  A
portion that retention or `discard_dataset` removed before it was shipped is
a loss: counted (kept in the cursor file, so it survives restarts) and
logged.  Backlog, losses and failures are Prometheus text in
`<state dir>/fleet/push-<store key>.prom` (node_exporter's textfile
collector format), rewritten after every pass.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mlfs.base.durable import UnsafePath, write_durably
from mlfs.base.shipped import cursor_path
from mlfs.base.statedir import FORMAT_FILE

from .host import HostClash, claim, host_columns, shipped_table
from .layout import (
    MODEL_KINDS,
    Source,
    info_path,
    portion_number,
    status_path,
)
from .manifest import add, document, manifest_path
from .store import Store, StoreUnavailable, store_key

log = logging.getLogger("mlfs.fleet")


# ---- the cursor -------------------------------------------------------------
@dataclass
class Cursor:
    """Last shipped portion per source, and portions lost before shipping."""

    path: Path
    url: str
    shipped: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    #: per source, the portion numbers in the store as [lo, hi] ranges (the manifest)
    ranges: dict[str, list[list[int]]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, url: str) -> Cursor:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, url)
        if data.get("store") != url:
            raise ValueError(f"{path} is the cursor of {data.get('store')!r}, not {url!r}")
        return cls(path, url, {str(k): int(v) for k, v in data["shipped"].items()},
                   int(data.get("lost", 0)),
                   {str(k): [[int(lo), int(hi)] for lo, hi in v]
                    for k, v in data.get("ranges", {}).items()})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, json.dumps(
            {"store": self.url, "shipped": self.shipped, "lost": self.lost,
             "ranges": self.ranges}, sort_keys=True).encode() + b"\n")


# ---- the pusher -------------------------------------------------------------
@dataclass
class PassResult:
    shipped: int = 0
    rows: int = 0
    lost: int = 0
    backlog: int = 0
    error: str = ""


class Pusher:
    def __init__(self, mountpoint: Path, url: str, state_dir: Path,
                 subsystems: Sequence[str] = (), metrics_file: Path | None = None) -> None:
        self.mountpoint = Path(mountpoint)
        self.store = Store(url)
        self.state_dir = Path(state_dir)
        self.patterns = list(subsystems)
        key = store_key(url)
        path = cursor_path(self.state_dir, key)
        self.cursor = Cursor.load(path, url)
        if not path.exists():
            # at once, before anything ships: the daemon holds unshipped portions
            # back from retention only for a pusher it can see (mlfs/base/shipped.py)
            self.cursor.save()
        self.metrics_file = metrics_file or path.with_suffix(".prom")
        self.host = host_columns(self.mountpoint)
        self.manifest_due = True  # the first pass writes it (a run killed before it did)
        self.shipped_total = 0
        self.rows_total = 0
        self.failures_total = 0
        self.failing = False
        self.backlog = 0
        self.last_success = 0.0
        self._info_sent: dict[str, bytes] = {}
        self.claimed = False  # this state directory's claim on its host id (claim())

    # -- what the mount holds
    def _subsystems(self) -> list[str]:
        names = sorted(e.name for e in os.scandir(self.mountpoint) if e.is_dir())
        if not self.patterns:
            return names
        return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in self.patterns)]

    def sources(self) -> list[Source]:
        out: list[Source] = []
        for name in self._subsystems():
            out.append(Source(name, "dataset"))
            if (self.mountpoint / name / "records").is_dir():  # a record source
                out.append(Source(name, "records"))
            models = self.mountpoint / name / "models"
            try:
                entries = sorted(e.name for e in os.scandir(models) if e.is_dir())
            except FileNotFoundError:
                entries = []
            out += [Source(name, kind, m) for m in entries for kind in MODEL_KINDS]
        return out

    def pending(self, source: Source) -> list[int]:
        """Sealed portion numbers of `source` not yet shipped, oldest first."""
        try:
            names = os.listdir(self.mountpoint / source.mount_dir())
        except FileNotFoundError:
            return []
        done = self.cursor.shipped.get(source.key(), -1)
        return sorted(n for n in map(portion_number, names) if n is not None and n > done)

    # -- one pass
    def ship_pass(self, stop: threading.Event | None = None) -> PassResult:
        """Ship every pending portion; stops at the first store failure (kept as backlog)."""
        result = PassResult()
        work = [(s, self.pending(s)) for s in self.sources()]
        result.backlog = sum(len(numbers) for _, numbers in work)
        try:
            if not self.claimed:  # HostClash ends the pusher; an unreadable store retries
                claim(self.store, self.state_dir, self.host["host_id"], self.store.url)
                self.claimed = True
            self._ship_info(sorted({s.subsystem for s, _ in work}))
            for source, numbers in work:
                for number in numbers:
                    if stop is not None and stop.is_set():
                        return result
                    self._note_gap(source, number, result)
                    rows = self._ship(source, number, result)
                    result.backlog -= 1
                    if rows is not None:
                        result.shipped += 1
                        result.rows += rows
                        self.manifest_due = True
            self._ship_manifest()
        except StoreUnavailable as exc:
            result.error = str(exc)
        finally:
            self._account(result)
        return result

    def _ship_manifest(self) -> None:
        """`manifests/<host>.json`, after the objects it names (mlfs/fleet/manifest.py)."""
        if not self.manifest_due:
            return
        sources = {s.key(): s for s in self.sources()}
        self.store.put(manifest_path(self.host["host_id"]),
                       document(self.host["host_id"], self.cursor.ranges, sources))
        self.manifest_due = False

    def _ship_info(self, subsystems: list[str]) -> None:
        """Each subsystem's `info` (what a fleet trainer builds its columns from),
        written when this run has not written that text yet."""
        for name in subsystems:
            try:
                text = (self.mountpoint / name / "info").read_bytes()
            except FileNotFoundError:
                continue
            if self._info_sent.get(name) != text:
                self.store.put(info_path(name, self.host["host_id"]), text)
                self._info_sent[name] = text

    def _note_gap(self, source: Source, number: int, result: PassResult) -> None:
        """Portions between the cursor and `number` vanished from the mount unshipped."""
        done = self.cursor.shipped.get(source.key())
        if done is not None and number > done + 1:
            missing = number - done - 1
            result.lost += missing
            self.cursor.lost += missing
            log.error("%s: portions %d..%d were removed from the mount before they were "
                      "shipped (retention or discard_dataset): %d lost", source.key(),
                      done + 1, number - 1, missing)

    @staticmethod
    def _still_listed(path: Path) -> bool:
        try:
            return path.name in os.listdir(path.parent)
        except FileNotFoundError:
            return False

    def _ship(self, source: Source, number: int, result: PassResult) -> int | None:
        """Ship one portion and move the cursor; its row count, None when it vanished."""
        path = self.mountpoint / source.mount_dir() / f"{number:010d}.parquet"
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as exc:
            # retention may remove the portion between the listing and the read, or while
            # pyarrow reads it: then it says "error stat()ing file" (an OSError that is not
            # FileNotFoundError) or finds a short file.  Only a portion the mount still lists
            # is an error (its directory, not a stat: the kernel may answer that from cache)
            if not isinstance(exc, FileNotFoundError) and self._still_listed(path):
                raise
            result.lost += 1
            self.cursor.lost += 1
            log.error("%s: portion %d was removed from the mount before it was shipped",
                      source.key(), number)
            rows = None
        else:
            buffer = io.BytesIO()
            pq.write_table(shipped_table(table, self.host, self._private(source.subsystem)),
                           buffer)
            self.store.put(source.object_path(self.host["host_id"], number), buffer.getvalue())
            rows = table.num_rows
            add(self.cursor.ranges.setdefault(source.key(), []), number)
        self.cursor.shipped[source.key()] = number
        self.cursor.save()
        return rows

    def _private(self, subsystem: str) -> bool:
        """Whether the subsystem's rows identify users (its `info` says `private`)."""
        try:
            return bool(json.loads((self.mountpoint / subsystem / "info").read_text())
                        .get("private"))
        except (OSError, ValueError):
            return True  # unknown: mask rather than ship what may identify a user

    def _account(self, result: PassResult) -> None:
        self.shipped_total += result.shipped
        self.rows_total += result.rows
        self.backlog = result.backlog
        self.failing = bool(result.error)
        if result.error:
            self.failures_total += 1
            log.error("fleet store failing, %d portions waiting: %s", result.backlog, result.error)
        else:
            self.last_success = time.time()
        self.write_metrics()
        self._ship_status(result)

    def _models(self) -> dict[str, dict[str, dict[str, str]]]:
        """Each model's mode, efficiency and policy sha256, as the mount shows them now."""
        out: dict[str, dict[str, dict[str, str]]] = {}
        for name in self._subsystems():
            models = self.mountpoint / name / "models"
            try:
                entries = sorted(e.name for e in os.scandir(models) if e.is_dir())
            except OSError:
                continue
            for model in entries:
                try:
                    shown = {f: (models / model / f).read_text().strip()
                             for f in ("mode", "efficiency")}
                    policy = (models / model / "policy").read_bytes()
                except OSError:
                    continue
                # which policy runs: `mlfs fleet report` matches it to a card's sha256
                shown["policy_sha256"] = hashlib.sha256(policy).hexdigest() if policy else ""
                out.setdefault(name, {})[model] = shown
        return out

    def _ship_status(self, result: PassResult) -> None:
        """The host's status record (`mlfs fleet status`); best effort: a failing store
        is already counted and logged, and the next pass sends a fresh one."""
        record = {
            "host_id": self.host["host_id"], "host_name": self.host["host_name"],
            "kernel_release": self.host["kernel_release"], "time": time.time(),
            "last_success": self.last_success, "backlog": self.backlog,
            "lost": self.cursor.lost, "failing": self.failing, "error": result.error,
            "shipped": self.cursor.shipped, "models": self._models(),
        }
        try:
            self.store.put(status_path(self.host["host_id"]),
                           json.dumps(record, sort_keys=True).encode())
        except StoreUnavailable as exc:  # a planted link is worth a warning: an attack
            refused = isinstance(exc.__cause__, UnsafePath)
            log.log(logging.WARNING if refused else logging.DEBUG,
                    "status record not written: %s", exc)

    def metrics_text(self) -> str:
        host = self.host["host_id"]
        label = f'{{host="{host}"}}'
        families = [
            ("mlfs_fleet_push_portions_total", "counter",
             "portions shipped to the fleet store by this pusher run", self.shipped_total),
            ("mlfs_fleet_push_rows_total", "counter",
             "rows shipped to the fleet store by this pusher run", self.rows_total),
            ("mlfs_fleet_push_backlog_portions", "gauge",
             "sealed portions in the mount not yet shipped", self.backlog),
            ("mlfs_fleet_push_lost_portions_total", "counter",
             "portions removed from the mount before they were shipped (all runs)",
             self.cursor.lost),
            ("mlfs_fleet_push_failures_total", "counter",
             "passes that stopped at a store error (this run)", self.failures_total),
            ("mlfs_fleet_push_store_failing", "gauge",
             "1 while the last pass stopped at a store error", int(self.failing)),
            ("mlfs_fleet_push_last_success_timestamp_seconds", "gauge",
             "when a pass last shipped everything it found", self.last_success),
        ]
        lines = []
        for name, kind, help_text, value in families:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                      f"{name}{label} {value:g}"]
        return "\n".join(lines) + "\n"

    def write_metrics(self) -> None:
        self.metrics_file.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.metrics_file, self.metrics_text().encode())

    # -- the service
    def run(self, stop: threading.Event, interval: float, max_backoff: float) -> None:
        """Pass after pass until `stop`; after a failure wait 2x longer, up to max_backoff."""
        delay = interval
        while not stop.is_set():
            result = self.ship_pass(stop)
            if result.shipped:
                log.info("shipped %d portions (%d rows); %d waiting", result.shipped,
                         result.rows, result.backlog)
            delay = min(max(delay * 2, interval), max_backoff) if result.error else interval
            stop.wait(delay)


def main(mountpoint: Path, url: str, state_dir: Path, subsystems: Sequence[str], once: bool,
         interval: float, max_backoff: float, metrics_file: Path | None) -> int:
    if not (state_dir / FORMAT_FILE).exists():
        print(f"mlfs fleet push: {state_dir} is not the state directory of a mount "
              "(no `format` file); give the mount's --state-dir", file=sys.stderr)
        return 2
    try:
        pusher = Pusher(mountpoint, url, state_dir, subsystems, metrics_file)
    except (OSError, ValueError) as exc:
        print(f"mlfs fleet push: {exc}", file=sys.stderr)
        return 2
    if once:
        try:
            result = pusher.ship_pass()
        except HostClash as exc:
            print(f"mlfs fleet push: {exc}", file=sys.stderr)
            return 2
        print(f"mlfs fleet push: {result.shipped} portions ({result.rows} rows) shipped, "
              f"{result.backlog} waiting, {result.lost} lost")
        if result.error:
            print(f"mlfs fleet push: {result.error}", file=sys.stderr)
            return 1
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("pushing %s to %s as host %s", mountpoint, url, pusher.host["host_id"])
    try:
        pusher.run(stop, interval, max_backoff)
    except HostClash as exc:  # another state directory pushes as this host: never ours
        print(f"mlfs fleet push: {exc}", file=sys.stderr)
        return 2
    log.info("stopped; %d portions waiting", pusher.backlog)
    return 0
