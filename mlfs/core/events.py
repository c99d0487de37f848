"""The event bus: one global sequence, many bounded subscriber queues.

Producers (the tick loop, control writes) never block on a reader: each
subscriber has a bounded queue, and when it is full further events are counted
as lost and the reader gets one `overflow` line saying how many, before the
next events it does get.  Each open of an `events` file is one subscriber
whose cursor starts at "now".
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable

from .clock import rfc3339


class Subscriber:
    """One reader's cursor: a bounded queue of encoded lines."""

    def __init__(self, bus: EventBus, subsystem: str | None, capacity: int) -> None:
        self._bus = bus
        self.subsystem = subsystem
        self.capacity = capacity
        self.lines: collections.deque[bytes] = collections.deque()
        #: the rest of a line a short read(2) took only the start of
        self.partial = b""
        self.lost = 0
        self.lost_last_seq = 0
        self.closed = False
        #: called (from the producer) whenever something becomes readable
        self.wakers: list[Callable[[], None]] = []

    def offer(self, seq: int, line: bytes) -> None:
        if len(self.lines) >= self.capacity:
            self.lost += 1
            self.lost_last_seq = seq
        else:
            self.lines.append(line)
        self._wake()

    def _wake(self) -> None:
        for waker in list(self.wakers):
            waker()

    def ready(self) -> bool:
        return self.has_data() or self.closed

    def has_data(self) -> bool:
        return bool(self.partial) or bool(self.lines) or self.lost > 0

    def take(self, max_bytes: int) -> bytes:
        """At most `max_bytes`: whole lines when they fit, else the start of one line.

        A reader with a buffer smaller than the next line (a pipe-like
        `read(fd, 16)`) gets the line in pieces; the reply is never longer
        than the kernel asked for (that fails the whole read with EIO).
        """
        max_bytes = max(1, max_bytes)
        out: list[bytes] = []
        size = 0
        if self.partial:
            out.append(self.partial)
            size += len(self.partial)
            self.partial = b""
        if self.lost and (not out or size < max_bytes):
            marker = self._bus.encode(
                {
                    "seq": self.lost_last_seq,
                    "ts": rfc3339(),
                    "subsystem": self.subsystem,
                    "event": "overflow",
                    "lost": self.lost,
                }
            )
            self.lost = 0
            out.append(marker)
            size += len(marker)
        while self.lines and (not out or size + len(self.lines[0]) <= max_bytes):
            line = self.lines.popleft()
            out.append(line)
            size += len(line)
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
        self._subscribers: set[Subscriber] = set()
        self.closed = False

    @staticmethod
    def encode(event: dict) -> bytes:
        return (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()

    def subscribe(self, subsystem: str | None = None) -> Subscriber:
        sub = Subscriber(self, subsystem, self.capacity)
        if self.closed:
            sub.closed = True
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, subsystem: str | None, event: str, **fields: object) -> dict:
        """Send one event to every matching subscriber; never blocks."""
        self.seq += 1
        record = {"seq": self.seq, "ts": rfc3339(), "subsystem": subsystem, "event": event}
        record.update(fields)
        line = self.encode(record)
        self.published += 1
        self.by_kind[event] += 1
        for sub in list(self._subscribers):
            if sub.subsystem is None or sub.subsystem == subsystem:
                sub.offer(self.seq, line)
        return record

    def close(self) -> None:
        self.closed = True
        for sub in list(self._subscribers):
            sub.close()
