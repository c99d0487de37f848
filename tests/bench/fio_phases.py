"""Phases of a workload as standard tools run them: fio job files, read back from fio's JSON.

The job files are in tests/bench/workloads/ (``${DIR}`` and ``${RUNTIME}``
come from the environment).  A phase's figure is the application's own:
fio's ``io_bytes`` (reads + writes) over fio's ``job_runtime`` of the jobs
that are the application, summed; jobs named ``bg-*`` are load beside it
(a backup streaming at a fixed rate) and are not counted.

Write-behind: fio counts a buffered write's bytes when write(2) returns,
i.e. once they are in the page cache, not on the device.  ``end_fsync=1``
puts the final flush into the job's runtime (so the phase's summary is
durable), but the per-second figure is not: a writer that parks pages under
high dirty limits shows a high rate for seconds and pays at the end, or the
next phase pays (measured: a policy learnt dirty_ratio 80 for the stream
writer from that signal and ran it at x0.78 of the default, README).  So
every measured buffered writer in the workloads flushes at a cadence
(``fsync=N`` / ``fdatasync=N``: ``stream-write`` every 32 MiB, ``db-commit``
every write): the bytes fio reports over a second are then at most one
cadence ahead of the bytes on the device, which is the application's durable
throughput, from the tool's own output (tests/unit/test_fio_phases.py pins
the cadence).  The kernel's own counters (dirtied, written) would count
parked pages, or count writeback of earlier phases and of the background
load, which is why they are not the objective.

`FioStream` runs a phase with ``--status-interval=1`` and turns fio's
periodic JSON (cumulative ``io_bytes`` per job) into the application's MiB/s
over each second, which is what an operator's glue writes to an mlfs
subsystem's ``objective``.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

WORKLOADS = Path(__file__).resolve().parent / "workloads"
MIB = 1 << 20
#: fio's minimum status interval is one second
STATUS_SECONDS = 1


def job_file(phase: str | Path) -> Path:
    """A phase's job file: tests/bench/workloads/<phase>.fio, or a path to one."""
    return Path(phase) if str(phase).endswith(".fio") else WORKLOADS / f"{phase}.fio"


def _measured(job: dict) -> bool:
    return not job["jobname"].startswith("bg-")


def _job_bytes(job: dict) -> int:
    return sum(job[d]["io_bytes"] for d in ("read", "write", "trim") if d in job)


def summarize(report: dict) -> dict:
    """{mib_per_s, bytes, seconds, jobs: {name: {mib_per_s, runtime_ms, *_p99_ms}}} of
    one fio JSON report (bytes and seconds: the measured jobs', seconds the longest)."""
    jobs: dict[str, dict] = {}
    total, longest = 0, 0
    for job in report["jobs"]:
        name = job["jobname"]
        runtime = max(1, int(job.get("job_runtime", 0)))
        done = _job_bytes(job)
        row = {"mib_per_s": done / MIB / (runtime / 1000), "runtime_ms": runtime}
        sync = job.get("sync", {}).get("lat_ns", {}).get("percentile")
        if sync:
            row["fsync_p99_ms"] = sync.get("99.000000", 0) / 1e6
        for d in ("read", "write"):
            pct = job.get(d, {}).get("clat_ns", {}).get("percentile")
            if pct and job[d]["io_bytes"]:
                row[f"{d}_p99_ms"] = pct.get("99.000000", 0) / 1e6
        key = name
        n = 1
        while key in jobs:  # numjobs > 1: the same name several times
            n += 1
            key = f"{name}.{n}"
        jobs[key] = row
        if _measured(job):
            total += done
            longest = max(longest, runtime)
    return {"mib_per_s": total / MIB / (longest / 1000) if longest else 0.0,
            "bytes": total, "seconds": longest / 1000, "jobs": jobs}


def settle() -> float:
    """Start a visit on a clean page cache: sync(2), which returns once every dirty page
    is on its device; the seconds it took.

    A visit's buffered writers leave up to a flush cadence dirty, plus what the
    background jobs wrote, and the next visit's writer then shares the device with
    their writeback.  Under interleaved conditions that cost lands on whichever
    condition comes next, not the one that made it: writeback's three runs at 4e3bfed
    measured the default against itself at x0.68-1.09 (docs/results/against-fixed.md).
    The time spent here is in no visit's figure."""
    began = time.monotonic()
    os.sync()
    return time.monotonic() - began


def run_phase(phase: str | Path, directory: Path, seconds: float) -> dict:
    """Run one phase's job file for `seconds`; summarize() of its report.

    A `FioStream` without a listener, so that an interrupted sweep stops fio and
    its job processes as a stream does (a SIGKILL of fio alone left its jobs
    writing and the scratch file system busy at its unmount)."""
    return FioStream(phase, directory, seconds).wait(timeout=seconds * 10 + 120)


class FioStream:
    """One phase run with fio's periodic status; `on_rate(mib_per_s)` each second.

    fio prints a complete JSON report every ``--status-interval`` (cumulative
    io_bytes per job); the difference of the measured jobs' bytes between two
    reports over the difference of their timestamps is the application's
    throughput over that second, or over the last `rate_seconds` reports (a
    writer that flushes every half second moves its per-second figure by x2
    with where the second falls in its cycle).  The first report is taken
    against the start of fio (no bytes), so a new phase's figure replaces the
    previous phase's after one report.  The last report is the phase's summary.
    """

    def __init__(self, phase: str | Path, directory: Path, seconds: float,
                 on_rate: Callable[[float], None] | None = None,
                 rate_seconds: int = 1) -> None:
        env = {**os.environ, "DIR": str(directory), "RUNTIME": str(max(1, round(seconds)))}
        self.on_rate = on_rate
        self.last: dict | None = None
        #: (timestamp s, measured bytes) of the reports the rate spans, oldest first
        self._reports: collections.deque[tuple[float, int]] = collections.deque(
            [(time.time(), 0)], maxlen=max(1, rate_seconds) + 1)
        self.proc = subprocess.Popen(
            ["fio", "--output-format=json", f"--status-interval={STATUS_SECONDS}",
             str(job_file(phase))], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True, name="fio")
        self.reader.start()

    def kill(self) -> None:
        """SIGTERM to fio (by its pid), which stops its jobs and waits for them: each
        job is a process in a session of its own, out of reach of a group kill.
        SIGKILL if it has not ended within 10 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        buf: list[str] = []
        for line in self.proc.stdout:
            if line.startswith("{") and buf:
                buf = []
            buf.append(line)
            if line.rstrip() != "}":
                continue
            try:
                report = json.loads("".join(buf))
            except ValueError:
                continue  # a nested closing brace: the report goes on
            buf = []
            self.last = report
            now = report.get("timestamp_ms", time.time() * 1000) / 1000
            done = sum(_job_bytes(j) for j in report["jobs"] if _measured(j))
            then, before = self._reports[0]
            if now > then and self.on_rate is not None:
                self.on_rate((done - before) / MIB / (now - then))
            self._reports.append((now, done))

    def wait(self, timeout: float) -> dict:
        """The phase's summary; on a timeout or an interrupt (SIGTERM of a benchmark)
        fio is stopped first, with its job processes, so that the file system under
        them can be unmounted."""
        try:
            self.proc.wait(timeout=timeout)
        except BaseException as exc:
            self.kill()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise RuntimeError(f"fio ran past {timeout:g} s: stopped") from None
            raise
        self.reader.join(timeout=10)
        if self.last is None:
            raise RuntimeError("fio printed no report")
        return summarize(self.last)
