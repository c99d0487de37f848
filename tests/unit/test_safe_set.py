"""The safe set: a rolled-out policy chooses only settings measured at this workload level,
or one step from one (mlfs/core/models/safe_set.py)."""

from __future__ import annotations

import itertools

import numpy as np

from mlfs.abi import Knob, Objective, Sample, Subsystem, candidate_values, column_name, knob_column
from mlfs.config import parse_config
from mlfs.core.models.safe_set import CLEAR_LOSS, LEVEL_RATIO, MAX_SETTINGS, SAFE_MARGIN, SafeSet
from mlfs.core.mount.exchange import Exchange

GRID = (0, 1, 2, 4, 8, 16, 32)  # one knob "x", default 4 (index 3)
CANDIDATES = [{"knob_x": v} for v in GRID]
DEFAULT = np.array([v == 4 for v in GRID])


def allowed(safe: SafeSet) -> set[int]:
    mask = safe.allowed(CANDIDATES, (len(GRID),), DEFAULT)
    return {v for v, ok in zip(GRID, mask, strict=True) if ok}


def test_before_anything_is_measured_only_the_default_and_its_neighbours_are_allowed():
    safe = SafeSet()
    assert allowed(safe) == {2, 4, 8}
    safe.default_tick(100.0)
    assert allowed(safe) == {2, 4, 8}


def test_a_setting_measured_safe_at_this_level_opens_the_next_step():
    safe = SafeSet()
    safe.default_tick(100.0)
    safe.measured({"knob_x": 8}, 100.0, 1.2)
    assert allowed(safe) == {2, 4, 8, 16}
    safe.measured({"knob_x": 16}, 98.0, 1.3)
    assert allowed(safe) == {2, 4, 8, 16, 32}


def test_a_setting_measured_at_another_workload_level_does_not_count_here():
    safe = SafeSet()
    safe.measured({"knob_x": 8}, 100.0, 1.2)
    safe.measured({"knob_x": 16}, 100.0, 1.3)
    safe.default_tick(100.0 * LEVEL_RATIO * 1.1)  # a phase the setting never ran in
    assert allowed(safe) == {2, 4, 8}
    safe.default_tick(100.0 * LEVEL_RATIO * 0.95)  # the same phase, drifted
    assert allowed(safe) == {2, 4, 8, 16, 32}


def test_a_clear_loss_is_closed_at_once_and_does_not_open_its_neighbours():
    safe = SafeSet()
    safe.default_tick(100.0)
    safe.measured({"knob_x": 8}, 100.0, CLEAR_LOSS - 0.3)
    assert allowed(safe) == {2, 4}


def test_a_small_shortfall_closes_a_setting_only_over_three_pairs():
    """One pair at x0.93 may be noise: the setting stays open (not safe, but next to the
    default); three pairs that average it are a loss."""
    safe = SafeSet()
    safe.default_tick(100.0)
    shortfall = 1.0 - SAFE_MARGIN - 0.02
    safe.measured({"knob_x": 8}, 100.0, shortfall)
    assert allowed(safe) == {2, 4, 8}, "open, and 16 not opened through it"
    safe.measured({"knob_x": 8}, 100.0, shortfall)
    safe.measured({"knob_x": 8}, 100.0, shortfall)
    assert allowed(safe) == {2, 4}


def test_a_pair_without_a_baseline_or_ratio_is_not_evidence():
    safe = SafeSet()
    safe.default_tick(100.0)
    safe.measured({"knob_x": 8}, float("nan"), 1.5)
    safe.measured({"knob_x": 8}, 0.0, 1.5)
    safe.measured({"knob_x": 8}, 100.0, float("inf"))
    assert allowed(safe) == {2, 4, 8}


def test_two_knobs_open_one_step_on_each_at_once():
    grids = [(0, 1, 2, 4), (0, 1, 2, 4)]
    candidates = [{"knob_a": a, "knob_b": b} for a, b in itertools.product(*grids)]
    default = np.array([c == {"knob_a": 1, "knob_b": 1} for c in candidates])
    safe = SafeSet()
    safe.default_tick(50.0)
    mask = safe.allowed(candidates, (4, 4), default)
    open_ = {(c["knob_a"], c["knob_b"]) for c, ok in zip(candidates, mask, strict=True) if ok}
    assert open_ == {(a, b) for a in (0, 1, 2) for b in (0, 1, 2)}


def test_the_ring_keeps_the_last_pairs_only():
    safe = SafeSet(kept=4)
    safe.default_tick(100.0)
    safe.measured({"knob_x": 8}, 100.0, 0.5)  # a clear loss, then forgotten
    for _ in range(4):
        safe.measured({"knob_x": 2}, 100.0, 1.0)
    assert 8 in allowed(safe)


def test_settings_beyond_the_bound_are_not_tracked_and_never_safe():
    """A trainer may recommend any value in a knob's range: the table of settings stays
    bounded, and one it could not track is never opened by its measurements."""
    safe = SafeSet()
    safe.default_tick(100.0)
    for value in range(10_000, 10_000 + MAX_SETTINGS):
        safe.measured({"knob_x": value}, 100.0, 1.0)
    safe.measured({"knob_x": 8}, 100.0, 1.5)
    safe.measured({"knob_x": 16}, 100.0, 1.5)
    assert allowed(safe) == {2, 4, 8}, "8 is next to the default; 16 was never tracked"


# ---- in the proxy -------------------------------------------------------------------------
class TwoLevels(Subsystem):
    """Phase A (objective ~100 at the default) where x = 16 wins x1.3, then phase B
    (~300) where x = 16 loses x0.3; the feature says which phase runs."""

    name = "test.levels"
    backend = "test"
    description = "a setting that wins in one workload phase and loses in the next"
    tick_seconds = 1.0
    objective = Objective("throughput", "MB/s", "max")
    features = {"load": "float64"}

    def __init__(self, switch_at: int) -> None:
        self.knobs = {"x": Knob("x", "int", 4, 0, 32)}
        self.switch_at = switch_at
        self.ticks = 0
        self.applied: list[tuple[int, int]] = []

    def step(self, knobs):
        x = int(knobs["x"])
        phase_b = self.ticks >= self.switch_at
        self.applied.append((self.ticks, x))
        self.ticks += 1
        gain = (0.3 if phase_b else 1.3) if x == 16 else 1.0
        return Sample({"load": 1.0 if phase_b else 0.0}, (300.0 if phase_b else 100.0) * gain)


def always_sixteen_policy() -> bytes:
    """A policy that learnt phase A only: x = 16 best, whatever the load."""
    import lightgbm as lgb

    values = candidate_values(Knob("x", "int", 4, 0, 32))
    rows = np.array([(load, x) for load in (0.0, 0.5) for x in values] * 20, dtype=float)
    label = 100.0 + np.where(rows[:, 1] == 16, 30.0, 0.0) + rows[:, 0]
    data = lgb.Dataset(rows, label=label, params={"verbose": -1},
                       feature_name=[column_name("load"), knob_column("x")])
    return lgb.train({"verbose": -1, "num_leaves": 8, "min_data_in_leaf": 1,
                      "min_data_in_bin": 1}, data, num_boost_round=30).model_to_string().encode()


def run_two_levels(tmp_path, pin: bool, start: str | None = "collaboration",
                   modes_settings: str = "") -> tuple[list[tuple[int, int]], set[str]]:
    """A model in `start` (automatic, or pinned with `pin`; None: a new model's
    learning); the trainer measures x = 16 in phase A for 40 ticks, then the policy
    runs into phase B.  The settings applied, and the modes seen once it runs."""
    config = parse_config(f"[modes]\nsilence_seconds = 1e9\n{modes_settings}", "test")
    subsystem = TwoLevels(switch_at=150)
    rt = Exchange(config, tmp_path, [subsystem]).runtimes["test.levels"]
    try:
        proxy = rt.create_model("m")
        proxy.start()
        if start is not None:
            proxy.set_mode(f"{start}\n".encode())
            if not pin:
                proxy.set_mode(b"auto\n")
        proxy.recommend(b"x=16 ttl=40\n")
        for _ in range(100):
            rt.tick()
        proxy.set_policy(always_sixteen_policy())
        modes = set()
        for _ in range(120):
            rt.tick()
            modes.add(proxy.mode)
        return subsystem.applied, modes
    finally:
        rt.close()


def test_in_automatic_collaboration_a_policy_runs_a_setting_only_where_it_was_measured(tmp_path):
    """In phase B the policy steps toward x = 16 through 8 (neutral there, so safe), tries
    16 for one run of ML ticks as the next step, and never again once that run's pairs
    judge it a clear loss."""
    applied, _ = run_two_levels(tmp_path, pin=False)
    in_a = {x for t, x in applied if 100 <= t < 150}
    assert 16 in in_a, "measured in phase A by the trainer: the policy may run it there"
    sixteen_in_b = [t for t, x in applied if t >= 150 and x == 16]
    assert 8 in {x for t, x in applied if 150 <= t < min(sixteen_in_b, default=220)}, \
        "a step toward what the policy wants, first"
    assert len(sixteen_in_b) <= 20, f"one run of ML ticks at most: {sixteen_in_b}"
    assert not [t for t in sixteen_in_b if t >= sixteen_in_b[0] + 25], sixteen_in_b


def test_in_automatic_learning_a_policy_never_runs_its_guess_in_a_phase_it_never_saw(tmp_path):
    """Learning's ML ticks are what promotion judges, so they run the policy as
    collaboration would: restricted.  Unrestricted, this policy ran x = 16 on its ML
    ticks in phase B (x0.3 there); the demo's learning efficiency fell to 0.45 for
    300 ticks the same way (docs/results/learning-34.md).  Restricted, it keeps to the
    default and its neighbours there (phase A's measurement of 16 is at another
    workload level).  Promotion is out of reach here, so every tick is judged in
    learning."""
    applied, modes = run_two_levels(tmp_path, pin=False, start=None, modes_settings=(
        "learning_share = 0.5\nto_collaboration = 100.0\n"))
    assert modes == {"learning"}
    assert 16 in {x for t, x in applied if 100 <= t < 150}, "measured in phase A: allowed there"
    in_b = {x for t, x in applied if t >= 150}
    assert 16 not in in_b and in_b <= {2, 4, 8}, \
        f"only the default and its neighbours until one is measured in phase B: {in_b}"


def test_a_pinned_mode_skips_the_safe_set_as_it_skips_the_efficiency_gate(tmp_path):
    applied, _ = run_two_levels(tmp_path, pin=True)
    assert len([t for t, x in applied if t >= 190 and x == 16]) >= 10


def test_pinned_in_recommendation_an_unproven_policy_never_runs(tmp_path):
    """A pin sets the mode; it does not pass the mode machine's bar.  Pinned there (as
    the real-device benches pin it), the policy that learnt phase A ran x = 16 throughout
    phase B (x0.3 there).  Now it decides only where its own pairs prove it: the
    trainer's x = 16 in phase A (two episodes) prove nothing, so the default runs."""
    applied, modes = run_two_levels(tmp_path, pin=True, start="recommendation")
    assert modes == {"recommendation"}
    assert {x for t, x in applied if t >= 150} == {4}, "phase B: the default throughout"
    assert {x for t, x in applied if 140 <= t < 150} == {4}, "phase A once the trainer stops"


def test_pinned_in_recommendation_a_proven_policy_runs_only_measured_settings(tmp_path):
    """Where the policy is proven (its own pairs at x = 2, x1.05), pinned recommendation
    still rolls out only the safe set: the default, x = 2 and one step from them, never
    the x = 16 this policy wants and nothing measured."""
    config = parse_config("[modes]\nsilence_seconds = 1e9\n", "test")
    subsystem = TwoLevels(switch_at=10_000)
    rt = Exchange(config, tmp_path, [subsystem]).runtimes["test.levels"]
    try:
        proxy = rt.create_model("m")
        proxy.start()
        proxy.set_mode(b"recommendation\n")
        proxy.safe.default_tick(100.0)
        for episode in range(12):
            for k in range(3):
                proxy.incumbent.measured({knob_column("x"): 2}, 100.0, 1.05 + 0.01 * (k - 1),
                                         -1000 + 5 * episode + k, "policy", "recommendation")
        assert proxy.incumbent.standing().policy_holds_here
        proxy.set_policy(always_sixteen_policy())
        for _ in range(60):
            rt.tick()
    finally:
        rt.close()
    applied = {x for _, x in subsystem.applied}
    assert 16 not in applied and applied <= {1, 2, 4, 8}, applied
    assert applied - {4}, f"the proven policy decides: {applied}"
