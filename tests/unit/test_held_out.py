"""The benches' best static and oracle without winner's curse (tests/bench/win_harness.py).

A sweep of settings that are all equally good, measured with noise: picked and
read on the same visits, the best looks better than the default (the winner's
curse); read on held-out visits it does not.
"""

from __future__ import annotations

import random
import statistics

import pytest

from tests.bench.win_harness import held_out, interleaved_sweep, rounds_of

PHASES = ("seq", "rand")


def noisy_sweep(gains: dict[str, dict[str, float]], rounds: int, seed: int,
                noise: float = 0.1) -> list[dict]:
    rng = random.Random(seed)
    order: list[str] = []

    def visit(setting: str, n: int) -> dict:
        order.append(setting)
        return {p: 100 * gains[setting][p] * (1 + rng.gauss(0, noise)) for p in PHASES}

    found = interleaved_sweep(list(gains), rounds, visit)
    assert order[:len(gains)] != order[len(gains):2 * len(gains)]  # the order rotates
    assert all(set(r) == set(gains) for r in found)  # every setting once per round
    return found


def test_equal_settings_look_better_in_sample_and_not_held_out():
    flat = {f"s{i}": {"seq": 1.0, "rand": 1.0} for i in range(8)} | {
        "default": {"seq": 1.0, "rand": 1.0}}
    in_sample, held = [], []
    for seed in range(40):
        found = held_out(noisy_sweep(flat, 2, seed), PHASES, "default")
        in_sample.append(found["best_static_in_sample"])
        held.append(found["best_static_held_out"])
    assert statistics.median(in_sample) > 1.05  # the winner's curse
    assert 0.95 < statistics.median(held) < 1.05  # gone on the other visits


def test_a_real_winner_and_the_oracle_are_found_and_measured_on_other_visits():
    gains = {"default": {"seq": 1.0, "rand": 1.0}, "big": {"seq": 2.0, "rand": 0.8},
             "small": {"seq": 0.9, "rand": 1.5}, "middle": {"seq": 1.5, "rand": 1.3}}
    found = held_out(noisy_sweep(gains, 4, 1, noise=0.02), PHASES, "default")
    assert found["best_static"] == "middle"
    assert found["oracle"] == {"seq": "big", "rand": "small"}
    assert found["oracle_held_out"] == pytest.approx(2 / (1 / 2.0 + 1 / 1.5), rel=0.05)
    assert found["best_static_held_out"] == pytest.approx(2 / (1 / 1.5 + 1 / 1.3), rel=0.05)
    assert found["rounds"] == 4


def test_one_round_cannot_be_held_out():
    with pytest.raises(ValueError, match="two rounds"):
        held_out([{"default": {"seq": 1.0, "rand": 1.0}}], PHASES, "default")


def test_the_sweeps_values_become_rounds():
    values = {"default": {"seq": [1.0, 2.0], "rand": [3.0, 4.0]},
              "x=1": {"seq": [5.0, 6.0], "rand": [7.0, 8.0]}}
    assert rounds_of(values) == [
        {"default": {"seq": 1.0, "rand": 3.0}, "x=1": {"seq": 5.0, "rand": 7.0}},
        {"default": {"seq": 2.0, "rand": 4.0}, "x=1": {"seq": 6.0, "rand": 8.0}}]
