"""Rolling efficiency: each ML tick against the default ticks around it.

A subsystem's objective wanders by an order of magnitude as its workload
changes phase, so comparing the mean of all ML ticks with the mean of all
default ticks of a window is only fair while both kinds are spread evenly
over it — and they are not when the ML share changes (10 % in learning, 50 %
in collaboration, 95 % in recommendation).  So each ML tick is paired with the
default ticks that bracket it in time (interleaving guarantees they are
close): its baseline is their mean.  A pair whose two bracketing defaults
disagree by more than `unstable_ratio` straddles a workload change and says
nothing fair about the model: it still gets a feedback row, but is left out of
the statistics.  Over the stable pairs of the last `size` ticks:

    efficiency = sum(observed) / sum(baseline)     (inverted for goal "min")

and `confidence` is the z value of that ratio's distance from 1 (delta
method, positive when ML is better whatever the goal).

An ML tick is resolved when the next default tick arrives, so its feedback row
is written then (at most a few ticks later; `flush` resolves the rest with the
earlier default alone when a model stops).

This module is the one definition of efficiency: the model's `efficiency`
file, `mlfs_model_efficiency{,_confidence}` in `metrics`, the mode switching
and `mlfs report` (through `replay`, from the dataset's rows) all use it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class EfficiencyStats:
    efficiency: float
    confidence: float
    ml_ticks: int
    default_ticks: int
    baseline: float


@dataclass(frozen=True)
class Pair:
    """One resolved ML tick; `payload` is whatever the caller attached."""

    tick: int
    observed: float
    baseline: float
    ratio: float
    stable: bool
    payload: object


class EfficiencyWindow:
    def __init__(self, size: int, goal: str, unstable_ratio: float = 2.0) -> None:
        self.size = size
        self.goal = goal
        self.unstable_ratio = unstable_ratio
        self._last_default: float | None = None
        self._pending: list[tuple[int, float, object]] = []
        self._pairs: collections.deque[tuple[int, float, float]] = collections.deque()
        self._defaults: collections.deque[int] = collections.deque()

    @property
    def baseline(self) -> float:
        """The last default tick's objective (nan before any)."""
        return math.nan if self._last_default is None else self._last_default

    def _ratio(self, observed: float, base: float) -> float:
        if not (math.isfinite(base) and base > 0 and observed > 0):
            return math.nan
        return observed / base if self.goal == "max" else base / observed

    def add_ml(self, tick: int, objective: float, payload: object = None) -> None:
        """An ML tick waits for the next default tick to be judged."""
        self._pending.append((tick, objective, payload))

    def add_default(self, tick: int, objective: float) -> list[Pair]:
        """A default tick resolves every ML tick since the previous one."""
        resolved = self._resolve(objective)
        if math.isfinite(objective):
            self._last_default = objective
            self._defaults.append(tick)
        self._expire(tick)
        return resolved

    def flush(self) -> list[Pair]:
        """Resolve waiting ML ticks with the earlier default alone (model stopping)."""
        return self._resolve(None)

    def _resolve(self, following: float | None) -> list[Pair]:
        before = self._last_default
        if following is not None and not math.isfinite(following):
            following = None
        sides = [v for v in (before, following) if v is not None]
        base = sum(sides) / len(sides) if sides else math.nan
        stable = len(sides) == 2 and min(sides) > 0 and (
            max(sides) / min(sides) <= self.unstable_ratio)
        pairs = []
        for tick, observed, payload in self._pending:
            ratio = self._ratio(observed, base)
            ok = stable and math.isfinite(ratio) and math.isfinite(observed)
            pairs.append(Pair(tick, observed, base, ratio, ok, payload))
            if ok:
                self._pairs.append((tick, observed, base))
        self._pending = []
        return pairs

    def _expire(self, tick: int) -> None:
        oldest = tick - self.size
        while self._pairs and self._pairs[0][0] <= oldest:
            self._pairs.popleft()
        while self._defaults and self._defaults[0] <= oldest:
            self._defaults.popleft()

    def clear(self) -> None:
        self._pairs.clear()
        self._defaults.clear()
        self._pending = []
        self._last_default = None

    def stats(self) -> EfficiencyStats:
        n = len(self._pairs)
        observed = sum(p[1] for p in self._pairs)
        base = sum(p[2] for p in self._pairs)
        if n == 0 or base <= 0 or observed <= 0:
            return EfficiencyStats(math.nan, math.nan, n, len(self._defaults), self.baseline)
        ratio = observed / base  # ML over default, before orienting by goal
        confidence = math.nan
        if n >= 2:
            residual = sum((o - ratio * b) ** 2 for _, o, b in self._pairs) / (n - 1)
            se = math.sqrt(residual * n) / base
            if se > 0:
                confidence = (ratio - 1.0) / se
        if self.goal == "min":
            ratio = 1.0 / ratio
            confidence = -confidence
        return EfficiencyStats(ratio, confidence, n, len(self._defaults), self.baseline)


def replay(rows: Iterable[dict], model: str, goal: str, size: int,
           unstable_ratio: float = 2.0) -> list[tuple[int, EfficiencyStats]]:
    """The window's statistics after each default tick of `model`, from dataset rows.

    A dataset row with `model` == `model` is a tick the model recorded: an ML
    tick when its `controller` is `ml`, else a default tick.  Fed to an
    `EfficiencyWindow` in tick order they give what the model's `efficiency`
    file showed at each default tick (only default ticks change the window,
    so the value holds until the next one).  Two things the dataset does not
    show make the daemon's window differ for up to `size` ticks: a daemon
    restart (its window starts empty) and the cool-down after an efficiency
    collapse (it clears the window); and a default tick on which another
    started model is named in the row is not seen here.
    """
    window = EfficiencyWindow(size, goal, unstable_ratio)
    out: list[tuple[int, EfficiencyStats]] = []
    for row in rows:
        if row.get("model") != model:
            continue
        value = row.get("objective")
        value = math.nan if value is None else float(value)
        if row.get("controller") == "ml":
            window.add_ml(row["tick"], value)
        else:
            window.add_default(row["tick"], value)
            out.append((row["tick"], window.stats()))
    return out
