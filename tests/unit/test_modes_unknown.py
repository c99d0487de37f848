"""No demotion or collapse on a guess (issue 33 item 3), in virtual time.

A carry-over knob (settle_ticks 5: 10-tick episodes) on a workload whose
phases (2-6 ticks, a 40-fold level change, as fio's stream writer against
db-commit) are shorter than the carry-over: every pair straddles phases, the
point estimate is no measurement: it must read unknown, and the mode machine
must not collapse or demote the model (truly 1.2 times better) on it.  On
287d42b it collapsed it (efficiency 0.2 and below, then 19.5 after the cool-down).
"""

from __future__ import annotations

import collections
import math
import random

from mlfs.abi import Knob, Objective, Sample, Subsystem
from mlfs.base.sequential import MIN_EPISODES, boundary
from mlfs.config import parse_config
from mlfs.core.models.efficiency import EfficiencyStats
from mlfs.core.models.modes import efficiency_interval, transition
from mlfs.core.mount.exchange import Exchange

MODES = parse_config("", "defaults").modes


class ShortPhases(Subsystem):
    """x != 0 is 1.2 times better, felt `lag` ticks late; phases of 2-6 ticks."""

    name = "test.short"
    backend = "test"
    description = "phases shorter than the knob's carry-over"
    tick_seconds = 1.0
    objective = Objective("throughput", "MB/s", "max")
    features = {"load": "float64"}

    def __init__(self, seed: int, lag: int = 5) -> None:
        self.knobs = {"x": Knob("x", "int", 0, 0, 8, settle_ticks=lag)}
        self.felt = collections.deque([0] * lag, maxlen=lag + 1)
        self.rng = random.Random(seed)
        self.level, self.left = 100.0, 0

    def step(self, knobs):
        if self.left <= 0:
            self.level = 2.5 if self.level == 100.0 else 100.0
            self.left = self.rng.randint(2, 6)
        self.left -= 1
        self.felt.append(knobs["x"])
        value = self.level * (1.2 if self.felt[0] != 0 else 1.0)
        return Sample({"load": 1.0}, value * (1 + self.rng.gauss(0, 0.02)))


def test_phases_shorter_than_the_carry_over_never_collapse_or_demote_a_better_model(tmp_path):
    for seed in range(3):
        config = parse_config("[modes]\nsilence_seconds = 1e9\n", "test")
        rt = Exchange(config, tmp_path / str(seed), [ShortPhases(seed)]).runtimes["test.short"]
        try:
            proxy = rt.create_model("m")
            proxy.start()
            proxy.recommend(b"x=1\n")
            for _ in range(3000):
                rt.tick()
            moves = [(mode, why) for _, mode, why in proxy.mode_history]
            assert not [m for m in moves if m[0] in ("emergency", "learning")], (seed, moves)
            assert proxy.ml_ticks > 0.05 * 3000, "the model kept at least the learning share"
            assert not efficiency_interval(proxy.window.stats()).known, "reads unknown"
        finally:
            rt.close()


def stats(efficiency: float, confidence: float, episodes: int) -> EfficiencyStats:
    return EfficiencyStats(efficiency, confidence, 100, 100, 50.0, 0, episodes)


def test_an_estimate_on_too_few_episodes_or_without_spread_is_unknown_and_moves_nothing():
    for mode in ("learning", "collaboration", "recommendation"):
        assert transition(mode, stats(0.01, -50.0, MIN_EPISODES - 1), MODES) is None
        assert transition(mode, stats(0.01, math.nan, 40), MODES) is None
        assert transition(mode, stats(2.0, math.nan, 40), MODES) is None
        assert transition(mode, stats(math.nan, math.nan, 0), MODES) is None
    assert not efficiency_interval(stats(0.01, math.nan, 40)).known


def test_collapse_needs_the_whole_interval_below_collapse_below():
    # se 0.1 at 0.2 over 40 episodes: the interval reaches above 0.3, no collapse
    wide = stats(0.2, (0.2 - 1) / 0.1, 40)
    assert transition("learning", wide, MODES) is None
    narrow = stats(0.2, (0.2 - 1) / 0.01, 40)
    switch = transition("learning", narrow, MODES)
    assert switch.mode == "emergency" and switch.cause == "collapse"


def test_promotion_and_demotion_need_the_interval_clear_of_one():
    se = 0.04
    n = 30
    half = boundary(n) * se
    assert transition("collaboration", stats(1.0 + half * 0.9, half * 0.9 / se, n), MODES) is None
    up = transition("collaboration", stats(1.0 + half * 1.1, half * 1.1 / se, n), MODES)
    assert up.mode == "recommendation"
    assert transition("recommendation", stats(1.0 - half * 0.9, -half * 0.9 / se, n),
                      MODES) is None
    down = transition("recommendation", stats(1.0 - half * 1.1, -half * 1.1 / se, n), MODES)
    assert down.mode == "learning"


def test_the_boundary_widens_slowly_with_the_episodes_as_a_mixture_martingale_allows():
    """The normal-mixture boundary: above a fixed 2.0 (the price of looking on every
    tick), finite, and growing like sqrt(log n) far past N0."""
    values = [boundary(n) for n in (4, 10, 40, 400, 4000)]
    assert all(2.0 < v < 6.0 for v in values)
    assert values[-1] > values[2]
