"""The trainer's schedule: what share of its ticks explores, as paced by its own rule."""

from __future__ import annotations

import numpy as np
import pytest
from mlfs.trainers.knob.learner import KnobLearner
from mlfs.trainers.schedule import TrainerSchedule

from mlfs.abi import Settling, episode_ticks
from tests.harness import INFO, make_dataset, phase_features


def explored_share(schedule: TrainerSchedule, mode: str, ticks: int) -> float:
    """Ticks a recommendation of the schedule's held, deciding as the worker and the
    learning bench decide (`ticks_to_next_decision`)."""
    rng = np.random.default_rng(3)
    explored = next_decision = 0
    for t in range(ticks):
        if t < next_decision:
            continue
        schedule.learner.note_features(t, phase_features("sequential", rng))
        steer = schedule.decide(mode, policy_live=True)
        next_decision = t + schedule.ticks_to_next_decision(steer)
        if steer is not None and steer.exploring:
            explored += min(steer.ttl, ticks - t)
    return explored / ticks


@pytest.fixture(scope="module")
def learner() -> KnobLearner:
    learner = KnobLearner(INFO)
    learner.add_dataset(make_dataset(3000, seed=5, explore_share=0.3))
    assert learner.fit()["fitted"] and learner.knob_aware
    return learner


def test_learning_explores_the_share_of_its_ticks_the_schedule_names(learner):
    """Once a policy runs, `exploration_rate` is the share of learning's ticks that
    explore, down to 20 %.  Drawn per decision with the share itself as the chance,
    an exploration held ten ticks and a tick left to the policy one: 71 % of the ticks
    explored at the floor (the efficiency that promotes measured the explorations)."""
    schedule = TrainerSchedule(learner, seed=1)
    rate = schedule.exploration_rate()
    assert rate == pytest.approx(0.2), "the learner's explored rows put it at the floor"
    share = explored_share(schedule, "learning", 20_000)
    assert share == pytest.approx(rate, abs=0.03), f"{share:.3f} of the ticks explored"


def test_after_a_promotion_about_three_percent_of_ticks_explore(learner):
    """In collaboration and recommendation a decision explores with a chance of 1 %
    (2 % while a neighbour of the best setting is unmeasured), for FALLBACK_TTL ticks:
    about 3 % of the ticks, as the learning bench measured them.  Paced by a whole ttl
    after each tick left to the policy, the worker explored a third of that."""
    schedule = TrainerSchedule(learner, seed=2)
    share = explored_share(schedule, "recommendation", 20_000)
    assert 0.02 <= share <= 0.07, f"{share:.3f} of the ticks explored"


def settled_rows(settle_ticks: int, ticks: list[int]) -> int:
    """Rows the fit keeps (`Settling`, the one rule for carry-over) of ticks run at
    these read_ahead_kb values, after a long stretch at the default."""
    settling = Settling({"read_ahead_kb": settle_ticks})
    for _ in range(settle_ticks + 1):
        settling({"read_ahead_kb": 128})
    return sum(not settling({"read_ahead_kb": value}) for value in ticks)


@pytest.mark.parametrize("settle_ticks", [0, 1, 5])
def test_one_exploration_covers_its_setting_even_with_one_tick_lost_to_the_default(
        settle_ticks):
    """Coverage asks each setting for rows in a kind of state before exploring past it
    (`KnobLearner.explore`).  One exploration of `learning_ttl` ticks must meet it with
    the rows the fit keeps, even when the learning share gave one of its ticks to the
    default: asked for half the ticks, a knob settling 5 of 10 had to get every
    settled row, and the dirty ratios' 2 % stayed uncovered after five explorations."""
    info = {**INFO, "knobs": {"read_ahead_kb": {**INFO["knobs"]["read_ahead_kb"],
                                                "settle_ticks": settle_ticks}}}
    schedule = TrainerSchedule(KnobLearner(info), seed=0, learning_ttl=10)
    whole = settled_rows(settle_ticks, [512] * 10)
    cut = settled_rows(settle_ticks, [512] * 9)  # its last tick ran the default
    assert cut >= schedule.cover, (cut, whole, schedule.cover)
    assert schedule.cover >= max(1, whole // 2), "coverage still asks for half of them"


@pytest.mark.parametrize("learning_ttl", [1, 5, 10])
def test_an_exploration_of_a_carry_over_knob_lasts_until_its_setting_settles(learning_ttl):
    """Asked for explorations shorter than the proxy's episodes (`episode_ticks`), the
    schedule still holds each one that long: the writeback bench's 5-tick explorations
    of knobs settling 5 ticks left one settled row in 35 explorations, and no policy."""
    info = {**INFO, "knobs": {"read_ahead_kb": {**INFO["knobs"]["read_ahead_kb"],
                                                "settle_ticks": 5}}}
    schedule = TrainerSchedule(KnobLearner(info), seed=0, learning_ttl=learning_ttl)
    steer = schedule.decide("learning", policy_live=False)
    assert steer is not None and steer.exploring
    value = steer.knobs["read_ahead_kb"]
    assert value != 128, "an exploration never runs the default"
    rows = settled_rows(5, [value] * steer.ttl)
    assert steer.ttl >= episode_ticks(5) and rows >= 5, (steer.ttl, rows)
    assert rows >= schedule.cover
