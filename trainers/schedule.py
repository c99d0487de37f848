"""What a trainer writes to `recommend`, and when it leaves control to its policy.

Shared by the mount worker (`trainers.worker`) and the virtual-time benchmark
(`tests/bench/learning.py`), so the benchmark measures the strategy users run.

The proxy applies the newest trainer input: a recommendation sent after the
policy overrides it for its `ttl`.  So:

* learning — explore: send a setting worth trying (`KnobLearner.explore`,
  never the default) with `ttl` ≈ one ML tick at the learning share.  Once a
  knob-aware policy runs, only a decaying share of learning's ML ticks
  explores (down to 20 %, `exploration_chance`): the policy must also earn
  the efficiency that promotes the model;
* collaboration / recommendation — the policy decides each ML tick in-process;
  only when no policy is live does the trainer send its best setting;
* emergency — the default runs; an emergency caused by this trainer's silence
  ends at its next valid input, so without a policy to upload it offers an
  exploration now and then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mlfs.trainers.knob.learner import KnobLearner, candidate_values

from mlfs.abi import episode_ticks

LEARNING_TTL = 10  # ticks: one ML tick at the default 10 % learning share
#: a trainer uploads its policy again after this long without input: the proxy calls a
#: trainer silent after `[modes] silence_seconds` (60 by default) and pins emergency
POLICY_KEEPALIVE_SECONDS = 30.0
FALLBACK_TTL = 3
#: chance per decision, in collaboration and recommendation with a live policy, of a
#: FALLBACK_TTL-tick exploration (within the trust region): about 3 % of ticks (0.7 %: seed 8 at
#: 0.942 of the oracle, 1.2 %: seed 2 at 0.934; 1 %: every seed 0-19 >= 0.955)
KEEP_EXPLORING = 0.01
#: the chance instead while a setting next to the best one measured here is not yet measured
#: in this kind of state (`KnobLearner.uncovered`): a model promoted before it saw a phase
#: under anything but the default otherwise took thousands of ticks to step off it there
#: (learning bench seed 8: the default 128 KiB in every strided phase until tick 4,399, at
#: 0.937 of the oracle; with 2 %: 0.961, every seed 0-59 >= 0.959; 5 % paid more for its
#: explorations than it won: median 0.966 against 0.971; docs/results/learning-34.md)
KEEP_COVERING = 0.02


@dataclass(frozen=True)
class Steer:
    """One recommendation to write."""

    knobs: dict
    expect: float
    ttl: int
    exploring: bool

    def line(self) -> str:
        parts = [f"{k}={v}" for k, v in self.knobs.items()]
        if math.isfinite(self.expect):
            parts.append(f"expect={self.expect:.6g}")
        parts.append(f"ttl={self.ttl}")
        return " ".join(parts) + "\n"


class TrainerSchedule:
    """`learning_ttl`: ticks one exploration lasts (fewer: more settings tried per
    minute, each measured on fewer ticks; a real device with slow ticks wants fewer),
    never fewer than one of the proxy's episodes of the controlled knobs' carry-over."""

    def __init__(self, learner: KnobLearner, seed: int = 0,
                 learning_ttl: int = LEARNING_TTL) -> None:
        if learning_ttl < 1:
            raise ValueError("learning_ttl must be >= 1 tick")
        self.learner = learner
        self.rng = np.random.default_rng(seed)
        settle = max(learner.space.settle.values(), default=0)
        #: at least one of the proxy's ML episodes (`episode_ticks`): a shorter
        #: exploration of a carry-over knob ends before its setting settled and leaves
        #: the fit nothing.  Writeback's 5-tick explorations of the dirty ratios
        #: (settle 5) held each setting 1 to 6 ticks: of 35 explorations per run one
        #: row settled, and in no run did a booster split on a knob, so no policy in
        #: 240 s of training (bench-results/incumbent-writeback-capped)
        self.learning_ttl = max(learning_ttl, episode_ticks(settle))
        #: rows per setting and state that exploration's coverage asks for: half the
        #: rows one exploration leaves the fit, its ticks less the longest carry-over
        #: (`KnobSpace.settle`: the ticks before a setting settled are left out of the
        #: fit and of coverage's counts).  Half, because at a learning share below 1
        #: some of its ticks run the default, so a whole one may leave fewer.  Half of
        #: the ticks alone asked a carry-over knob for every settled row of a clean
        #: exploration: the dirty ratios (settle 5, 10-tick explorations) got 2-6
        #: settled rows at 2 % in the checkpoint phase from four or five explorations,
        #: so 2 % stayed uncovered, 1 % (its neighbour, the phase's best by every sweep)
        #: was never next to a measured setting, and never tried (bench-results/
        #: incumbent-dirty).  Knobs without carry-over: half the ticks, as before.
        self.cover = max(1, (self.learning_ttl - settle) // 2)

    def exploration_rate(self) -> float:
        """Share of learning-mode ML ticks spent exploring once a policy runs."""
        return float(np.clip(50.0 / (50.0 + self.learner.explored_rows), 0.2, 1.0))

    def exploration_chance(self) -> float:
        """The chance per decision of starting an exploration that keeps
        `exploration_rate` the share of learning-mode ML ticks exploring.

        A decision not to explore hands one tick to the policy and is taken again
        on the next; an exploration holds `learning_ttl` ticks.  So a chance p
        explores p * ttl / (p * ttl + 1 - p) of the ticks, and the share r asks
        for p = r / (ttl * (1 - r) + r).  (Drawn with p = r, a floor of 20 % explored
        71 % of learning's ML ticks: the efficiency that promotes measured mostly
        explorations.)"""
        share, ttl = self.exploration_rate(), self.learning_ttl
        return share / (ttl * (1.0 - share) + share)

    @staticmethod
    def ticks_to_next_decision(steer: Steer | None) -> int:
        """When to decide again: after a recommendation's `ttl`, or on the next tick
        when this decision left the tick to the policy or the default.  The worker
        and the learning bench both pace by it, so the chances above are what users
        run (the worker once waited a whole ttl after leaving a tick to the policy:
        a third of the explorations after a promotion the bench measured)."""
        return 1 if steer is None else steer.ttl

    def decide(self, mode: str, *, policy_live: bool) -> Steer | None:
        """The recommendation to send now, or None (the policy or the default decides)."""
        learner = self.learner
        latest = learner.latest_features
        if mode == "emergency":
            if learner.fitted and learner.knob_aware:
                return None  # re-uploading the policy is the trainer's sign of life
            return self._explore(latest)
        if mode == "learning":
            if policy_live and self.rng.random() >= self.exploration_chance():
                return None
            return self._explore(latest)
        if not policy_live and learner.fitted:
            knobs, expect = learner.recommend(latest)
            return Steer(knobs, expect, FALLBACK_TTL, exploring=False)
        draw = self.rng.random()
        if (policy_live and learner.fitted and learner.knob_aware
                and (draw < KEEP_EXPLORING
                     or draw < KEEP_COVERING and learner.uncovered(latest, self.cover))):
            # a policy promoted early stops learning unless a few ticks still explore,
            # within the trust region: a bounded cost for what it has not tried
            steer = self._explore(latest)
            return Steer(steer.knobs, steer.expect, FALLBACK_TTL, exploring=True)
        return None

    def _explore(self, latest) -> Steer:
        learner = self.learner
        if learner.knob_aware:
            knobs = learner.explore(latest, self.rng, cover=self.cover)
            return Steer(knobs, learner.predict(latest, knobs), self.learning_ttl,
                         exploring=True)
        return Steer(self._near_default(), math.nan, self.learning_ttl, exploring=True)

    def _near_default(self) -> dict:
        """Before the model knows anything about the knobs, explore a trust region.

        Uniform over the whole range would try settings 20x worse than the
        default (readahead 0 on a sequential scan) and collapse the measured
        efficiency before anything was learnt; values within a factor of a few
        of the default are informative and rarely disastrous.
        """
        knobs = {}
        for name, spec in self.learner.knob_specs.items():
            values = candidate_values(spec)
            if spec.get("type") != "choice":
                default = int(spec["default"])
                lo, hi = (default / 4, default * 8) if default > 0 else (0, 64)
                near = [v for v in values if lo <= int(v) <= hi and v != default]
                values = near or values
            knobs[name] = values[int(self.rng.integers(len(values)))]
        return knobs
