"""Behaviour of the simulated readahead subsystem (backends/sim_readahead.py).

These pin what the tests, the demo and the benchmarks rely on: determinism,
a workload that ignores the knob, the calibration against the loop-device
measurements, and a tuning problem where knowing the phase pays.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from mlfs.backends.sim_readahead import (
    FEATURES,
    PHASES,
    RA_GRID,
    SimReadahead,
    throughput_curve,
)
from mlfs.backends.sim_readahead_phases import _ANCHORS, _pchip

from mlfs.abi import Sample, Subsystem

DEFAULT_PHASES = ("sequential", "random_pread", "random_mmap", "strided")


def run(sim: SimReadahead, knob_values: list[int]) -> list[Sample]:
    return [sim.step({"read_ahead_kb": ra}) for ra in knob_values]


def knob_sequence(seed: int, n: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.choice(RA_GRID, size=n)]


def phase_trace(sim: SimReadahead, knob_values: list[int]) -> list[str]:
    out = []
    for ra in knob_values:
        out.append(sim.phase)
        sim.step({"read_ahead_kb": ra})
    return out


# ---- interface ----------------------------------------------------------------------
def test_declares_the_subsystem_interface_with_stock_default() -> None:
    sim = SimReadahead()
    assert isinstance(sim, Subsystem)
    assert sim.name == "sim.readahead"
    assert sim.backend == "sim.readahead"
    assert sim.description
    assert sim.tick_seconds == 0.05
    assert (sim.objective.name, sim.objective.unit, sim.objective.goal) == (
        "throughput", "MB/s", "max")
    knob = sim.knobs["read_ahead_kb"]
    assert list(sim.knobs) == ["read_ahead_kb"]
    assert (knob.type, knob.default, knob.min, knob.max, knob.unit) == (
        "int", 128, 0, 4096, "KiB")
    assert sim.default_knobs(None) == {"read_ahead_kb": 128}
    assert 6 <= len(sim.features) <= 9
    assert set(sim.features.values()) <= {"float64", "int64"}


def test_features_have_exactly_the_declared_keys_and_types() -> None:
    sim = SimReadahead(seed=3)
    for sample in run(sim, knob_sequence(3, 2000)):
        assert list(sample.features) == list(sim.features)
        for name, dtype in sim.features.items():
            value = sample.features[name]
            if dtype == "int64":
                assert type(value) is int and value >= 0, name
            else:
                assert type(value) is float and math.isfinite(value), name
        assert type(sample.objective) is float and sample.objective > 0
        assert 0.0 <= sample.features["mem_pressure"] <= 1.0
        assert 0.0 <= sample.features["cache_hit_ratio"] <= 1.0
        assert 0.0 <= sample.features["sequential_ratio"] <= 1.0


def test_knob_in_effect_is_reported_and_out_of_range_values_are_clamped() -> None:
    sim = SimReadahead()
    assert sim.step({"read_ahead_kb": 512}).features["current_ra_kb"] == 512
    assert sim.step({"read_ahead_kb": 99999}).features["current_ra_kb"] == 4096
    assert sim.step({"read_ahead_kb": -5}).features["current_ra_kb"] == 0
    assert sim.step({"read_ahead_kb": 64}).features["current_ra_kb"] == 64
    sample = sim.step({"read_ahead_kb": "lots"})  # type: ignore[dict-item]
    assert sample.features["current_ra_kb"] == 64  # the last good value stays
    assert "read_ahead_kb" in sample.extra["refused"]


def test_rejects_unknown_phases_and_bad_phase_lengths() -> None:
    with pytest.raises(ValueError):
        SimReadahead(phases=("sequential", "bogus"))
    with pytest.raises(ValueError):
        SimReadahead(phases=())
    with pytest.raises(ValueError):
        SimReadahead(phase_ticks=(10, 5))
    with pytest.raises(ValueError):
        SimReadahead.best_knob_for_phase("bogus")


# ---- determinism and the workload ---------------------------------------------------
def test_same_seed_and_knobs_give_identical_samples() -> None:
    knobs = knob_sequence(7, 1500)
    a = run(SimReadahead(seed=11), knobs)
    b = run(SimReadahead(seed=11), knobs)
    assert [(s.features, s.objective, s.critical) for s in a] == [
        (s.features, s.objective, s.critical) for s in b]


def test_different_seed_gives_different_samples() -> None:
    knobs = knob_sequence(7, 500)
    a = run(SimReadahead(seed=1), knobs)
    b = run(SimReadahead(seed=2), knobs)
    assert [s.objective for s in a] != [s.objective for s in b]
    trace_a = phase_trace(SimReadahead(seed=1), knobs * 4)
    trace_b = phase_trace(SimReadahead(seed=2), knobs * 4)
    assert trace_a != trace_b


def test_phase_sequence_does_not_depend_on_knob_choices() -> None:
    n = 3000
    fixed = phase_trace(SimReadahead(seed=5), [128] * n)
    varied = phase_trace(SimReadahead(seed=5), knob_sequence(99, n))
    extreme = phase_trace(SimReadahead(seed=5), [0, 4096] * (n // 2))
    assert fixed == varied == extreme


def test_noise_is_common_to_all_knob_choices() -> None:
    # The same tick gets the same multiplicative noise whatever the knob, so a
    # counterfactual comparison on the same seed measures the knob, not luck.
    a_sim, b_sim = SimReadahead(seed=8), SimReadahead(seed=8)
    for ra in knob_sequence(1, 800):
        a_exp = a_sim.expected_objective({"read_ahead_kb": 128})
        b_exp = b_sim.expected_objective({"read_ahead_kb": ra})
        a = a_sim.step({"read_ahead_kb": 128}).objective
        b = b_sim.step({"read_ahead_kb": ra}).objective
        assert a / a_exp == pytest.approx(b / b_exp, rel=1e-12)


def test_phases_never_repeat_back_to_back_and_last_the_configured_ticks() -> None:
    sim = SimReadahead(seed=4, phase_ticks=(150, 400))
    trace = phase_trace(sim, [128] * 20000)
    runs: list[tuple[str, int]] = []
    for phase in trace:
        if runs and runs[-1][0] == phase:
            runs[-1] = (phase, runs[-1][1] + 1)
        else:
            runs.append((phase, 1))
    assert all(a[0] != b[0] for a, b in zip(runs, runs[1:], strict=False))
    assert all(150 <= length <= 400 for _, length in runs[:-1])
    assert {phase for phase, _ in runs} == set(DEFAULT_PHASES)
    shares = {p: sum(n for q, n in runs if q == p) / len(trace) for p in DEFAULT_PHASES}
    assert all(0.18 < share < 0.32 for share in shares.values()), shares


def test_single_phase_workload_just_repeats_it() -> None:
    sim = SimReadahead(phases=("random_mmap",), phase_ticks=(5, 10))
    assert set(phase_trace(sim, [128] * 200)) == {"random_mmap"}


def test_intensity_drifts_slowly_within_a_phase() -> None:
    sim = SimReadahead(seed=2, noise=0.0)
    phase = sim.phase
    values = []
    while sim.phase == phase:
        values.append(sim.expected_objective({"read_ahead_kb": 128}))
        sim.step({"read_ahead_kb": 128})
    nominal = throughput_curve(phase, 128)
    ratios = np.array(values) / nominal
    assert ratios.max() - ratios.min() > 0.01  # not stationary
    assert np.all(np.abs(ratios - 1) <= 0.10 + 1e-9)  # within +-10%
    assert np.abs(np.diff(ratios)).max() < 0.01  # slowly


def test_expected_objective_is_the_noise_free_next_tick() -> None:
    quiet = SimReadahead(seed=6, noise=0.0)
    for ra in knob_sequence(2, 600):
        expected = quiet.expected_objective({"read_ahead_kb": ra})
        assert quiet.step({"read_ahead_kb": ra}).objective == pytest.approx(expected)
    noisy = SimReadahead(seed=6)
    ratios = []
    for ra in knob_sequence(2, 6000):
        expected = noisy.expected_objective({"read_ahead_kb": ra})
        ratios.append(noisy.step({"read_ahead_kb": ra}).objective / expected)
    assert np.mean(ratios) == pytest.approx(1.0, abs=0.01)  # mean-one noise
    assert np.std(np.log(ratios)) == pytest.approx(0.08, rel=0.1)


# ---- calibration -----------------------------------------------------------------------
MEASURED = {  # MiB/s on this machine's loop device, 4 KiB buffered reads, cold cache
    ("sequential", 0): (44, 47),
    ("sequential", 128): (815, 1113),
    ("sequential", 4096): (416, 1471),
    ("random_pread", 0): (48, 53),
    ("random_pread", 128): (50, 57),
    ("random_pread", 4096): (43, 49),
    ("random_mmap", 0): (37, 49),
    ("random_mmap", 128): (115, 152),
}


@pytest.mark.parametrize(("phase", "ra"), sorted(MEASURED))
def test_calibration_points_match_the_loop_device_measurements(phase: str, ra: int) -> None:
    lo, hi = MEASURED[(phase, ra)]
    assert lo * 0.85 <= throughput_curve(phase, ra) <= hi * 1.15
    assert lo <= throughput_curve(phase, ra) <= hi  # in fact inside the range


def test_random_mmap_keeps_the_measured_ordering_with_its_best_in_the_middle() -> None:
    curve = {ra: throughput_curve("random_mmap", ra) for ra in RA_GRID}
    best = SimReadahead.best_knob_for_phase("random_mmap")
    assert curve[0] < curve[128] < curve[4096]  # as measured
    assert 256 <= best <= 1024
    assert curve[4096] <= 0.8 * curve[best]  # a file larger than memory: waste evicts


def test_curves_are_smooth_in_log_readahead() -> None:
    # no step larger than a few percent between neighbouring knob values
    for phase in PHASES:
        values = np.array([throughput_curve(phase, ra) for ra in range(0, 4097)])
        assert np.all(np.abs(np.diff(np.log(values))) < 0.2), phase


def test_interpolation_matches_scipy_pchip() -> None:
    from scipy import interpolate  # installed with lightgbm

    x = np.log2(1.0 + np.arange(4097.0))
    for anchors in _ANCHORS.values():
        xk = np.log2(1.0 + np.array([kb for kb, _ in anchors], dtype=float))
        yk = np.log(np.array([mib for _, mib in anchors]))
        ref = interpolate.PchipInterpolator(xk, yk)(x)
        np.testing.assert_allclose(_pchip(xk, yk, x), ref, rtol=0, atol=1e-12)


def test_per_phase_best_values_differ_and_no_static_value_is_best_everywhere() -> None:
    best = {phase: SimReadahead.best_knob_for_phase(phase) for phase in DEFAULT_PHASES}
    assert len(set(best.values())) == len(DEFAULT_PHASES), best
    assert 512 <= best["sequential"] <= 1024
    assert 16 <= best["random_pread"] <= 128
    assert 256 <= best["random_mmap"] <= 1024
    assert best["strided"] <= 32
    for ra in RA_GRID:
        losers = [p for p in DEFAULT_PHASES
                  if throughput_curve(p, ra) < throughput_curve(p, best[p])]
        assert losers, f"{ra} KiB is best for every phase"
    # the phases disagree about the stock value too
    assert throughput_curve("sequential", 128) < 0.9 * throughput_curve("sequential", 1024)
    assert throughput_curve("strided", 128) < 0.8 * throughput_curve("strided", 32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_beats_default_and_best_static_value(seed: int) -> None:
    sim = SimReadahead(seed=seed)
    best = {phase: sim.best_knob_for_phase(phase) for phase in DEFAULT_PHASES}
    grid = [{"read_ahead_kb": ra} for ra in RA_GRID]
    oracle = 0.0
    static = np.zeros(len(RA_GRID))
    for _ in range(5000):
        oracle += sim.expected_objective({"read_ahead_kb": best[sim.phase]})
        static += [sim.expected_objective(k) for k in grid]
        sim.step(sim.default_knobs(None))
    default = static[RA_GRID.index(128)]
    assert oracle / default >= 1.15
    assert oracle / default <= 1.40
    assert oracle / static.max() >= 1.10


# ---- features --------------------------------------------------------------------------
def collect(seed: int, n: int, knobs: list[int]) -> tuple[np.ndarray, list[str]]:
    sim = SimReadahead(seed=seed)
    rows, labels = [], []
    for ra in knobs[:n]:
        labels.append(sim.phase)
        sample = sim.step({"read_ahead_kb": ra})
        rows.append([float(sample.features[f]) for f in FEATURES if f != "current_ra_kb"])
    return np.array(rows), labels


def test_features_tell_the_phases_apart_whatever_the_knob() -> None:
    # a nearest-centroid classifier, trained on one run and tested on another
    # with different knobs, recognises the phase from the noisy features
    train_x, train_y = collect(21, 4000, knob_sequence(1, 4000))
    test_x, test_y = collect(22, 4000, knob_sequence(2, 4000))
    scale = np.log1p(np.abs(train_x))
    mean, std = scale.mean(axis=0), scale.std(axis=0) + 1e-9
    z_train = (scale - mean) / std
    z_test = (np.log1p(np.abs(test_x)) - mean) / std
    phases = sorted(set(train_y))
    centroids = np.array([z_train[np.array(train_y) == p].mean(axis=0) for p in phases])
    dist = ((z_test[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    predicted = [phases[i] for i in dist.argmin(axis=1)]
    accuracy = np.mean([p == t for p, t in zip(predicted, test_y, strict=True)])
    assert accuracy > 0.95


def test_features_are_not_functions_of_the_knob_alone() -> None:
    sim = SimReadahead(seed=9)
    by_phase: dict[str, list[dict]] = {}
    for _ in range(3000):
        phase = sim.phase
        by_phase.setdefault(phase, []).append(sim.step({"read_ahead_kb": 128}).features)
    assert set(by_phase) == set(DEFAULT_PHASES)
    for name in FEATURES:
        if name == "current_ra_kb":
            continue
        means = [np.mean([f[name] for f in rows]) for rows in by_phase.values()]
        assert max(means) > 1.2 * min(means) + 1e-6, name  # same knob, phases differ
        values = [f[name] for f in next(iter(by_phase.values()))]
        assert len(set(values)) > 1, name  # and the measurement is noisy


def test_memory_pressure_is_high_in_random_mmap() -> None:
    sim = SimReadahead(seed=10)
    pressure: dict[str, list[float]] = {}
    for _ in range(3000):
        phase = sim.phase
        pressure.setdefault(phase, []).append(
            sim.step({"read_ahead_kb": 128}).features["mem_pressure"])
    assert np.mean(pressure["random_mmap"]) > 0.75
    assert all(np.mean(v) < 0.5 for p, v in pressure.items() if p != "random_mmap")


# ---- critical state -----------------------------------------------------------------
def test_critical_state_appears_only_when_configured() -> None:
    knobs = knob_sequence(4, 3000)
    assert all(s.critical is None for s in run(SimReadahead(seed=12), knobs))
    samples = run(SimReadahead(seed=12, critical_pressure=0.85), knobs)
    critical = [s for s in samples if s.critical]
    assert critical
    for s in samples:
        assert (s.critical is not None) == (s.features["mem_pressure"] > 0.85)
    for s in critical:
        assert re.fullmatch(r"mem_pressure \d\.\d\d > 0\.85", s.critical)
        assert s.extra["phase"] == "random_mmap"


def test_mixed_phase_is_available_on_request() -> None:
    sim = SimReadahead(phases=("sequential", "mixed"), phase_ticks=(10, 20))
    trace = phase_trace(sim, [128] * 200)
    assert set(trace) == {"sequential", "mixed"}
    assert "mixed" in PHASES
