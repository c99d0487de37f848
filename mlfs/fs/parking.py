"""Parked `events` reads, and the one task that watches their openers.

pyfuse3 does not handle FUSE_INTERRUPT: a read blocked in the daemon cannot be
killed until its handler returns.  So a parked read answers EINTR when the
process that opened the file has a pending signal it does not block, or has
exited, which `opener_interrupted` reads from /proc/<pid>/status.  (Answering
EINTR after a fixed time instead was tried: sed, mawk and busybox `head`
report that as a read error, where on a pipe they would just wait.)

Before, every parked read looked at its opener itself every 0.1 s: with 512
parked `cat`s that was 5,120 /proc reads a second, and the daemon burned
20-40 % of a core doing nothing (issue 10).  Now one watcher task makes a
round over the distinct openers of all parked reads every
`SIGNAL_CHECK_SECONDS`, and stretches the interval so that its rounds take at
most `WATCH_SHARE` of the trio thread: a signal still ends a parked reader in
about 0.1 s while few are parked, and within `spent / WATCH_SHARE` when many
are.  The watcher runs only while something is parked.

An event wakes root's parked reads at once; the others wait `WAKE_DELAY`
(events in between reach them in one read) and are then woken `WAKE_BATCH`
at a time, `WAKE_PACE` seconds apart.  Each woken read is a reply
and, from a `cat`, a new read request right behind it in the kernel's queue:
woken all at once, 256 parked readers put root's `cat version` behind ~512
requests after each of root's own `recommend` writes (p50 168 ms with root
writing continuously, tests/bench/parked_readers.py on the loaded 2-core test
machine); paced, 117 ms; delayed and paced, 0.8 ms.  With batches only a
checkpoint apart the p99 stayed at 325-377 ms for 1,024 readers of 16 uids: a
request that arrived during a burst waited for all of it.  Paced 16 per 1 ms
after 20 ms: 183 ms; 8 per 2 ms after 50 ms: 9.5 ms against 1.8 ms with none
parked; 4 per 2 ms: x4.0 median of five runs against x5.2 for 8 per 2 ms
(docs/results/parked-readers.md).  The price: an unprivileged reader of 1,024
gets an event up to ~0.56 s after root.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import time

import trio

from mlfs.base.errors import Refused
from mlfs.core.mount.events import Subscriber
from mlfs.core.mount.readers import ROOT_UID, ReaderAccounts

log = logging.getLogger("mlfs.fs")

SIGNAL_CHECK_SECONDS = 0.1
#: the most of the trio thread the watcher's rounds may take
WATCH_SHARE = 0.05
#: openers looked at between two checkpoints (other requests run in between)
WATCH_BATCH = 32
#: parked reads of users other than root woken at once when an event comes
WAKE_BATCH = 4
#: how long an event waits before the first batch: events in between are coalesced
WAKE_DELAY = 0.05
#: seconds between two batches of woken non-root readers (1,024 parked: ~0.5 s for all)
WAKE_PACE = 0.002


def _hex_field(status: bytes, name: bytes) -> int:
    start = status.find(name)
    if start < 0:
        return 0
    start += len(name)
    end = status.find(b"\n", start)
    return int(status[start:end if end >= 0 else None], 16)


def opener_interrupted(pid: int) -> bool:
    """True when `pid` has exited or has a pending signal it does not block.

    `(SigPnd | ShdPnd) & ~SigBlk`: a signal queued for the thread or its
    process that it would take now.  Parsed with `find` rather than split into
    lines: a third of the cost (70 against 195 µs per call on the loaded test
    machine, of which ~45 µs is the kernel producing the file).
    """
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False
    try:
        status = os.read(fd, 8192)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    state = status.find(b"\nState:\t")
    if state >= 0 and status[state + 8:state + 9] in (b"Z", b"X"):
        return True
    try:
        pending = _hex_field(status, b"\nSigPnd:\t") | _hex_field(status, b"\nShdPnd:\t")
        blocked = _hex_field(status, b"\nSigBlk:\t")
    except ValueError:
        return False
    return bool(pending & ~blocked)


class _Wait:
    __slots__ = ("pid", "event", "interrupted", "wake_later")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.event = trio.Event()
        self.interrupted = False
        self.wake_later = None  # set by Parking: queue this wait for the pacer

    def wake(self, interrupted: bool = False) -> None:
        self.interrupted = self.interrupted or interrupted
        self.event.set()


class Parking:
    """Where reads of `events` wait; call from the trio thread only."""

    def __init__(self, accounts: ReaderAccounts) -> None:
        self.accounts = accounts
        self._waits: set[_Wait] = set()
        self._watching = False
        self._to_wake: collections.deque[_Wait] = collections.deque()
        self._pacing = False
        self.stopping = False
        #: the watcher's current round interval (seconds), for tests and metrics
        self.interval = SIGNAL_CHECK_SECONDS
        self.rounds = 0

    def __len__(self) -> int:
        return len(self._waits)

    async def wait(self, sub: Subscriber, pid: int, uid: int) -> None:
        """Return when `sub` has something to read, or at shutdown.

        Refused(EAGAIN) when `uid` may not wait now (core/mount/readers.py);
        Refused(EINTR) when the opener `pid` got a signal or exited.
        """
        self.accounts.start_wait(uid)
        wait = _Wait(pid)
        wait.wake_later = functools.partial(self._wake_later, wait)
        self._waits.add(wait)
        self._watch()
        try:
            while not sub.ready() and not self.stopping:
                if wait.interrupted:
                    raise Refused(errno.EINTR, "the opener was signalled")
                wait.event = trio.Event()
                waker = wait.event.set if uid == ROOT_UID else wait.wake_later
                sub.wait_with(waker)
                try:
                    await wait.event.wait()
                finally:
                    sub.cancel_wait(waker)
        finally:
            self._waits.discard(wait)
            self.accounts.end_wait(uid)

    def stop(self) -> None:
        """Shutdown: every parked read returns (and answers end of file)."""
        self.stopping = True
        self._to_wake.clear()
        for wait in list(self._waits):
            wait.wake()

    def _wake_later(self, wait: _Wait) -> None:
        self._to_wake.append(wait)
        if not self._pacing:
            self._pacing = True
            trio.lowlevel.spawn_system_task(self._pacer, name="mlfs events pacer")

    async def _pacer(self) -> None:
        """Wake queued reads `WAKE_BATCH` at a time; requests in between get a turn."""
        try:
            await trio.sleep(WAKE_DELAY)  # root's requests of the moment go first
            while self._to_wake:
                for _ in range(min(WAKE_BATCH, len(self._to_wake))):
                    self._to_wake.popleft().wake()
                # each woken reader reads again at once: a burst of 1,024 re-reads queued
                # in the kernel ahead of root's next request held it 325-377 ms (p99);
                # paced in time, at most WAKE_BATCH re-reads stand before it
                await trio.sleep(WAKE_PACE)
        except Exception:
            log.exception("the events pacer failed; it restarts with the next event")
        finally:
            self._pacing = False

    def _watch(self) -> None:
        if not self._watching:
            self._watching = True
            trio.lowlevel.spawn_system_task(self._watcher, name="mlfs events watcher")

    async def _watcher(self) -> None:
        """Rounds over the parked reads' openers while any read is parked.

        A system task (pyfuse3 gives handlers no nursery); it must never raise,
        or trio.run ends with TrioInternalError: unexpected errors are logged
        and the watcher ends (the next parked read starts a new one).
        """
        try:
            while self._waits and not self.stopping:
                await trio.sleep(self.interval)
                started = time.perf_counter()
                by_pid: dict[int, list[_Wait]] = {}
                for wait in self._waits:
                    by_pid.setdefault(wait.pid, []).append(wait)
                for number, (pid, waits) in enumerate(by_pid.items(), 1):
                    if opener_interrupted(pid):
                        for wait in waits:
                            wait.wake(interrupted=True)
                    if number % WATCH_BATCH == 0:
                        spent = time.perf_counter() - started
                        await trio.lowlevel.checkpoint()
                        started = time.perf_counter() - spent
                self.rounds += 1
                spent = time.perf_counter() - started
                self.interval = max(SIGNAL_CHECK_SECONDS, spent / WATCH_SHARE)
        except Exception:
            log.exception("the events watcher failed; it restarts with the next parked read")
        finally:
            self._watching = False
