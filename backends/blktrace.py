"""Per-request features of one block device, from the kernel's block tracepoints.

Why: /sys/block/<dev>/stat counts requests and sectors, but cannot say *where*
they went.  Whether reads are sequential is what a readahead policy needs to
know, and the stat counters hide it behind the knob itself: with
read_ahead_kb = 0 a sequential scan and random page faults both issue 4 KiB
requests at the same rate.  KML (Akgun et al.) took its readahead features
from the block tracepoints for that reason; so does this.

How: one ``bpftrace`` process per traced device, on ``block:block_rq_issue``
and ``block:block_rq_complete``, filtered in the kernel to the device's
``dev_t`` and to reads.  It keeps per-CPU counters and prints them every
`INTERVAL_MS` as ``@name: value`` lines ending with ``--``; a reader thread
adds each block to running totals.  A backend snapshots the totals like any
other cumulative counter (`totals`), so a tick's window is exact to within
one interval.  bpftrace runs in a private mount namespace (``unshare -m``)
with tracefs mounted there, because this machine's /sys/kernel/tracing is
not mounted and mlfs must not change the host's mounts.

What is counted per read request (issue time, except the latency):

* ``requests`` and ``sectors`` (512 bytes);
* ``seq``: it starts at the sector where the previous read request on the
  device ended (a sequential stream, whatever the request size);
* ``near``: not contiguous, but within 1 MiB of that end (a strided or
  clustered stream);
* from these, the mean length of a *run* (consecutive requests, each starting
  where the previous ended): a sequential scan has runs of many MiB whatever
  read_ahead_kb is, while random page faults have runs of one read-around
  (read_ahead_kb), which the request-level sequential share does not show
  (a 2 MiB read-around is sixteen contiguous 128 KiB requests);
* ``readahead``: flagged REQ_RAHEAD by the page cache (rwbs ``RA``);
* ``completed``, ``latency_us`` (sum) and ``slow`` (over 1 ms), from issue to
  completion, matched by start sector.

Nothing is retried: if bpftrace is missing, cannot attach or dies, `error`
says why, the features become NaN (LightGBM's missing value) and a warning
is logged once.  `close` ends the process by its PID.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["COUNTERS", "TRACE_FEATURES", "RequestTracer", "derive_trace", "tracer_unavailable"]

log = logging.getLogger("mlfs.backends.blktrace")

#: how often bpftrace hands its counters over (ms): a tick's window edge is this exact
INTERVAL_MS = 50
#: cumulative counters `totals` returns
COUNTERS = ("requests", "sectors", "seq", "near", "readahead", "completed",
            "latency_us", "slow")
#: seconds `RequestTracer.wait_ready` allows bpftrace to compile and attach
READY_SECONDS = 20.0

# `$1` is the device's dev_t in the kernel's encoding (major << 20 | minor).
PROGRAM = r"""
tracepoint:block:block_rq_issue /args->dev == $1 && strncmp(args->rwbs, "R", 1) == 0/ {
  @requests = count();
  @sectors = sum(args->nr_sector);
  if (args->sector == @next) {
    @seq = count();
  } else {
    $gap = args->sector > @next ? args->sector - @next : @next - args->sector;
    if ($gap <= 2048) { @near = count(); }
  }
  if (strncmp(args->rwbs, "RA", 2) == 0) { @readahead = count(); }
  @next = args->sector + args->nr_sector;
  @issued[args->sector] = nsecs;
}
tracepoint:block:block_rq_complete /args->dev == $1 && @issued[args->sector]/ {
  $us = (nsecs - @issued[args->sector]) / 1000;
  @completed = count();
  @latency_us = sum($us);
  if ($us > 1000) { @slow = count(); }
  delete(@issued[args->sector]);
}
interval:ms:INTERVAL {
  print(@requests); print(@sectors); print(@seq); print(@near); print(@readahead);
  print(@completed); print(@latency_us); print(@slow);
  printf("--\n");
  clear(@requests); clear(@sectors); clear(@seq); clear(@near); clear(@readahead);
  clear(@completed); clear(@latency_us); clear(@slow);
}
""".replace("INTERVAL", str(INTERVAL_MS))


def tracer_unavailable() -> str | None:
    """Why block tracepoints cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "block tracepoints need root (bpftrace loads BPF programs)"
    for tool in ("bpftrace", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            package = "bpftrace" if tool == "bpftrace" else "util-linux"
            return f"{tool} is not installed (Debian: apt-get install {package})"
    if not Path("/sys/kernel/tracing").is_dir():
        return "/sys/kernel/tracing does not exist (kernel without tracefs)"
    return None


def device_number(device: str) -> int:
    """The device's dev_t as tracepoints report it: major << 20 | minor."""
    major, minor = (int(v) for v in Path(f"/sys/block/{device}/dev").read_text().split(":"))
    return (major << 20) | minor


class RequestTracer:
    """Running totals of one device's read requests, fed by a bpftrace child."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.error: str | None = None
        self._totals = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = False
        script = ("mountpoint -q /sys/kernel/tracing || "
                  "mount -t tracefs nodev /sys/kernel/tracing || exit 97; "
                  'exec bpftrace -q -e "$0" "$1"')
        # stderr goes to a file: a pipe nobody reads while bpftrace runs could fill
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            # setpriv: bpftrace ignores SIGPIPE, so without a parent-death signal
            # it would outlive a SIGKILLed daemon (the signal follows the thread
            # that started it: construct tracers in a long-lived thread)
            ["setpriv", "--pdeathsig", "SIGKILL",
             "unshare", "--mount", "--propagation", "private", "sh", "-c", script,
             PROGRAM, str(device_number(device))],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, bufsize=1, start_new_session=True)
        self.pid = self._proc.pid
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"blktrace-{device}")
        self._reader.start()

    # ---- the child's output --------------------------------------------------------
    def _read(self) -> None:
        assert self._proc.stdout is not None
        block: dict[str, int] = {}
        for line in self._proc.stdout:
            line = line.strip()
            if line == "--":
                with self._lock:
                    for name, value in block.items():
                        self._totals[name] += value
                block.clear()
                self._ready.set()
            elif line.startswith("@") and ":" in line:
                name, _, value = line[1:].partition(":")
                if name in self._totals:
                    try:
                        block[name] = int(value)
                    except ValueError:
                        pass
        code = self._proc.wait()
        if not self._closed:
            self._stderr.seek(0)
            stderr = self._stderr.read()
            # bpftrace warns that it cannot raise RLIMIT_MEMLOCK (kernels since 5.11
            # account BPF memory to the cgroup instead): not the reason it ended
            lines = [ln for ln in stderr.splitlines() if ln and "RLIMIT_MEMLOCK" not in ln]
            why = lines[-1] if lines else f"exit status {code}"
            self.error = f"bpftrace for {self.device} ended: {why}"
            log.warning("%s; its trace_* features are NaN from now on", self.error)
        self._ready.set()

    # ---- what a backend uses ---------------------------------------------------------
    def wait_ready(self, timeout: float = READY_SECONDS) -> bool:
        """Wait until the first block of counters arrived (bpftrace attached)."""
        self._ready.wait(timeout)
        return self.error is None and self._ready.is_set()

    def totals(self) -> dict[str, int] | None:
        """The cumulative counters so far; None when the tracer is not running."""
        if self.error is not None or not self._ready.is_set():
            return None
        with self._lock:
            return dict(self._totals)

    def close(self) -> None:
        """End bpftrace (by its PID: the process group it leads) and the reader."""
        if self._closed:
            return
        self._closed = True
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self._proc.wait()
        self._reader.join(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()

    def __del__(self) -> None:  # a dropped backend must not leave bpftrace running
        if not getattr(self, "_closed", True):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, AttributeError):
                pass


def derive_trace(before: dict[str, int] | None, after: dict[str, int] | None,
                 seconds: float) -> dict[str, float]:
    """The trace_* features of a window between two `totals` (NaN when missing)."""
    if before is None or after is None or seconds <= 0:
        return dict.fromkeys(TRACE_FEATURES, float("nan"))
    d = {k: max(0, after[k] - before[k]) for k in COUNTERS}
    n, done = d["requests"], d["completed"]
    return {
        "trace_reads_per_s": n / seconds,
        "trace_read_kb": d["sectors"] * 512 / 1024 / n if n else 0.0,
        "trace_seq_share": d["seq"] / n if n else 0.0,
        "trace_near_share": d["near"] / n if n else 0.0,
        # a run: requests each starting where the previous one ended
        "trace_run_kb": d["sectors"] * 512 / 1024 / max(1, n - d["seq"]) if n else 0.0,
        "trace_readahead_share": d["readahead"] / n if n else 0.0,
        "trace_await_us": d["latency_us"] / done if done else 0.0,
        "trace_slow_share": d["slow"] / done if done else 0.0,
    }


#: the features a traced device adds (all float64)
TRACE_FEATURES = ("trace_reads_per_s", "trace_read_kb", "trace_seq_share", "trace_near_share",
                  "trace_run_kb", "trace_readahead_share", "trace_await_us", "trace_slow_share")
UNITS = {"trace_reads_per_s": "1/s", "trace_read_kb": "KiB", "trace_seq_share": "1",
         "trace_near_share": "1", "trace_run_kb": "KiB", "trace_readahead_share": "1",
         "trace_await_us": "us", "trace_slow_share": "1"}
