"""Control-write round trips and event wake-up latency, each against a same-run reference."""

from __future__ import annotations

import datetime as _dt
import json
import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path

from .harness import Session, echo, progress, recommendation, tmpfs_dir
from .plan import MODEL, STEER, Plan
from .stats import Row, latency_summary, percentile, summarize


def bench_control(session: Session, model: Path, plan: Plan, key: str = "control_write",
                  what: str = "control write round trip (open/write/close of recommend)",
                  judged: bool = True) -> Row:
    """echo-like writes to `recommend` vs the same on a tmpfs file, round by round."""
    rng = random.Random(1)
    recommend = str(model / "recommend")
    shm = tmpfs_dir()
    reference_path = str(session.scratch(shm) / "recommend")
    for _ in range(20):  # warm-up: dentries, the journal file, both paths
        echo(recommend, recommendation(rng))
        echo(reference_path, recommendation(rng))
    mount_rounds: list[list[float]] = []
    ref_rounds: list[list[float]] = []
    sync_rounds: list[list[float]] = []
    # what one durable append costs on the state directory's filesystem right now: the
    # journal does this (fdatasync) before an accepted recommendation's write returns
    journal = os.open(session.scratch(None) / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for index in range(plan.control_rounds):
            for target, out in ((reference_path, ref_rounds), (recommend, mount_rounds)):
                samples = []
                for _ in range(plan.control_writes):
                    data = recommendation(rng)
                    started = time.perf_counter()
                    echo(target, data)
                    samples.append(time.perf_counter() - started)
                out.append(samples)
            if judged:
                samples = []
                for _ in range(max(50, plan.control_writes // 5)):
                    started = time.perf_counter()
                    os.write(journal, b'{"seq":1,"line":"read_ahead_kb=256"}\n')
                    os.fdatasync(journal)
                    samples.append(time.perf_counter() - started)
                sync_rounds.append(samples)
            progress(f"{key}: round {index + 1}/{plan.control_rounds}: "
                     f"p50 {percentile(mount_rounds[-1], 50) * 1e6:.0f} us, "
                     f"p99 {percentile(mount_rounds[-1], 99) * 1e6:.0f} us "
                     f"(tmpfs p50 {percentile(ref_rounds[-1], 50) * 1e6:.0f} us)")
    finally:
        os.close(journal)
    measured = latency_summary(mount_rounds)
    reference = latency_summary(ref_rounds)
    if sync_rounds:
        fsync = latency_summary(sync_rounds)
        reference["state-dir fdatasync p50 ms"] = fsync["p50 ms"]
        reference["state-dir fdatasync p99 ms"] = fsync["p99 ms"]
    ratios = [percentile(r, 50) / percentile(m, 50) for r, m in zip(ref_rounds, mount_rounds,
                                                                     strict=True)]
    pooled = [s for r in mount_rounds for s in r]
    return Row(key, what, measured, reference, summarize(ratios),
               "report; p99 ≤ 1 ms" if judged else "report (diagnostic)",
               measured["p99 ms"]["median"] <= 1.0 if judged else None,
               f"{plan.control_rounds} rounds x {plan.control_writes} writes; reference: "
               f"{'a tmpfs file' if shm else 'a file in the bench directory (no tmpfs)'}; "
               "ratio = tmpfs p50 / mount p50; " + (
                   "an accepted write fdatasyncs the journal on disk before it returns (twice "
                   "when it supersedes the previous recommendation)" if judged
                   else "the journal's fsync goes to tmpfs and costs ~nothing"),
               extra={"pooled_p50_ms": percentile(pooled, 50) * 1e3,
                      "pooled_p99_ms": percentile(pooled, 99) * 1e3,
                      "pooled_max_ms": max(pooled) * 1e3})


_POLLER = r"""
import os, select, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
poller = select.poll()
poller.register(fd, select.POLLIN)
sys.stdout.write("ready\n")
sys.stdout.flush()
rest = b""
while True:
    poller.poll()
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        continue
    now, wall = time.monotonic_ns(), time.time_ns()
    if not data:
        break
    rest += data
    *lines, rest = rest.split(b"\n")
    sys.stdout.write("".join(f"{now} {wall} {line.decode()}\n" for line in lines))
    sys.stdout.flush()
"""


class LineReader:
    """Lines from a child's stdout with a timeout (select on the pipe)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def _rfc3339_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch_us(rfc3339: str) -> int:
    stamp = _dt.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC)
    return (stamp - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)) // _dt.timedelta(microseconds=1)


class Poller:
    """A separate process poll()ing one file and stamping each line it reads."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _POLLER, str(path)],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.reader = LineReader(self.proc)
        if self.reader.line(30) != "ready":
            self.close()
            raise RuntimeError(f"the poller of {path} did not start")

    def wait_accepted(self, sent_ns: int) -> tuple[float, float] | None:
        """(write start -> line, event ts -> line) in seconds for the next accepted line."""
        while True:
            line = self.reader.line(5.0)
            if line is None:
                return None
            mono, wall, text = line.split(" ", 2)
            event = json.loads(text)
            if event.get("event") == "recommendation" and event.get("status") == "accepted" \
                    and event.get("model") == MODEL:
                return ((int(mono) - sent_ns) / 1e9,
                        (int(wall) // 1000 - _epoch_us(event["ts"])) / 1e6)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def bench_events(session: Session, mountpoint: Path, model: Path, plan: Plan) -> Row:
    """A recommendation write to the line in a separate poll()ing process.

    Two clocks: write start -> line (CLOCK_MONOTONIC on both sides), what a
    trainer waits, including the write's journal fsync; and the event's own
    `ts` -> line (CLOCK_REALTIME), the wake-up path alone (poll notify, the
    reader's poll() returning, its read()).  The same-run reference is the same
    poller woken through a FIFO: what waking another process costs on this
    machine right now, which on a loaded two-CPU host is most of the tail.
    """
    rng = random.Random(2)
    fifo = session.scratch(None) / "events.fifo"
    os.mkfifo(fifo)
    fifo_fd = os.open(fifo, os.O_RDWR)  # a writer always exists: poll() blocks until data

    def via_fifo() -> None:
        event = {"seq": 0, "ts": _rfc3339_now(), "event": "recommendation",
                 "status": "accepted", "model": MODEL}
        os.write(fifo_fd, (json.dumps(event) + "\n").encode())

    def via_mount() -> None:
        echo(str(model / "recommend"), recommendation(rng))

    pollers: list[Poller] = []
    results: dict[str, tuple[list[list[float]], list[list[float]]]] = {
        "fifo": ([], []), "mount": ([], [])}
    missed = 0
    try:
        pollers = [Poller(fifo), Poller(mountpoint / STEER / "events")]
        time.sleep(0.2)
        for index in range(plan.event_rounds):
            for name, poller, trigger in (("fifo", pollers[0], via_fifo),
                                          ("mount", pollers[1], via_mount)):
                samples, wake = [], []
                for _ in range(plan.event_writes):
                    time.sleep(rng.uniform(0.002, 0.006))  # the reader is idle in poll()
                    sent = time.monotonic_ns()
                    trigger()
                    got = poller.wait_accepted(sent)
                    if got is None:
                        missed += 1
                        continue
                    samples.append(got[0])
                    wake.append(got[1])
                results[name][0].append(samples)
                results[name][1].append(wake)
            mount = results["mount"][0][-1]
            progress(f"event wake-up: round {index + 1}/{plan.event_rounds}: "
                     f"p50 {percentile(mount, 50) * 1e6:.0f} us, "
                     f"p99 {percentile(mount, 99) * 1e6:.0f} us (FIFO p99 "
                     f"{percentile(results['fifo'][0][-1], 99) * 1e6:.0f} us)")
    finally:
        for poller in pollers:
            poller.close()
        os.close(fifo_fd)
    measured = latency_summary(results["mount"][0])
    wakeup = latency_summary(results["mount"][1])
    measured["publish->line p50 ms"] = wakeup["p50 ms"]
    measured["publish->line p99 ms"] = wakeup["p99 ms"]
    reference = latency_summary(results["fifo"][0])
    ratios = [percentile(f, 50) / percentile(m, 50)
              for f, m in zip(results["fifo"][0], results["mount"][0], strict=True)]
    return Row("event_wakeup", "event wake-up (recommendation write -> poll()ing reader's line)",
               measured, reference, summarize(ratios), "p99 ≤ 5 ms",
               measured["p99 ms"]["median"] <= 5.0 and missed == 0,
               f"{plan.event_rounds} rounds x {plan.event_writes}, reader in its own process; "
               "p50/p99 from the write's start (the event is sent after the journal fsync); "
               "publish->line from the event's ts; reference: the same poller woken through a "
               f"FIFO; ratio = FIFO p50 / mount p50; events missed: {missed}",
               extra={"missed": missed})
