"""Who may open and wait on `events` files: the limits that keep root served.

pyfuse3 serves every FUSE request as a trio task from a pool of at most
`[mount] max_tasks`, and a read of an `events` file that waits for the next
event holds its task until then.  Without limits, ~512 parked reads by one
unprivileged user took every task: root's `cat version` stalled 2.6-9.8 s
and the whole mount answered only between two events (issue 10).  So every
uid but root is held to:

- `events_streams_per_uid` open `events` files (EMFILE beyond: "too many open
  files", which is what it is) and `events_streams` for all of them together
  (ENFILE, the system-wide form).  An open stream costs a cursor, not a queue
  (events.py), so these bound bookkeeping, not buffers;
- `events_blocked_reads_per_uid` reads waiting at once, and
  `events_blocked_reads` for all of them together, which the configuration
  keeps at least `2 * FREE_TASKS` below `max_tasks`: what is left is root's
  and that of requests that never wait.

Every other open file of the mount is held too, per uid but root
(`handles_per_uid`, EMFILE) and for all of them (`handles`, ENFILE): an open
attribute holds a snapshot of its text and an open portion a share of one
descriptor or mapping per portion, and without a bound one unprivileged
user's 15,000 opens of `metrics` grew the daemon from 91 to 443 MB (red-team
pass 2).  `events` files are counted by their own limits above, not here.

Root is held to one limit only: no blocked read, root's included, takes the
last `FREE_TASKS` tasks, so a request that never waits (`cat version`,
`umount`'s requests, a `recommend` write) always finds one.

A read beyond a blocked-read limit cannot wait (it would hold a task), so it
is answered EAGAIN at once, as a read on an O_NONBLOCK descriptor with
nothing to read is.  The other errnos a read could give were worse: EINTR is
retried at once by cat, Python, grep, jq and bash's `read`, a busy loop that
burns the reader's CPU and the daemon's; end of file tells the reader the
stream ended when it did not.  With EAGAIN cat, jq and grep print "Resource
temporarily unavailable" and exit, Python raises BlockingIOError, and a
reader that polls first (`mlfs.client.EventStream`: the trainer, `mlfs status`)
never sees it: poll() holds no task, so polling readers are not limited.
"""

from __future__ import annotations

import collections
import errno
from dataclasses import dataclass

from .errors import Refused

ROOT_UID = 0
#: worker tasks that no blocked read may take, root's included
FREE_TASKS = 16


@dataclass(frozen=True)
class ReaderStats:
    streams: int
    blocked_reads: int
    refused_opens: int
    refused_reads: int


class ReaderAccounts:
    """Open streams and blocked reads per uid, checked against the limits.

    `limits` is the `[mount]` section (`mlfs.config.MountConfig`).  FUSE-free:
    the adapter calls `open_stream`/`close_stream` from open and release, and
    `start_wait`/`end_wait` around a read that waits.
    """

    def __init__(self, limits) -> None:
        self.limits = limits
        self._streams: collections.Counter[int] = collections.Counter()
        self._blocked: collections.Counter[int] = collections.Counter()
        self.other_streams = 0  # every uid but root's
        self.other_blocked = 0
        self.blocked = 0  # every uid's, root's included
        self.refused_opens = 0
        self.refused_reads = 0
        self._handles: collections.Counter[int] = collections.Counter()
        self.other_handles = 0
        self.refused_handles = 0

    def open_handle(self, uid: int) -> None:
        """Count an open of an attribute or portion, or refuse it (EMFILE / ENFILE)."""
        if uid == ROOT_UID:
            return
        limits = self.limits
        if self._handles[uid] >= limits.handles_per_uid:
            self.refused_handles += 1
            raise Refused(errno.EMFILE, f"uid {uid} has {limits.handles_per_uid} files of the "
                          "mount open ([mount] handles_per_uid)")
        if self.other_handles >= limits.handles:
            self.refused_handles += 1
            raise Refused(errno.ENFILE, f"{limits.handles} files of the mount are open by users "
                          "other than root ([mount] handles)")
        self._handles[uid] += 1
        self.other_handles += 1

    def close_handle(self, uid: int) -> None:
        if uid == ROOT_UID:
            return
        _decrement(self._handles, uid)
        self.other_handles -= 1

    def open_stream(self, uid: int) -> None:
        limits = self.limits
        if uid != ROOT_UID:
            if self._streams[uid] >= limits.events_streams_per_uid:
                self.refused_opens += 1
                raise Refused(errno.EMFILE, f"uid {uid} has {limits.events_streams_per_uid} events "
                              "files open ([mount] events_streams_per_uid)")
            if self.other_streams >= limits.events_streams:
                self.refused_opens += 1
                raise Refused(errno.ENFILE, f"{limits.events_streams} events files are open by "
                              "users other than root ([mount] events_streams)")
            self.other_streams += 1
        self._streams[uid] += 1

    def close_stream(self, uid: int) -> None:
        _decrement(self._streams, uid)
        if uid != ROOT_UID:
            self.other_streams -= 1

    def start_wait(self, uid: int) -> None:
        """Count a read about to wait, or refuse it (EAGAIN) if it may not."""
        limits = self.limits
        if self.blocked >= limits.max_tasks - FREE_TASKS:
            reason = f"{self.blocked} reads already wait ([mount] max_tasks)"
        elif uid != ROOT_UID and self._blocked[uid] >= limits.events_blocked_reads_per_uid:
            reason = (f"uid {uid} has {limits.events_blocked_reads_per_uid} reads waiting "
                      "([mount] events_blocked_reads_per_uid)")
        elif uid != ROOT_UID and self.other_blocked >= limits.events_blocked_reads:
            reason = (f"{limits.events_blocked_reads} reads by users other than root wait "
                      "([mount] events_blocked_reads)")
        else:
            self._blocked[uid] += 1
            self.blocked += 1
            if uid != ROOT_UID:
                self.other_blocked += 1
            return
        self.refused_reads += 1
        raise Refused(errno.EAGAIN, reason)

    def end_wait(self, uid: int) -> None:
        _decrement(self._blocked, uid)
        self.blocked -= 1
        if uid != ROOT_UID:
            self.other_blocked -= 1

    def stats(self) -> ReaderStats:
        return ReaderStats(sum(self._streams.values()), self.blocked, self.refused_opens,
                           self.refused_reads)


def _decrement(counter: collections.Counter[int], key: int) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]  # a uid with nothing open costs nothing
