"""The incumbent's bandit on synthetic paired data (mlfs/core/models/incumbent.py).

Pairs are fed as the proxy feeds them (`Incumbent.measured`: a setting, its
baseline, its ratio to the default, its tick, who chose it), in episodes of
consecutive ticks, with seeded noise; the level is a default tick's objective.
"""

from __future__ import annotations

import math
import random

from mlfs.base.sequential import Interval
from mlfs.config import parse_config
from mlfs.core.models.efficiency import EfficiencyStats
from mlfs.core.models.incumbent import TOLERANCE, Arm, Incumbent, Standing
from mlfs.core.models.modes import transition
from mlfs.core.models.safe_set import SafeSet

MODES = parse_config("", "defaults").modes
LEVEL = 100.0


def feed(incumbent: Incumbent, gains: dict[int, float], episodes: int, rng: random.Random,
         noise: float = 0.05, source: str = "recommendation", mode: str = "learning",
         start: int = 0, episode_ticks: int = 3) -> int:
    """`episodes` episodes per setting (knob_x = key), interleaved; returns the next tick."""
    tick = start
    for _ in range(episodes):
        for value, gain in gains.items():
            for _ in range(episode_ticks):
                ratio = gain * (1 + rng.gauss(0, noise))
                incumbent.measured({"knob_x": value}, LEVEL, ratio, tick, source, mode)
                tick += 1
            tick += 2  # a default episode between
    return tick


def fresh() -> Incumbent:
    safe = SafeSet()
    safe.default_tick(LEVEL)
    return Incumbent(safe, {"knob_x": "x"})


def test_the_bandit_finds_the_best_arm_on_paired_data():
    incumbent = fresh()
    feed(incumbent, {0: 1.0, 1: 1.08, 2: 1.25, 3: 1.18, 4: 0.7}, 30, random.Random(1))
    standing = incumbent.standing()
    assert standing.incumbent is not None
    assert standing.incumbent.knobs == {"x": 2}
    assert 1.2 < standing.estimate < 1.3
    # the clear losers are eliminated; the close second may still contend
    assert standing.contenders <= 2
    assert "x=2 x1.2" in incumbent.file_text()


def test_no_incumbent_without_evidence():
    incumbent = fresh()
    # one episode of a great-looking setting: not proven (too few episodes)
    feed(incumbent, {5: 1.6}, 1, random.Random(2))
    assert incumbent.standing().incumbent is None
    assert incumbent.standing().estimate == 1.0
    # a setting as good as the default, however often measured, is not an incumbent
    feed(incumbent, {6: 1.0}, 60, random.Random(3), start=100)
    assert incumbent.standing().incumbent is None
    assert incumbent.file_text().startswith("default x1.000\n")


def test_pairs_at_another_level_do_not_count():
    incumbent = fresh()
    feed(incumbent, {2: 1.3}, 20, random.Random(4))
    assert incumbent.standing().incumbent is not None
    incumbent.safe.default_tick(LEVEL * 3)  # another workload level: nothing measured there
    assert incumbent.standing().incumbent is None


def test_ties_go_to_the_incumbent():
    incumbent = fresh()
    rng = random.Random(5)
    feed(incumbent, {1: 1.2}, 20, rng)
    assert incumbent.standing().incumbent.knobs == {"x": 1}
    # a challenger as good (slightly better by chance) does not take its place
    feed(incumbent, {2: 1.21}, 40, rng, start=1000)
    assert incumbent.standing().incumbent.knobs == {"x": 1}
    # a clearly better one does
    feed(incumbent, {3: 1.5}, 20, rng, start=2000)
    assert incumbent.standing().incumbent.knobs == {"x": 3}


def test_the_policy_is_proven_only_within_the_tolerance():
    incumbent = fresh()
    rng = random.Random(6)
    feed(incumbent, {2: 1.3}, 20, rng)
    assert not incumbent.standing().policy_proven  # the policy has no ticks here yet
    # a policy that ties the default's beater at x1.1: above the default, below the incumbent
    feed(incumbent, {1: 1.1}, 30, rng, source="policy", start=1000)
    standing = incumbent.standing()
    assert standing.policy.known and standing.policy.lower > 1.0
    assert not standing.policy_proven
    assert math.isclose(standing.vs_incumbent, 1.1 / 1.3, rel_tol=0.03)
    # recommendation runs the incumbent meanwhile, never the unproven policy
    assert incumbent.choose("recommendation", ["x"]) == {"x": 2}
    assert incumbent.choose("collaboration", ["x"]) is None
    # the same policy choosing the incumbent's setting ties it: proven within the tolerance
    other = fresh()
    feed(other, {2: 1.3}, 20, rng)
    feed(other, {2: 1.3}, 60, rng, source="policy", start=1000, noise=0.02)
    assert other.standing().policy_proven
    assert other.choose("recommendation", ["x"]) is None


def test_learning_recommendations_are_explorations_not_the_model():
    incumbent = fresh()
    feed(incumbent, {2: 1.3}, 20, random.Random(7), source="recommendation", mode="learning")
    assert not incumbent.standing().policy.known
    feed(incumbent, {2: 1.3}, 20, random.Random(8), source="recommendation",
         mode="collaboration", start=1000)
    assert incumbent.standing().policy.known


def test_the_bandit_probes_undecided_arms_and_holds_one_for_an_episode():
    incumbent = fresh()
    rng = random.Random(9)
    feed(incumbent, {1: 1.3}, 20, rng)
    feed(incumbent, {2: 1.25}, 2, rng, start=1000)  # undecided: two episodes
    feed(incumbent, {3: 0.5}, 20, rng, start=2000)  # eliminated
    assert incumbent.next_arm() == {"x": 2}
    assert incumbent.decide(5000, "learning", ["x"], has_policy=False) == {"x": 2}
    feed(incumbent, {2: 1.0}, 5, rng, start=3000)  # the probe's arm changes standing...
    # ...but the episode under way keeps its setting
    assert incumbent.decide(5001, "learning", ["x"], has_policy=False) == {"x": 2}
    # collaboration is not probed
    assert incumbent.decide(5003, "collaboration", ["x"], has_policy=False) is None


def test_with_a_policy_in_learning_the_bandit_probes_every_other_episode():
    """A policy uploaded within seconds took every episode from the bandit, and its arms
    grew only from the trainer's explorations (issue 53's read-ahead runs): with a policy
    the ML episodes alternate, the policy's and the bandit's, a whole episode each."""
    incumbent = fresh()
    rng = random.Random(9)
    feed(incumbent, {2: 1.25}, 2, rng)  # undecided: two episodes
    episodes = [[incumbent.decide(t, "learning", ["x"], has_policy=True)
                 for t in (start, start + 1)] for start in range(100, 160, 10)]
    for ticks in episodes:
        assert ticks[0] == ticks[1], "an episode runs one setting throughout"
    runs = [ticks[0] for ticks in episodes]
    assert runs[::2] in ([None] * 3, [{"x": 2}] * 3)
    assert {str(r) for r in runs[::2]} != {str(r) for r in runs[1::2]}
    assert runs.count(None) == 3
    # with every arm decided there is nothing to probe: the policy runs every episode
    decided = fresh()
    feed(decided, {2: 1.3, 3: 0.5}, 20, rng)
    assert decided.next_arm() is None
    assert all(decided.decide(t, "learning", ["x"], has_policy=True) is None
               for t in range(200, 260, 10))


def _stats(efficiency: float, confidence: float) -> EfficiencyStats:
    return EfficiencyStats(efficiency, confidence, 400, 400, LEVEL, 0, 200, 0)


def _standing(incumbent: float | None, policy: Interval) -> Standing:
    arm = None if incumbent is None else Arm(
        {"x": 2}, Interval(incumbent, incumbent - 0.05, incumbent + 0.05, 20, True))
    return Standing(arm, policy, 1)


def test_promotion_needs_the_default_and_the_incumbent():
    good = _stats(1.2, 20.0)  # far above the default
    assert transition("collaboration", good, MODES).mode == "recommendation"
    # the default as incumbent: the default's bar alone
    unknown = Interval(math.nan, -math.inf, math.inf, 0, False)
    assert transition("collaboration", good, MODES,
                      lambda: _standing(None, unknown)).mode == "recommendation"
    # a proven incumbent the policy does not reach: no promotion (the incumbent wins)
    below = Interval(1.2, 1.15, 1.25, 50, True)
    assert transition("collaboration", good, MODES, lambda: _standing(1.3, below)) is None
    assert transition("collaboration", good, MODES, lambda: _standing(1.3, unknown)) is None
    # within the tolerance: promoted, the figure stated in the why
    near = Interval(1.3, 1.3 * (1 - TOLERANCE) + 0.001, 1.33, 50, True)
    switch = transition("collaboration", good, MODES, lambda: _standing(1.3, near))
    assert switch.mode == "recommendation" and "the incumbent" in switch.why
    # the incumbent never blocks collaboration, which is judged against the default
    assert transition("learning", good, MODES,
                      lambda: _standing(1.3, below)).mode == "collaboration"


def test_a_phase_change_seen_on_the_incumbents_tick_hands_over_until_the_next_default():
    incumbent = fresh()
    feed(incumbent, {2: 1.3}, 20, random.Random(10))
    assert incumbent.choose("recommendation", ["x"]) == {"x": 2}
    incumbent.ran("incumbent", LEVEL * 1.3 * 1.05)  # as expected at this level: kept
    assert incumbent.choose("recommendation", ["x"]) == {"x": 2}
    incumbent.ran("policy", LEVEL * 5)  # not the incumbent's tick: says nothing of it
    assert incumbent.choose("recommendation", ["x"]) == {"x": 2}
    incumbent.ran("incumbent", LEVEL * 1.3 * 3)  # the workload moved since the default tick
    assert incumbent.choose("recommendation", ["x"]) is None
    incumbent.safe.default_tick(LEVEL * 1.02)  # the next default tick: this level again
    assert incumbent.choose("recommendation", ["x"]) == {"x": 2}


def test_an_undecided_policy_takes_turns_with_the_incumbent_a_worse_one_does_not():
    rng = random.Random(11)
    undecided = fresh()
    feed(undecided, {2: 1.3}, 30, rng, noise=0.02)
    assert undecided.standing().incumbent.knobs == {"x": 2}  # standing: it keeps ties
    feed(undecided, {1: 1.28}, 4, rng, source="policy", start=1000, noise=0.1)
    policy = undecided.standing().policy
    assert policy.known and policy.lower < 1.3 * (1 - TOLERANCE) < 1.3 < policy.upper
    turns = [undecided.choose("recommendation", ["x"], tick) for tick in range(20)]
    assert turns.count(None) == 10 and turns.count({"x": 2}) == 10
    # no policy to give turns to: the incumbent runs every tick
    assert all(undecided.choose("recommendation", ["x"], tick, has_policy=False) == {"x": 2}
               for tick in range(20))
    worse = fresh()
    feed(worse, {2: 1.3}, 30, rng, noise=0.02)
    feed(worse, {1: 1.0}, 30, rng, source="policy", start=1000, noise=0.02)
    assert worse.standing().policy.upper < 1.3
    assert all(worse.choose("recommendation", ["x"], tick) == {"x": 2} for tick in range(20))


def test_where_no_fixed_setting_beats_the_default_a_policy_proven_worse_gives_way_to_it():
    """Recommendation never runs a policy proven worse than the default at this level
    ({} is the default's turn)."""
    rng = random.Random(12)
    worse = fresh()
    feed(worse, {0: 0.05}, 30, rng, source="policy", mode="collaboration", noise=0.02)
    standing = worse.standing()
    assert standing.incumbent is None and standing.policy.upper < 1.0
    assert standing.policy_proven  # promotion's bar: the mode machine's, over all levels
    assert all(worse.choose("recommendation", ["x"], tick) == {} for tick in range(20))
    assert worse.decide(5, "recommendation", ["x"], has_policy=True) == {}
    # without evidence here, or undecided, the policy decides (the mode machine's bar)
    undecided = fresh()
    feed(undecided, {1: 1.0}, 3, rng, source="policy", mode="collaboration", noise=0.1)
    assert not undecided.standing().policy_worse_here
    assert all(undecided.choose("recommendation", ["x"], tick) is None for tick in range(20))
    # proven at least as good as the default here: the policy decides every tick
    good = fresh()
    feed(good, {1: 1.2}, 30, rng, source="policy", mode="collaboration", noise=0.02)
    assert good.standing().policy_holds_here
    assert all(good.choose("recommendation", ["x"], tick) is None for tick in range(20))


def test_pinned_in_recommendation_a_policy_decides_only_where_it_is_proven():
    """A pin is no promotion: without the mode machine's bar behind it, a policy runs
    only where its own interval here holds against the incumbent; elsewhere the
    incumbent runs at every tick, the default included ({}), never in turns."""
    rng = random.Random(14)
    unproven = fresh()
    feed(unproven, {1: 1.0}, 3, rng, source="policy", mode="learning", noise=0.1)
    assert not unproven.standing().policy_worse_here  # promoted, it would decide
    assert all(unproven.choose("recommendation", ["x"], tick) is None for tick in range(20))
    assert all(unproven.choose("recommendation", ["x"], tick, promoted=False) == {}
               for tick in range(20))
    assert unproven.decide(5, "recommendation", ["x"], True, promoted=False) == {}
    # a fixed setting proven here: it runs instead of the undecided policy, every tick
    fixed = fresh()
    feed(fixed, {2: 1.3}, 30, rng, noise=0.02)
    feed(fixed, {1: 1.3}, 2, rng, source="policy", start=1000, noise=0.2)
    assert all(fixed.choose("recommendation", ["x"], tick, promoted=False) == {"x": 2}
               for tick in range(10))  # within LEVEL_AGE_TICKS of one level read
    # proven here: the policy decides, pinned or not
    good = fresh()
    feed(good, {1: 1.2}, 30, rng, source="policy", mode="collaboration", noise=0.02)
    assert good.standing().policy_holds_here
    assert all(good.choose("recommendation", ["x"], tick, promoted=False) is None
               for tick in range(20))
    # no policy: the incumbent (here the default)
    assert fresh().choose("recommendation", ["x"], 0, has_policy=False, promoted=False) == {}


def test_pinned_a_proven_policy_that_reads_off_its_level_hands_over_to_a_default_tick():
    """Pinned at `recommendation_probe` 0 the only default ticks are the ones the proxy
    runs itself: a policy proven on one phase (here x1.2 at level 100) whose tick reads
    far off level x estimate (the workload moved) gives way to a default tick, which
    reads the new level; there, unproven, the default runs; back at its level it decides.
    Promoted, the policy keeps deciding until the next default tick, as before."""
    rng = random.Random(15)
    good = fresh()
    feed(good, {1: 1.2}, 30, rng, source="policy", mode="collaboration", noise=0.02)
    assert good.choose("recommendation", ["x"], 0, promoted=False) is None
    good.ran("policy", 125.0, promoted=False)  # within x1.25 of 100 x 1.2: same level
    assert good.choose("recommendation", ["x"], 1, promoted=False) is None
    good.ran("policy", 40.0, promoted=True)  # promoted: not read for the level
    assert good.choose("recommendation", ["x"], 2, promoted=False) is None
    good.ran("policy", 40.0, promoted=False)
    assert good.choose("recommendation", ["x"], 3, promoted=False) == {}
    good.safe.default_tick(40.0)  # the default tick reads the new level: nothing proven
    assert good.choose("recommendation", ["x"], 4, promoted=False) == {}
    good.safe.default_tick(LEVEL)
    assert good.choose("recommendation", ["x"], 5, promoted=False) is None


def test_pinned_a_fixed_setting_runs_at_most_level_age_ticks_on_one_reading_of_the_level():
    """A setting that moves the objective a lot can read on the next phase what it read on
    its own (4 KiB of read-ahead, x3.2 on mmap, read the same on the scan after it), so
    nothing says the workload moved: pinned, the incumbent hands over to a default tick
    after LEVEL_AGE_TICKS ML ticks on one level read, until the level is read again."""
    from mlfs.core.models.incumbent import LEVEL_AGE_TICKS

    rng = random.Random(15)
    fixed = fresh()
    feed(fixed, {2: 1.3}, 30, rng, noise=0.02)
    start = 1000
    ran = [fixed.choose("recommendation", ["x"], start + t, has_policy=False,
                        promoted=False) for t in range(LEVEL_AGE_TICKS + 5)]
    assert ran[:LEVEL_AGE_TICKS] == [{"x": 2}] * LEVEL_AGE_TICKS
    assert ran[LEVEL_AGE_TICKS:] == [{}] * 5  # default ticks until the level is read
    fixed.safe.default_tick(LEVEL)  # the default tick read it: the incumbent again
    after = start + LEVEL_AGE_TICKS + 7
    assert fixed.choose("recommendation", ["x"], after, has_policy=False,
                        promoted=False) == {"x": 2}
    # promoted, the policy reads the tick's features: no age rule
    assert all(fixed.choose("recommendation", ["x"], start + t, has_policy=False) == {"x": 2}
               for t in range(3 * LEVEL_AGE_TICKS))
