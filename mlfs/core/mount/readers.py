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

from mlfs.base.errors import Refused

ROOT_UID = 0
#: worker tasks that no blocked read may take, root's included
FREE_TASKS = 16


@dataclass(frozen=True)
class ReaderStats:
    streams: int
    blocked_reads: int
    refused_opens: int
    refused_reads: int


class OpenQuota:
    """Files of one kind open per uid, and by every uid but root together, against two limits.

    Beyond `per_uid` of one uid: EMFILE ("too many open files", what it is);
    beyond `total` of all but root: ENFILE (the system-wide form).  Root is
    counted (for the statistics) but never refused.
    """

    def __init__(self, what: str, per_uid_key: str, total_key: str) -> None:
        self.what, self.per_uid_key, self.total_key = what, per_uid_key, total_key
        self.by_uid: collections.Counter[int] = collections.Counter()
        self.others = 0  # every uid but root's
        self.refused = 0

    def open(self, uid: int, per_uid: int, total: int) -> None:
        if uid != ROOT_UID:
            if self.by_uid[uid] >= per_uid:
                self.refused += 1
                raise Refused(errno.EMFILE, f"uid {uid} has {per_uid} {self.what} open "
                              f"([mount] {self.per_uid_key})")
            if self.others >= total:
                self.refused += 1
                raise Refused(errno.ENFILE, f"{total} {self.what} are open by users other "
                              f"than root ([mount] {self.total_key})")
            self.others += 1
        self.by_uid[uid] += 1

    def close(self, uid: int) -> None:
        _decrement(self.by_uid, uid)
        if uid != ROOT_UID:
            self.others -= 1

    def count(self) -> int:
        return sum(self.by_uid.values())


class ReaderAccounts:
    """Open streams, other open files and blocked reads per uid, checked against the limits.

    `limits` is the `[mount]` section (`mlfs.config.MountConfig`).  FUSE-free:
    the adapter calls `open_stream`/`close_stream` and `open_handle`/
    `close_handle` from open and release, and `start_wait`/`end_wait` around a
    read that waits.
    """

    def __init__(self, limits) -> None:
        self.limits = limits
        self.streams = OpenQuota("events files", "events_streams_per_uid", "events_streams")
        self.handles = OpenQuota("files of the mount", "handles_per_uid", "handles")
        self._blocked: collections.Counter[int] = collections.Counter()
        self.other_blocked = 0
        self.blocked = 0  # every uid's, root's included
        self.refused_reads = 0

    @property
    def refused_opens(self) -> int:
        """Opens of `events` files refused."""
        return self.streams.refused

    @property
    def refused_handles(self) -> int:
        """Opens of other files refused."""
        return self.handles.refused

    def open_handle(self, uid: int) -> None:
        """Count an open of an attribute or portion, or refuse it (EMFILE / ENFILE)."""
        self.handles.open(uid, self.limits.handles_per_uid, self.limits.handles)

    def close_handle(self, uid: int) -> None:
        self.handles.close(uid)

    def open_stream(self, uid: int) -> None:
        self.streams.open(uid, self.limits.events_streams_per_uid, self.limits.events_streams)

    def close_stream(self, uid: int) -> None:
        self.streams.close(uid)

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
        return ReaderStats(self.streams.count(), self.blocked, self.refused_opens,
                           self.refused_reads)


def _decrement(counter: collections.Counter[int], key: int) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]  # a uid with nothing open costs nothing
