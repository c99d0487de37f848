"""Score a run on `sim.readahead` against counterfactuals on the same workload.

The simulated workload (phases, drift) never depends on the knob, so a run can
be replayed from its seed: for every tick we know the noise-free throughput
that the knob actually applied got, and what the default (128 KiB), every
static value and the oracle (the best value for the phase) would have got on
exactly that tick.  The demo and the learning benchmark report these ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .sim_readahead import RA_GRID, SimReadahead


@dataclass(frozen=True)
class Score:
    ticks: int
    run: float  # mean noise-free MB/s with the knobs the run applied
    default: float
    best_static: float
    best_static_kb: int
    oracle: float

    def ratios(self) -> dict[str, float]:
        return {
            "vs_default": self.run / self.default,
            "vs_best_static": self.run / self.best_static,
            "vs_oracle": self.run / self.oracle,
        }


class Counterfactuals:
    """Per-tick expected throughput for the grid and for applied values."""

    def __init__(self, seed: int, ticks: int, applied: Sequence[int] | None = None,
                 **sim_settings) -> None:
        sim = SimReadahead(seed=seed, **sim_settings)
        default = {"read_ahead_kb": 128}
        self.grid = np.array(RA_GRID)
        self.table = np.zeros((ticks, len(RA_GRID)))
        self.applied = np.zeros(ticks)
        self.default = np.zeros(ticks)
        self.phases: list[str] = []
        for t in range(ticks):
            self.phases.append(sim.phase)
            for j, ra in enumerate(RA_GRID):
                self.table[t, j] = sim.expected_objective({"read_ahead_kb": ra})
            self.default[t] = sim.expected_objective(default)
            if applied is not None:
                self.applied[t] = sim.expected_objective({"read_ahead_kb": int(applied[t])})
            sim.step(default)

    def score(self, ticks: np.ndarray) -> Score:
        """Compare over the given tick numbers (e.g. those in recommendation mode)."""
        ticks = np.asarray(ticks, dtype=int)
        statics = self.table[ticks].mean(axis=0)
        best = int(np.argmax(statics))
        return Score(
            ticks=len(ticks),
            run=float(self.applied[ticks].mean()),
            default=float(self.default[ticks].mean()),
            best_static=float(statics[best]),
            best_static_kb=int(self.grid[best]),
            oracle=float(self.table[ticks].max(axis=1).mean()),
        )
