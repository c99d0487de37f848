"""Concurrency: dataset readers, event readers and a recommendation writer at once,
in separate processes; no error, no lost event, no wedge."""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client import EventStream
from .harness import BenchMount, echo, progress, recommendation
from .plan import MB, MODEL, SENTINEL_MODEL, STEER, SUBSYSTEMS, MiB, Plan
from .stats import Row, percentile, summarize


class Load:
    """Counters and signals shared with the worker processes of the concurrency run.

    Workers are separate processes (dataset readers as threads inside four of
    them), so the load on the daemon is not throttled by one GIL in the bench:
    with 41 threads in one process the writer managed ~50 writes/s while the
    daemon sat at a third of a core.  Each counter slot has one writer.
    """

    def __init__(self, ctx: Any, readers: int, event_readers: int) -> None:
        self.go = ctx.Event()
        self.stop = ctx.Event()
        self.bytes_read = ctx.Array("q", readers, lock=False)
        self.files_read = ctx.Array("q", readers, lock=False)
        self.events_seen = ctx.Array("q", event_readers, lock=False)
        self.writes_ok = ctx.Value("q", 0, lock=False)
        self.errors = ctx.Queue()
        self.results = ctx.Queue()


def _dataset_reader(load: Load, index: int, mountpoint: Path, cold: bool) -> None:
    """List every subsystem's dataset and read each portion whole, again and again."""
    buf = bytearray(MiB)
    try:
        while not load.stop.is_set():
            paths = sorted(p for s in SUBSYSTEMS for p in (mountpoint / s / "dataset").iterdir())
            for path in paths:
                if load.stop.is_set():
                    return
                with open(path, "rb", buffering=0) as fh:
                    if cold:  # push reads down to the daemon, not just the page cache
                        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                    while n := fh.readinto(buf):
                        load.bytes_read[index] += n
                load.files_read[index] += 1
    except OSError as exc:
        load.errors.put(f"dataset reader {index}: {exc!r}")


def _reader_process(load: Load, mountpoint: str, first: int, count: int, cold: int) -> None:
    """One process of `count` dataset reader threads, the first `cold` dropping the cache."""
    threads = [threading.Thread(target=_dataset_reader,
                                args=(load, first + j, Path(mountpoint), j < cold))
               for j in range(count)]
    load.results.put(("ready", first, None))
    load.go.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _event_reader(load: Load, index: int, path: str, use_poll: bool, global_stream: bool) -> None:
    """Read an events file until the sentinel; every line checked, gaps and overflows counted.

    On the global stream `seq` must be gapless; a subsystem's stream may skip
    other subsystems' events, so there only order and the counts are checked.
    """
    seqs: list[int] = []
    accepted = overflow = 0
    done = False
    try:
        stream = EventStream(path, blocking=not use_poll)
        try:
            load.results.put(("ready", index, None))
            while not done and not stream.ended:
                events = stream.read(1.0)  # blocking: one read(2); else poll() up to 1 s
                if stream.bad_lines:
                    raise ValueError(f"{stream.bad_lines} lines that are not JSON events")
                for event in events:
                    seqs.append(int(event["seq"]))
                    load.events_seen[index] += 1
                    kind = event.get("event")
                    if kind == "overflow":
                        overflow += int(event.get("lost", 0))
                    elif kind == "recommendation" and event.get("status") == "accepted" \
                            and event.get("model") == MODEL:
                        accepted += 1
                    elif kind == "state" and event.get("model") == SENTINEL_MODEL:
                        done = True
        finally:
            stream.close()
    except (OSError, ValueError) as exc:
        load.errors.put(f"event reader {index}: {exc!r}")
    gaps = sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b != a + 1)
    load.results.put(("result", index, {
        "path": path, "poll": use_poll, "global_stream": global_stream, "lines": len(seqs),
        "accepted": accepted, "overflow": overflow, "gaps": gaps, "sentinel": done,
        "ordered": all(b > a for a, b in zip(seqs, seqs[1:], strict=False)),
    }))


def _writer_process(load: Load, recommend: str) -> None:
    """Recommendations as fast as they are accepted, until told to stop."""
    rng = random.Random(3)
    load.results.put(("ready", -1, None))
    load.go.wait()
    while not load.stop.is_set():
        try:
            echo(recommend, recommendation(rng))
            load.writes_ok.value += 1
        except OSError as exc:
            load.errors.put(f"writer: {exc!r}")
            return


class Prober(threading.Thread):
    """Reads `version` four times a second: a wedged mount shows as a stale probe."""

    def __init__(self, mountpoint: Path) -> None:
        super().__init__(daemon=True)
        self.path = mountpoint / "version"
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.last_ok = time.monotonic()
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.path.read_bytes()
            except OSError as exc:
                self.error = repr(exc)
                return
            self.latencies.append(time.perf_counter() - started)
            self.last_ok = time.monotonic()
            self.stop.wait(0.25)


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> bool:
    """Run `fn` in a thread; False when it did not finish (a wedged mount)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


def _drain(q: Any) -> list[Any]:
    out = []
    with contextlib.suppress(Exception):
        while True:
            out.append(q.get_nowait())
    return out


def _collect(load: Load, results: dict[int, dict[str, Any]], until: Callable[[int], bool],
             seconds: float) -> int:
    """Take the workers' messages until `until(ready count)` or `seconds` pass; results
    go into `results`, the count of "ready" messages is returned."""
    ready = 0
    deadline = time.monotonic() + seconds
    while not until(ready) and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            kind, index, value = load.results.get(timeout=1)
            if kind == "ready":
                ready += 1
            else:
                results[index] = value
    return ready


class Samples:
    """Per-second rates of the load and the daemon's memory while it runs."""

    def __init__(self) -> None:
        self.mb_per_s: list[float] = []
        self.writes_per_s: list[float] = []
        self.events_per_s: list[float] = []
        self.rss: list[float] = []
        self.anon: list[float] = []
        self.last = (0, 0, 0)

    def take(self, load: Load, mount: BenchMount) -> None:
        now = (sum(load.bytes_read), load.writes_ok.value, sum(load.events_seen))
        self.mb_per_s.append((now[0] - self.last[0]) / MB)
        self.writes_per_s.append(float(now[1] - self.last[1]))
        self.events_per_s.append(float(now[2] - self.last[2]))
        self.last = now
        with contextlib.suppress(OSError, KeyError):
            memory = mount.memory_kb()
            self.rss.append(memory["VmRSS"] / 1024)
            self.anon.append(memory["RssAnon"] / 1024)


def _lost(readers: list[dict[str, Any]], writes_ok: int) -> int:
    """Events some reader missed: overflows, gaps on the global stream, accepted writes
    not seen, a missing sentinel or lines out of order."""
    lost = sum(r.get("overflow", 0) for r in readers)
    lost += sum(r.get("gaps", 0) for r in readers if r.get("global_stream"))
    lost += sum(abs(r.get("accepted", 0) - writes_ok) for r in readers)
    lost += sum(1 for r in readers if not r.get("sentinel") or not r.get("ordered"))
    return lost


def _start_processes(ctx: Any, load: Load, root: Path, model: Path, n_procs: int,
                     per_proc: int, n_events: int) -> tuple[list, list]:
    """(event reader processes, dataset reader and writer processes), all started."""
    event_procs = []
    for i in range(n_events):
        on_global = i % 2 == 0
        path = root / "events" if on_global else root / STEER / "events"
        p = ctx.Process(target=_event_reader, daemon=True,
                        args=(load, i, str(path), i % 4 >= 2, on_global))
        p.start()
        event_procs.append(p)
    workers = [ctx.Process(target=_reader_process, daemon=True,
                           args=(load, str(root), k * per_proc, per_proc, 2))
               for k in range(n_procs)]
    workers.append(ctx.Process(target=_writer_process, daemon=True,
                               args=(load, str(model / "recommend"))))
    for p in workers:
        p.start()
    return event_procs, workers


def bench_concurrency(mount: BenchMount, model: Path, plan: Plan) -> Row:
    """32 dataset readers + 8 event readers + 1 recommendation writer, all at once."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process with library threads
    root = mount.mountpoint
    n_procs, per_proc, n_events = 4, 8, 8
    load = Load(ctx, n_procs * per_proc, n_events)
    event_procs, workers = _start_processes(ctx, load, root, model, n_procs, per_proc,
                                            n_events)
    # everyone imported, subscribed and waiting: then all start at once
    results: dict[int, dict[str, Any]] = {}
    expected = n_events + len(workers)
    ready = _collect(load, results, lambda ready: ready >= expected, 60)
    if ready < expected:
        load.stop.set()
        load.go.set()
        raise RuntimeError(f"only {ready} of {expected} concurrency workers started")
    load.go.set()
    prober = Prober(root)
    prober.start()
    cpu0 = mount.cpu_seconds()
    started = time.monotonic()
    samples = Samples()
    wedged = False
    while time.monotonic() - started < plan.concurrency_seconds:
        time.sleep(1.0)
        samples.take(load, mount)
        if time.monotonic() - prober.last_ok > 10:
            wedged = True
            break
    elapsed = time.monotonic() - started
    cpu = 100 * (mount.cpu_seconds() - cpu0) / elapsed
    load.stop.set()
    prober.stop.set()
    for p in workers:
        p.join(30)
    wedged = wedged or any(p.is_alive() for p in workers)
    # the sentinel: every event reader must see it, after every accepted write
    sentinel = root / STEER / "models" / SENTINEL_MODEL
    if not wedged and not _run_with_timeout(lambda: os.mkdir(sentinel), 20):
        wedged = True
    _collect(load, results, lambda _: len(results) >= n_events, 20)
    for p in event_procs:
        p.join(5)
    wedged = wedged or len(results) < n_events
    if wedged:  # release processes stuck in the mount: abort it (they get ENOTCONN)
        mount.stop(signal.SIGKILL)
    else:
        _run_with_timeout(lambda: os.rmdir(sentinel), 20)
    for p in workers + event_procs:
        if p.is_alive():
            p.kill()
        p.join(10)
    errors = [str(e) for e in _drain(load.errors)]
    if prober.error:
        errors.append(f"probe: {prober.error}")
    writes_ok = load.writes_ok.value
    readers = [results.get(i, {}) for i in range(n_events)]
    lost = _lost(readers, writes_ok)
    ok = not wedged and not errors and lost == 0
    mb_per_s, writes_per_s, events_per_s = (samples.mb_per_s, samples.writes_per_s,
                                            samples.events_per_s)
    rss, anon = samples.rss, samples.anon
    probe = prober.latencies or [math.nan]
    files = sum(load.files_read)
    progress(f"concurrency: {statistics.median(mb_per_s):.0f} MB/s read, "
             f"{statistics.median(writes_per_s):.0f} writes/s, errors {len(errors)}, "
             f"lost {lost}, wedged {wedged}")
    return Row(
        "concurrency", "concurrency: 32 dataset readers + 8 event readers + 1 writer",
        {"dataset MB/s": summarize(mb_per_s), "recommendations/s": summarize(writes_per_s),
         "event lines/s": summarize(events_per_s)},
        None, None, "no error, no lost event, no wedge", ok,
        f"{elapsed:.0f} s, per-second samples; {files} portions read (8 readers drop the "
        f"page cache first), {writes_ok} recommendations, each seen by all {n_events} "
        f"event readers (4 global, 4 per-subsystem; 4 poll, 4 blocking): {lost == 0}; "
        f"errors {len(errors)}; wedged {wedged}; `version` probe p99 "
        f"{percentile(probe, 99) * 1e3:.1f} ms; daemon CPU {cpu:.0f}% of one core, RSS max "
        f"{max(rss, default=math.nan):.0f} MB (anonymous {max(anon, default=math.nan):.0f} MB; "
        "the rest is the mapped portion, page cache shared with the state file)",
        extra={"errors": errors[:50], "wedged": wedged, "lost": lost, "event_readers": readers,
               "writes_ok": writes_ok, "portions_read": files,
               "probe_p99_ms": percentile(probe, 99) * 1e3, "daemon_cpu_pct": cpu,
               "daemon_rss_max_mb": max(rss, default=math.nan),
               "daemon_rss_anon_max_mb": max(anon, default=math.nan)},
    )
