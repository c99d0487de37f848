"""The event bus: one global sequence, shared bounded logs, a cursor per reader.

Producers (the tick loop, control writes) never block on a reader and never
do work per reader that is not waiting: each event is appended once to the
global log and once to its subsystem's log, fixed-size rings shared by every
reader, and only readers blocked or polling on that log are woken.  A reader
(one open of an `events` file) is a cursor into one log starting at "now".

A reader that falls more than a log's capacity behind loses the oldest
events it has not read, as /dev/kmsg readers do: its next read starts with
one `overflow` line saying how many events of its stream it missed (and the
seq of the last one), then the oldest events still kept.

Why shared logs rather than a queue per reader: with a queue per reader, an
opened-but-unread `events` file kept up to `capacity` lines of its own, and
every event was copied into every queue.  10,000 unread streams cost the
daemon 160 MB that was never given back and raised root's `recommend` p50
from 1.3 to 20 ms (issue 10); a cursor costs the same whether it is read or
not, and publishing costs nothing per idle reader.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable

from mlfs.base.clock import rfc3339


class _Log:
    """A ring of the last `capacity` encoded lines of one stream.

    Entries are numbered from 0 for the life of the bus; a cursor is such a
    number, so "how many did I miss" is a subtraction.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: list[tuple[int, bytes, bool]] = []
        self.end = 0  # the number the next entry gets
        self.dropped_seq = 0  # seq of the newest entry overwritten so far
        #: subscribers with a waker registered (blocked in read or polling)
        self.waiting: set[Subscriber] = set()

    @property
    def start(self) -> int:
        """Number of the oldest entry still kept."""
        return max(0, self.end - self.capacity)

    def append(self, seq: int, line: bytes, private: bool = False) -> None:
        if len(self._slots) < self.capacity:
            self._slots.append((seq, line, private))
        else:
            slot = self.end % self.capacity
            self.dropped_seq = self._slots[slot][0]
            self._slots[slot] = (seq, line, private)
        self.end += 1

    def line(self, number: int) -> bytes:
        return self._slots[number % self.capacity][1]

    def private(self, number: int) -> bool:
        return self._slots[number % self.capacity][2]

    def wake(self) -> None:
        waiting, self.waiting = self.waiting, set()
        for sub in waiting:
            sub._wake()


class Subscriber:
    """One reader's cursor into a shared log."""

    def __init__(self, bus: EventBus, subsystem: str | None, log: _Log,
                 private_ok: bool = True) -> None:
        self._bus = bus
        self._log = log
        self.subsystem = subsystem
        #: whether this reader may read the private subsystems' data (root or the
        #: mount's group): their events (a `report` with its title) are skipped otherwise
        self.private_ok = private_ok
        self.next = log.end
        #: the rest of a line a short read(2) took only the start of
        self.partial = b""
        self.closed = False
        #: one-shot callbacks run (from the producer) when something becomes
        #: readable; registered with `wait_with` by a reader about to wait
        self.wakers: list[Callable[[], None]] = []

    @property
    def lost(self) -> int:
        """Events of this stream overwritten before this reader got them."""
        return max(0, self._log.start - self.next)

    def wait_with(self, waker: Callable[[], None]) -> None:
        """Run `waker` once, at the next event of this stream (or at close)."""
        self.wakers.append(waker)
        if self.closed:
            self._wake()
        else:
            self._log.waiting.add(self)

    def cancel_wait(self, waker: Callable[[], None]) -> None:
        try:
            self.wakers.remove(waker)
        except ValueError:
            pass
        if not self.wakers:
            self._log.waiting.discard(self)

    def _wake(self) -> None:
        wakers, self.wakers = self.wakers, []
        self._log.waiting.discard(self)
        for waker in wakers:
            waker()

    def ready(self) -> bool:
        return self.has_data() or self.closed

    def has_data(self) -> bool:
        self._skip_hidden()
        return bool(self.partial) or self.next < self._log.end

    def _skip_hidden(self) -> None:
        """Move past the events this reader may not see (so it is not woken for them)."""
        if self.private_ok:
            return
        log = self._log
        while log.start <= self.next < log.end and log.private(self.next):
            self.next += 1

    def take(self, max_bytes: int) -> bytes:
        """At most `max_bytes`: whole lines when they fit, else the start of one line.

        A reader with a buffer smaller than the next line (a pipe-like
        `read(fd, 16)`) gets the line in pieces; the reply is never longer
        than the kernel asked for (that fails the whole read with EIO).
        """
        max_bytes = max(1, max_bytes)
        log = self._log
        out: list[bytes] = []
        size = 0
        if self.partial:
            out.append(self.partial)
            size += len(self.partial)
            self.partial = b""
        lost = self.lost
        if lost and (not out or size < max_bytes):
            marker = self._bus.encode(
                {
                    "seq": log.dropped_seq,
                    "ts": rfc3339(),
                    "subsystem": self.subsystem,
                    "event": "overflow",
                    "lost": lost,
                }
            )
            self.next = log.start
            out.append(marker)
            size += len(marker)
        # (when a partial line filled the read, the marker waits for the next
        # one and so do the lines: the ones before log.start are gone)
        while log.start <= self.next < log.end:
            if not self.private_ok and log.private(self.next):
                self.next += 1
                continue
            line = log.line(self.next)
            if out and size + len(line) > max_bytes:
                break
            out.append(line)
            size += len(line)
            self.next += 1
        data = b"".join(out)
        if len(data) > max_bytes:
            data, self.partial = data[:max_bytes], data[max_bytes:]
        return data

    def close(self) -> None:
        """Shutdown: wake the reader so it can answer end of file."""
        self.closed = True
        self._wake()

    def unsubscribe(self) -> None:
        self._bus.unsubscribe(self)


class EventBus:
    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self.seq = 0
        self.published = 0
        self.by_kind: collections.Counter[str] = collections.Counter()
        self._logs: dict[str | None, _Log] = {None: _Log(capacity)}
        self._subscribers: set[Subscriber] = set()
        self.closed = False

    @staticmethod
    def encode(event: dict) -> bytes:
        return (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()

    def _log(self, subsystem: str | None) -> _Log:
        log = self._logs.get(subsystem)
        if log is None:
            log = self._logs[subsystem] = _Log(self.capacity)
        return log

    def subscribe(self, subsystem: str | None = None, private_ok: bool = True) -> Subscriber:
        """A reader from now on; `private_ok` False: one that may not read the private
        subsystems' files, so it never gets their private events either (red team K13:
        `report` events with their titles reached users outside the mount's group)."""
        sub = Subscriber(self, subsystem, self._log(subsystem), private_ok)
        if self.closed:
            sub.closed = True
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)
        sub._log.waiting.discard(sub)
        sub.wakers.clear()
        sub._log, sub.next, sub.partial = _Log(1), 0, b""  # sees nothing any more

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, subsystem: str | None, event: str, *, private: bool = False,
                **fields: object) -> dict:
        """Append one event to the global log and its subsystem's; never blocks.
        `private`: only readers with `private_ok` get it."""
        self.seq += 1
        record = {"seq": self.seq, "ts": rfc3339(), "subsystem": subsystem, "event": event}
        record.update(fields)
        line = self.encode(record)
        self.published += 1
        self.by_kind[event] += 1
        logs = [self._logs[None]]
        if subsystem is not None:
            logs.append(self._log(subsystem))
        for log in logs:
            log.append(self.seq, line, private)
            log.wake()
        return record

    def close(self) -> None:
        self.closed = True
        for sub in list(self._subscribers):
            sub.close()

    def close_subsystem(self, subsystem: str) -> None:
        """An unloaded subsystem: its readers get what is left, then end of file.

        Its log is dropped, so the same name loaded again starts a fresh
        stream (an old reader's cursor never meets the new one's numbers).
        """
        for sub in list(self._subscribers):
            if sub.subsystem == subsystem:
                sub.close()
        self._logs.pop(subsystem, None)
