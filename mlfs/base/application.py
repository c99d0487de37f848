"""An objective the application measures: its figures, the ticks they cover, held rows.

A subsystem whose objective is `mlfs.abi.APPLICATION` ("application", any
backend: `objective = "application"` in its `[[subsystem]]` table) is judged
only by what the application writes to `objective`.  The application knows its
own figure later than the tick ends, and at its own cadence (fio reports once a
second, a 0.5 s tick runs twice in that time), so a write may say which past
window it covers:

    echo "123.4 window=1.0" > MOUNT/<subsystem>/objective

The figure is the objective of every tick whose midpoint lies in the last
`window` seconds before the write (a bare number: one tick, `tick_seconds`); a
tick is taken to have measured the `tick_seconds` before it ended.  A
tick's dataset row and its models' efficiency are held until a figure covers it
or `wait_seconds` pass after its end; then it is recorded, with a missing (NaN)
objective if nothing covered it -- never filled with the backend's own counter,
which is another quantity in other units (issue 33).  Rows are released in tick
order, so the dataset stays in tick order.  A held row lives in memory only: a
crash loses at most `wait_seconds` of held ticks (their tick numbers stay
unused), which docs/ABI.md states.

Pure: time comes from the caller's clock, nothing here touches a store.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

from mlfs.base.errors import invalid
from mlfs.base.text import decode_text, parse_float

#: the longest window a figure may cover (an hour; a held row waits at most this too)
MAX_WINDOW_SECONDS = 3600.0
#: figures remembered for ticks still running when they arrive
KEPT_FIGURES = 16
#: ticks held at most (beyond: the oldest is released as missing, so memory is bounded)
MAX_HELD_TICKS = 100_000


@dataclass(frozen=True)
class Figure:
    """One write: `value` covers the midpoints in (`at` - `window`, `at`]."""

    value: float
    at: float
    window: float | None  # None: the last tick's length

    def covers(self, midpoint: float, tick_seconds: float) -> bool:
        return self.at - self.span(tick_seconds) < midpoint <= self.at

    def span(self, tick_seconds: float) -> float:
        return self.window if self.window is not None else tick_seconds


def parse_figure(data: bytes, at: float) -> Figure:
    """`<number> [window=<seconds>]`, else EINVAL with the reason."""
    words = decode_text(data).split()
    if not 1 <= len(words) <= 2:
        raise invalid("objective takes a number and optionally window=SECONDS")
    value = parse_float(words[0], "objective")
    window = None
    if len(words) == 2:
        key, sep, text = words[1].partition("=")
        if key != "window" or not sep:
            raise invalid(f"objective: {words[1]!r} is not window=SECONDS")
        window = parse_float(text, "window")
        if not 0 < window <= MAX_WINDOW_SECONDS:
            raise invalid(f"window {window:g} s is outside (0, {MAX_WINDOW_SECONDS:g}]")
    return Figure(value, at, window)


@dataclass
class HeldTick:
    """A finished tick waiting for its figure; `payload` is the runtime's to record."""

    tick: int
    ended: float
    midpoint: float
    payload: Any
    objective: float = math.nan
    covered: bool = False


@dataclass
class ApplicationObjective:
    """The figures written and the ticks held for them (`wait_seconds` at most)."""

    wait_seconds: float
    tick_seconds: float
    figures: collections.deque[Figure] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_FIGURES))
    held: collections.deque[HeldTick] = field(default_factory=collections.deque)
    #: figures that covered no tick (every tick of their window already released)
    late_figures: int = 0
    #: ticks released with no figure (a missing objective)
    missing: int = 0
    #: the midpoint of the newest tick released
    released_midpoint: float = -math.inf

    def write(self, figure: Figure) -> None:
        """A figure arrives: it covers the held ticks in its window (the first wins)."""
        self.figures.append(figure)
        hit = False
        for held in self.held:
            if not held.covered and figure.covers(held.midpoint, self.tick_seconds):
                held.objective, held.covered, hit = figure.value, True, True
        if not hit and figure.at - figure.span(self.tick_seconds) < self.released_midpoint:
            self.late_figures += 1  # its window reached ticks already recorded

    def hold(self, tick: int, ended: float, payload: Any) -> None:
        """A finished tick: covered at once by a figure already written, or held."""
        held = HeldTick(tick, ended, ended - self.tick_seconds / 2, payload)
        for figure in reversed(self.figures):  # the newest figure that covers it
            if figure.covers(held.midpoint, self.tick_seconds):
                held.objective, held.covered = figure.value, True
                break
        self.held.append(held)

    def release(self, now: float, everything: bool = False) -> list[HeldTick]:
        """The ticks to record now, in tick order: from the oldest, each covered one
        and each uncovered one older than `wait_seconds` (all of them: `everything`)."""
        out = []
        while self.held:
            head = self.held[0]
            overdue = now - head.ended >= self.wait_seconds
            if not (head.covered or overdue or everything
                    or len(self.held) > MAX_HELD_TICKS):
                break
            self.held.popleft()
            if not head.covered:
                self.missing += 1
            self.released_midpoint = head.midpoint
            out.append(head)
        return out
