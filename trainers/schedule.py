"""When a trainer explores, recommends, or leaves control to its policy.

Shared by the mount worker and the virtual-time benchmark, so both follow one
strategy.  The proxy applies the newest trainer input: a recommendation sent
after the policy overrides it for its `ttl`.  So exploration is sent as short
recommendations only while the model still needs data (learning mode, and a
small share later), and otherwise the uploaded policy decides each ML tick
in-process.  Exploring too much would drag the measured efficiency below the
default's and hold the model in learning.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .learner import KnobLearner


class TrainerSchedule:
    """Decide, before each tick (or on each event), what to write to `recommend`."""

    #: an exploration should cover about one ML tick: ttl ~ 1 / the mode's ML share
    TTL = {"learning": 10, "collaboration": 2, "recommendation": 1}

    def __init__(self, learner: KnobLearner, seed: int = 0, warmup_explorations: int = 60,
                 explore_share: dict[str, float] | None = None) -> None:
        self.learner = learner
        self.rng = np.random.default_rng(seed)
        self.warmup = warmup_explorations
        self.share = explore_share or {"learning": 0.3, "collaboration": 0.05,
                                       "recommendation": 0.02, "emergency": 0.0}
        self.explorations = 0

    def next_recommendation(self, mode: str, features: Mapping | None, *,
                            pending: bool) -> str | None:
        """A `recommend` line to write now, or None (leave it to the policy)."""
        if pending or mode == "emergency":
            return None
        if self.explorations < self.warmup or not self.learner.fitted:
            return self._explore(features, mode)
        if self.rng.random() < self.share.get(mode, 0.0):
            return self._explore(features, mode)
        return None

    def _explore(self, features: Mapping | None, mode: str) -> str:
        self.explorations += 1
        knobs = self.learner.explore(features, self.rng)
        pairs = " ".join(f"{k}={v}" for k, v in knobs.items())
        return f"{pairs} ttl={self.TTL.get(mode, 1)}"
