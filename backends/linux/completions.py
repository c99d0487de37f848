"""The block layer's own count of completed requests, against which linux.bio's records
are checked.

The BPF capture misses a few completions the kernel runs no program for
(backends/linux/bio.py says which and why).  /sys/block/<dev>/stat counts every
completed read, write and discard; `BlockCompletions` reads those counts for the watched
disks and `CompletionLedger` sets them against the records and the ring's losses, so
that records + records_lost = the requests the device completed, and a request whose
record is merely still in the ring or the pipe is not called lost.
"""

from __future__ import annotations

import collections
from pathlib import Path

#: a completed request whose record has not come after this long is counted lost (the
#: loader flushes every 100 ms at most; the pipe's reader takes it at once)
LEDGER_SLACK_SECONDS = 1.0
#: /sys/block/<dev>/stat fields of completed requests: reads, writes, discards (4.18+)
STAT_COMPLETED = (0, 4, 11)


class BlockCompletions:
    """Reads, writes and discards the block layer completed on `devices` (None: every
    disk in /sys/block) since each was first seen: what the records are checked against.

    Only request-based disks count (/sys/block/<dev>/mq exists): a bio-based one (md,
    device-mapper, zram) accounts its I/O in `stat` but issues no request, so no record
    could ever match it.  A flush is not counted: the block layer does not account its
    flush sequences as requests of their own.  A disk's count starts where it was when
    the disk was first seen (one added mid-run brings no history), and from zero when it
    goes down (a disk of the same name made anew: all its requests are this run's)."""

    def __init__(self, devices: list[str] | None) -> None:
        self.devices = devices
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._done = 0  # the counts of disks removed or made anew, kept

    def _counts(self) -> dict[str, int]:
        names = (self.devices if self.devices is not None
                 else [p.name for p in Path("/sys/block").iterdir()])
        out = {}
        for name in names:
            try:
                if not Path(f"/sys/block/{name}/mq").is_dir():
                    continue
                fields = Path(f"/sys/block/{name}/stat").read_text().split()
            except OSError:
                continue  # removed meanwhile: its requests stop counting on both sides
            out[name] = sum(int(fields[i]) for i in STAT_COMPLETED if i < len(fields))
        return out

    def total(self) -> int:
        for name, count in self._counts().items():
            first = self._first.setdefault(name, count)
            if count < self._last.get(name, first):  # made anew under the same name:
                self._done += self._last[name] - first  # all it did since is this run's
                self._first[name] = 0
            self._last[name] = count
        return self._done + sum(self._last[n] - self._first[n] for n in self._last)


class CompletionLedger:
    """The requests the block layer completed against the records and losses accounted.

    `observe(now, completed, recorded, lost)` takes the device's cumulative count of
    completed requests now, and the records (of the operations that count) and losses
    accounted since the last call; it returns the completions newly found without a
    record.  A completion counts as unrecorded only once it is `slack` seconds old: the
    shortfall is taken against the device's count of `slack` seconds ago, so records
    still in the ring or the pipe are not called lost.  The shortfall never goes down: a
    record that came after it was counted lost (a stall longer than `slack`) stays
    counted (the figure is then an upper bound)."""

    def __init__(self, completed: int, slack: float = LEDGER_SLACK_SECONDS,
                 now: float = 0.0) -> None:
        self.slack = slack
        self._start = completed
        self._seen: collections.deque[tuple[float, int]] = collections.deque([(now, completed)])
        self.accounted = 0
        self.unrecorded = 0

    def observe(self, now: float, completed: int, recorded: int, lost: int) -> int:
        self.accounted += recorded + lost
        self._seen.append((now, completed))
        while len(self._seen) > 1 and now - self._seen[1][0] >= self.slack:
            self._seen.popleft()  # the front stays the newest count old enough
        seen_at, due = self._seen[0]
        if now - seen_at < self.slack:
            return 0
        shortfall = (due - self._start) - self.accounted - self.unrecorded
        if shortfall <= 0:
            return 0
        self.unrecorded += shortfall
        return shortfall
