"""Per-request features of one block device, from every read request it completes.

Why: /sys/block/<dev>/stat counts requests and sectors, but cannot say *where*
they went.  Whether reads are sequential is what a readahead policy needs to
know, and the stat counters hide it behind the knob itself: with
read_ahead_kb = 0 a sequential scan and random page faults both issue 4 KiB
requests at the same rate.  KML (Akgun et al.) took its readahead features
from the block tracepoints for that reason; so does this.

How: the per-request records of `linux.bio` (a BPF CO-RE program on the block
tracepoints, its ring buffer drained in bulk; backends/linux/bio.py), filtered
in the kernel to the device, decoded a batch at a time with numpy: no Python per
request.  Each `totals` call drains what completed since the last and adds it to
running totals, which a backend snapshots like any other cumulative counter.
(Until issue 31 a bpftrace child printed counters every 50 ms; the ring carries
every request instead, at a fraction of the cost, and bpftrace is no longer
needed.)

What is counted per read request (in issue order within what completed):

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
* ``readahead``: flagged REQ_RAHEAD by the page cache (the flag's bit read from
  the kernel's BTF, as it moves between releases);
* ``completed``, ``latency_us`` (sum) and ``slow`` (over 1 ms), from issue to
  completion.

Nothing is retried: if the capture cannot start or its loader dies, `error`
says why, the features become NaN (LightGBM's missing value) and a warning is
logged once.  `close` ends the loader by its PID.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow.compute as pc

from .linux import bio

__all__ = ["COUNTERS", "TRACE_FEATURES", "RequestTracer", "derive_trace", "tracer_unavailable"]

log = logging.getLogger("mlfs.backends.blktrace")

#: cumulative counters `totals` returns
COUNTERS = ("requests", "sectors", "seq", "near", "readahead", "completed",
            "latency_us", "slow")
#: a read run's gap that still counts as `near` (sectors: 1 MiB)
NEAR_SECTORS = 2048
#: latency over this is `slow` (µs)
SLOW_US = 1000


def tracer_unavailable() -> str | None:
    """Why read requests cannot be traced here, or None when they can."""
    return bio.unavailable()


class RequestTracer:
    """Running totals of one device's read requests, from linux.bio's BPF ring capture."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.error: str | None = None
        self._totals = dict.fromkeys(COUNTERS, 0)
        self._next_sector: int | None = None
        self._readahead_bit = 1 << bio.request_flag_bit("__REQ_RAHEAD")
        self._capture = bio.LinuxBio(name=f"trace.{device}", device=device)
        #: the loader's pid (ended by it at close)
        self.pid = self._capture.pid

    def wait_ready(self, timeout: float = 0.0) -> bool:
        """The capture attached when it was built (its loader said "ready")."""
        return self.error is None

    def totals(self) -> dict[str, int] | None:
        """The cumulative counters so far; None once the capture has ended."""
        if self.error is not None:
            return None
        code = self._capture.exited()
        if code is not None:
            self.error = f"the BPF capture for {self.device} ended: exit status {code}"
            log.warning("%s; its trace_* features are NaN from now on", self.error)
            return None
        records = self._capture.step({}).records
        if records is not None and records.num_rows:
            self._add(records)
        return dict(self._totals)

    def _add(self, records) -> None:
        flags = np.asarray(records.column("cmd_flags")).astype(np.int64)
        reads = (flags & 0xFF) == 0
        if not reads.any():
            return
        issued = np.asarray(records.column("issue_ns"))[reads]
        # null: a completion the capture did not see (its issue always was)
        completed = np.asarray(pc.fill_null(records.column("complete_ns"), 0))[reads]
        # a request whose issue was not seen (issue_ns 0) is placed by its completion
        order = np.argsort(np.where(issued != 0, issued, completed), kind="stable")
        start = np.asarray(records.column("sector")).astype(np.int64)[reads][order]
        sectors = (np.asarray(records.column("bytes")).astype(np.int64)[reads][order] // 512)
        latency = np.asarray(records.column("latency_us"))[reads][order]
        end = start + sectors
        before = np.empty_like(start)
        before[0] = -1 if self._next_sector is None else self._next_sector
        before[1:] = end[:-1]
        seq = start == before
        near = ~seq & (before >= 0) & (np.abs(start - before) <= NEAR_SECTORS)
        totals = self._totals
        totals["requests"] += len(start)
        totals["sectors"] += int(sectors.sum())
        totals["seq"] += int(seq.sum())
        totals["near"] += int(near.sum())
        totals["readahead"] += int(((flags[reads] & self._readahead_bit) != 0).sum())
        timed = ~np.isnan(latency)  # one end of the request not seen: no latency
        totals["completed"] += int(timed.sum())
        totals["latency_us"] += int(latency[timed].sum())
        totals["slow"] += int((latency[timed] > SLOW_US).sum())
        self._next_sector = int(end[-1])

    def close(self) -> None:
        """End the capture's loader (by its PID)."""
        self._capture.close()


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
