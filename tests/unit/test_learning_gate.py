"""The learning loop's quality gate (issue 34 item 4): the virtual-time learning bench
on a few seeds, deterministic per seed, about 4 s a seed.

Floors, not targets: the bench's second half must reach a median of 0.95 of the
per-phase oracle over the seeds, and no seed may end below the default.  It was
below both on 287d42b (seeds 1, 3 and 6: 0.78-0.87 of the oracle, seed 1 x0.969 of
the default), which is why these seeds are in the gate.
"""

from __future__ import annotations

import statistics

from tests.bench.learning import run_seed

SEEDS = (1, 3, 6)
TICKS = 6000


def test_the_learning_bench_reaches_the_oracles_floor_and_never_ends_below_the_default():
    results = [run_seed(seed, TICKS) for seed in SEEDS]
    halves = {r["seed"]: r["second_half"] for r in results}
    assert statistics.median(h["vs_oracle"] for h in halves.values()) >= 0.95, halves
    below = {seed: h["vs_default"] for seed, h in halves.items() if h["vs_default"] < 1.0}
    assert not below, f"seeds below the default in the second half: {below}"
    never = [r["seed"] for r in results if r["ticks_to_recommendation"] is None]
    assert not never, f"seeds that never reached recommendation: {never}"


def test_a_model_promoted_before_a_phase_it_never_saw_is_not_demoted_in_it():
    """Seeds 3 and 13 promote the model before the strided phase first runs; until the
    safe set (mlfs/core/models/safe_set.py) its policy chose 512-1,024 KiB there, x0.3 of the
    default, and collaboration's test demoted it sixty ticks later (docs/results/learning-34.md)."""
    for seed in (3, 13):
        result = run_seed(seed, 2000)
        modes = [mode for _, _, mode in result["transitions"]]
        assert "collaboration" in modes, result["transitions"]
        assert "learning" not in modes, f"seed {seed} demoted: {result['transitions']}"
