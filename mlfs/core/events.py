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
        return bool(self.lines) or self.lost > 0 or self.closed

    def take(self, max_bytes: int) -> bytes:
        """Whole lines, at most `max_bytes` (at least one line if any is ready)."""
        out: list[bytes] = []
        size = 0
        if self.lost:
            marker = self._bus.encode(
                {
                    "seq": self.lost_last_seq,
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
        return b"".join(out)

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
