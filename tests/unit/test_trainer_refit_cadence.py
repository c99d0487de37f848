"""When the knob trainer refits (`trainers/knob/cadence.py`, `fit_due`)."""

from __future__ import annotations

from mlfs.trainers.knob.cadence import (
    FIT_MIN_ROWS,
    FIT_MIN_SECONDS,
    FIT_SLOW_ROWS,
    FIT_SLOW_SECONDS,
    fit_due,
)


def fits_in(seconds: float, tick: float) -> int:
    """Refits over `seconds` of rows arriving one per `tick` seconds, checked each tick."""
    fits, rows, last = 0, 0, 0.0
    for step in range(1, int(seconds / tick) + 1):
        now, rows = step * tick, rows + 1
        if fit_due(rows, now - last):
            fits, rows, last = fits + 1, 0, now
    return fits


def test_one_second_ticks_refit_every_half_minute_not_every_200_rows():
    # a real device's 1 s ticks: the 240 s writeback training fitted once before
    assert fits_in(240, 1.0) == 240 // int(FIT_SLOW_SECONDS)
    assert fits_in(180, 1.0) >= 5


def test_the_simulators_fast_ticks_keep_the_200_row_cadence():
    assert fits_in(100, 0.05) == int(100 / 0.05) // FIT_MIN_ROWS


def test_never_twice_within_the_minimum_and_never_on_a_handful_of_rows():
    assert not fit_due(10 * FIT_MIN_ROWS, FIT_MIN_SECONDS / 2)
    assert not fit_due(FIT_SLOW_ROWS - 1, 10 * FIT_SLOW_SECONDS)
    assert fit_due(FIT_SLOW_ROWS, FIT_SLOW_SECONDS)
