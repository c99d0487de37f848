"""Automatic mode switching in virtual time: a scripted subsystem and a virtual clock.

Ticks drive dwell, cool-down and the efficiency window; the exchange's clock
(passed in, `time.monotonic` on a mount) drives trainer silence.  So every
transition of `ModelProxy.update_mode` is reached here in well under a second
per test, without a mount, and at exactly the tick the rules say.
"""

from __future__ import annotations

import random

import pytest

from mlfs.abi import Knob, Objective, Sample, Subsystem
from mlfs.config import parse_config
from mlfs.core.models.efficiency import EfficiencyStats
from mlfs.core.models.modes import ModeMachine
from mlfs.core.models.proxy import ModelProxy
from mlfs.core.mount.events import EventBus
from mlfs.core.mount.exchange import Exchange
from mlfs.core.mount.runtime import SubsystemRuntime

MODES = parse_config("", "defaults").modes  # the shipped thresholds, nothing tuned here


class Scripted(Subsystem):
    """An objective the test sets: `base` × `gain` while the knob is away from its default."""

    name = "test.modes"
    backend = "test"
    description = "scripted objective for mode tests"
    tick_seconds = 1.0
    objective = Objective("throughput", "MB/s", "max")
    knobs = {"x": Knob("x", "int", 0, 0, 8)}
    features = {"load": "float64"}

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.gain = 1.0
        self.noise = 0.02
        self.critical: str | None = None

    def step(self, knobs):
        value = 100.0 * (self.gain if knobs["x"] != 0 else 1.0)
        value *= 1 + self.rng.gauss(0, self.noise)
        return Sample({"load": 1.0}, value, self.critical)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(tmp_path):
    clock = VirtualClock()
    sub = Scripted()
    exchange = Exchange(parse_config("", "test"), tmp_path, [sub], clock=clock)
    rt = exchange.runtimes["test.modes"]
    yield rt, sub, clock
    rt.close()


def started(rt: SubsystemRuntime, pin: str | None = None) -> ModelProxy:
    proxy = rt.create_model("m")
    proxy.start()
    if pin:
        proxy.set_mode(pin.encode() + b"\n")
    proxy.recommend(b"x=1\n")  # no ttl: every ML tick runs x=1
    return proxy


def run(rt: SubsystemRuntime, proxy: ModelProxy, ticks: int) -> list[tuple[int, str]]:
    """Run `ticks` ticks; [(tick, new mode)] for every change of the model's mode."""
    changes = []
    for _ in range(ticks):
        before = proxy.mode
        rt.tick()
        if proxy.mode != before:
            changes.append((rt.next_tick - 1, proxy.mode))
    return changes


def test_a_better_model_climbs_to_recommendation_after_dwell_and_enough_ml_ticks(world):
    rt, sub, _ = world
    sub.gain = 1.2
    proxy = started(rt)
    changes = run(rt, proxy, 2000)
    assert [mode for _, mode in changes] == ["collaboration", "recommendation"]
    (to_collab, _), (to_rec, _) = changes
    # learning runs 10 % ML ticks: min_ml_ticks (30) of them take ~300 ticks, more than the dwell
    assert MODES.min_ml_ticks / MODES.learning_share - 10 <= to_collab <= 330
    assert to_rec - to_collab >= MODES.min_dwell_ticks
    assert "z=" in proxy.mode_history[-1][2]


def test_no_transition_before_the_minimum_dwell():
    """A confident loss switches the tick the dwell (and min_ml_ticks) allows, not before."""
    tick = [0]
    machine = ModeMachine(MODES, EventBus(), "s", "m", lambda: tick[0])
    machine.switch("recommendation", "test")
    loss = EfficiencyStats(0.5, -20.0, 500, 500, 100.0, 0, 200)  # confidently harmful
    switched = None
    for tick[0] in range(1, 4 * MODES.min_dwell_ticks):
        machine.ml_since_transition += 1
        machine.update(None, 0.0, lambda: loss)
        if machine.mode != "recommendation":
            switched = tick[0]
            break
    assert machine.mode == "learning"
    assert switched == max(MODES.min_dwell_ticks, MODES.min_ml_ticks)


def test_between_the_thresholds_collaboration_holds(world):
    """Hysteresis: 1.02 is above demote_below (0.97) and below to_recommendation (1.05)."""
    rt, sub, _ = world
    sub.gain, sub.noise = 1.02, 0.01
    proxy = started(rt)
    changes = run(rt, proxy, 4000)
    assert [mode for _, mode in changes] == ["collaboration"]
    assert 1.0 < proxy.window.stats().efficiency < MODES.to_recommendation


def test_a_model_that_turns_worse_is_demoted_to_learning_with_confidence(world):
    rt, sub, _ = world
    sub.gain = 1.2
    proxy = started(rt)
    assert run(rt, proxy, 2000)[-1][1] == "recommendation"
    sub.gain = 0.85
    changes = run(rt, proxy, 2000)
    assert changes[0][1] == "learning"
    why = next(why for _, mode, why in proxy.mode_history if mode == "learning")
    assert f"< {MODES.demote_below}" in why and "z=-" in why


def until(rt: SubsystemRuntime, proxy: ModelProxy, mode: str, limit: int) -> int:
    """Tick until the model is in `mode`; the tick that switched it."""
    for _ in range(limit):
        rt.tick()
        if proxy.mode == mode:
            return rt.next_tick - 1
    raise AssertionError(f"not {mode} within {limit} ticks (still {proxy.mode})")


def test_a_collapse_goes_to_emergency_and_a_cool_down_back_to_learning(world):
    rt, sub, _ = world
    sub.gain = 0.1
    proxy = started(rt)
    collapsed = until(rt, proxy, "emergency", 1000)
    assert proxy.emergency_cause == "collapse" and "collapsed" in proxy.mode_history[-1][2]
    ml_ticks = proxy.ml_ticks
    assert run(rt, proxy, MODES.emergency_cooldown_ticks - 1) == []
    assert proxy.ml_ticks == ml_ticks, "emergency runs the default only"
    assert run(rt, proxy, 1) == [(collapsed + MODES.emergency_cooldown_ticks, "learning")]
    assert "cool-down" in proxy.mode_history[-1][2]


def test_the_window_starts_afresh_after_a_collapse_cool_down(world):
    rt, sub, _ = world
    sub.gain = 0.1
    proxy = started(rt)
    until(rt, proxy, "emergency", 1000)
    assert proxy.emergency_cause == "collapse"
    assert proxy.window.stats().ml_ticks == 0, "every switch starts the evidence again"
    until(rt, proxy, "learning", MODES.emergency_cooldown_ticks)
    assert proxy.window.stats().ml_ticks == 0, "the collapse's pairs are forgotten"
    sub.gain = 1.2  # the trainer fixed its model: judged on new ticks only, no second collapse
    assert [m for _, m in run(rt, proxy, 1500)] == ["collaboration", "recommendation"]


def test_trainer_silence_in_virtual_seconds_means_emergency_until_it_speaks(world):
    rt, sub, clock = world
    sub.gain = 1.2
    proxy = started(rt)
    run(rt, proxy, 3000)
    assert proxy.mode == "recommendation", "ticks alone never make a trainer silent"
    clock.now += MODES.silence_seconds - 1
    assert run(rt, proxy, 1) == []
    clock.now += 2
    assert run(rt, proxy, 1) == [(rt.next_tick - 1, "emergency")]
    assert proxy.emergency_cause == "silent"
    ml_ticks = proxy.ml_ticks
    assert run(rt, proxy, 50) == [] and proxy.ml_ticks == ml_ticks
    proxy.recommend(b"x=2\n")
    assert proxy.mode == "learning" and "trainer is back" in proxy.mode_history[-1][2]


def test_a_critical_state_means_emergency_then_the_cool_down_restores_the_mode(world):
    rt, sub, _ = world
    sub.gain = 1.2
    proxy = started(rt)
    sub.critical = "pressure"
    changes = run(rt, proxy, 10)
    assert changes == [(changes[0][0], "emergency")] and proxy.emergency_cause == "critical"
    sub.critical = None
    calm = rt.next_tick
    changes = run(rt, proxy, MODES.emergency_cooldown_ticks + 5)
    assert changes == [(calm + MODES.emergency_cooldown_ticks - 1, "learning")]


def test_a_pinned_mode_holds_whatever_the_efficiency_but_not_a_critical_state(world):
    rt, sub, clock = world
    sub.gain = 0.5
    proxy = started(rt, pin="collaboration")
    assert run(rt, proxy, 2000) == []
    assert proxy.window.stats().efficiency < MODES.demote_below
    clock.now += 10 * MODES.silence_seconds
    assert run(rt, proxy, 100) == [], "pinned: silence does not move it either"
    sub.critical = "pressure"
    assert [m for _, m in run(rt, proxy, 5)] == ["emergency"]
    sub.critical = None
    changes = run(rt, proxy, MODES.emergency_cooldown_ticks + 5)
    assert [m for _, m in changes] == ["collaboration"], "back to the pin"


def test_each_switch_starts_the_evidence_again_and_the_report_replays_it(world):
    """Collaboration and recommendation decide on everything since the switch into
    them (a growing sample: the confidence sequence stays valid however often it is
    read); `efficiency.replay` with `evidence` reads the dataset the same way."""
    from mlfs.core.models.efficiency import replay

    rt, sub, _ = world
    sub.gain = 1.2
    proxy = started(rt)
    changes = run(rt, proxy, 1500)
    assert [mode for _, mode in changes] == ["collaboration", "recommendation"]
    to_rec = changes[-1][0]
    evidence = proxy.evidence()
    assert 0 < evidence.ml_ticks <= rt.next_tick - to_rec, "only ticks since the switch"
    last_window = proxy.window.stats(since=rt.next_tick - 1 - MODES.window_ticks)
    assert evidence.ml_ticks > last_window.ml_ticks, "a growing sample, not a sliding one"
    rt.dataset.seal_now()
    rows = rt.dataset.read_all().to_pylist()
    replayed = replay(rows, "m", "max", MODES.window_ticks, evidence=MODES.evidence_ticks)
    assert replayed[-1][1] == evidence
