"""The one rule for "overall" (issue 33, item 1): tests/bench/scoring.py.

Equal work per phase is the harmonic mean of the per-phase speed-ups; the
arithmetic mean (what fio_win scored before) and the equal-time figure are
different quantities and must not be what `overall` returns.
"""

from __future__ import annotations

import math

import pytest

from tests.bench import scoring
from tests.bench.fio_win import score_conditions, summarize_run
from tests.bench.sweep import analyse
from tests.bench.win_harness import MIB


def test_overall_is_the_harmonic_mean_of_the_phase_ratios() -> None:
    assert scoring.overall({"a": 2.0, "b": 1.0}) == pytest.approx(4 / 3)
    assert scoring.overall([2.0, 1.0]) == pytest.approx(4 / 3)
    # not the arithmetic mean (1.5): a job with one unit of work in each phase takes
    # 1/2 + 1 = 1.5 time units against 2 under the default
    assert scoring.overall({"a": 2.0, "b": 1.0}) != pytest.approx(1.5)


def test_overall_is_zero_when_a_phase_did_no_work_and_nan_without_phases() -> None:
    assert scoring.overall({"a": 2.0, "b": 0.0}) == 0.0
    assert math.isnan(scoring.overall({}))


def test_oracle_share_is_the_fraction_of_the_oracles_gain() -> None:
    assert scoring.oracle_share(1.1, 1.2) == pytest.approx(0.5)
    assert scoring.oracle_share(0.9, 1.2) == pytest.approx(-0.5)
    assert math.isnan(scoring.oracle_share(1.1, 1.0))


def test_equal_time_weighs_phases_by_their_rates() -> None:
    # a fast phase (1000 MiB/s) x1.0, a slow one (100) x2.0: equal time 1200 / 1100
    assert scoring.equal_time({"f": 1000, "s": 200}, {"f": 1000, "s": 100}) == \
        pytest.approx(1200 / 1100)


def test_fio_win_scores_every_condition_by_the_one_rule_against_the_interleaved_default(
        ) -> None:
    runs = {"default": summarize_run({"c": [400 * MIB, 1.0], "t": [2000 * MIB, 1.0]}),
            "mlfs": summarize_run({"c": [600 * MIB, 1.0], "t": [1800 * MIB, 1.0]})}
    got = score_conditions(runs, ("c", "t"))
    assert got["default"]["overall"] == pytest.approx(1.0)
    assert got["mlfs"]["c"] == pytest.approx(1.5) and got["mlfs"]["t"] == pytest.approx(0.9)
    assert got["mlfs"]["overall"] == pytest.approx(scoring.overall([1.5, 0.9]))
    assert got["mlfs"]["equal_time"] == pytest.approx(2400 / 2400)


def test_the_sweep_picks_best_static_and_oracle_by_the_one_rule() -> None:
    result = {"phases": ("a", "b"),
              "values": {"default": {"a": [100.0], "b": [100.0]},
                         "x": {"a": [200.0], "b": [60.0]},
                         "y": {"a": [110.0], "b": [105.0]}}}
    got = analyse(result)
    # x: arithmetic 1.30 but harmonic 0.857; y: 1.075 either way
    assert got["best_static"] == "y"
    assert got["ratio"]["x"]["overall"] == pytest.approx(scoring.overall([2.0, 0.6]))
    assert got["oracle_overall"] == pytest.approx(scoring.overall([2.0, 1.05]))
