"""When the knob trainer refits: every 200 new rows, or sooner on slow ticks."""

from __future__ import annotations

FIT_MIN_ROWS = 200  # new rows before a (re)fit
FIT_MIN_SECONDS = 2.0
#: on slow ticks 200 rows take minutes (a real device's 1 s tick: one fit in the 240 s a
#: writeback run trains, and that one without a policy; docs/results/against-fixed.md),
#: so a refit also comes this long after the last one, given this many new rows
FIT_SLOW_SECONDS = 30.0
FIT_SLOW_ROWS = 30


def fit_due(new_rows: int, since_fit: float) -> bool:
    """Whether the trainer refits now: `FIT_MIN_ROWS` new rows (the simulator's 10 s at
    0.05 s ticks), or `FIT_SLOW_ROWS` of them `FIT_SLOW_SECONDS` after the last fit
    (slow ticks), never twice within `FIT_MIN_SECONDS`."""
    if since_fit < FIT_MIN_SECONDS:
        return False
    return new_rows >= FIT_MIN_ROWS or (new_rows >= FIT_SLOW_ROWS
                                        and since_fit >= FIT_SLOW_SECONDS)
