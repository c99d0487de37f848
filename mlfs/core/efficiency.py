"""Rolling efficiency: ML ticks against default ticks of the same window.

Both kinds of tick interleave, so a phase change or a noisy neighbour hits
both sides alike: the ratio of their means is a fair measure of the model even
on a system whose absolute objective wanders.  `confidence` is Welch's z of
the difference (positive when ML is better, whatever the goal).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class EfficiencyStats:
    efficiency: float
    confidence: float
    ml_ticks: int
    default_ticks: int
    baseline: float


class _Moments:
    __slots__ = ("n", "total", "squares")

    def __init__(self) -> None:
        self.n = 0
        self.total = 0.0
        self.squares = 0.0

    def add(self, value: float, sign: int) -> None:
        self.n += sign
        self.total += sign * value
        self.squares += sign * value * value

    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    def var(self) -> float:
        if self.n < 2:
            return math.nan
        mean = self.total / self.n
        return max(self.squares / self.n - mean * mean, 0.0) * self.n / (self.n - 1)


class EfficiencyWindow:
    """The last `size` ticks of one model, each ML or default."""

    def __init__(self, size: int, goal: str) -> None:
        self.size = size
        self.goal = goal
        self._ticks: collections.deque[tuple[bool, float]] = collections.deque()
        self._ml = _Moments()
        self._default = _Moments()

    def add(self, is_ml: bool, objective: float) -> None:
        if not math.isfinite(objective):
            return
        self._ticks.append((is_ml, objective))
        (self._ml if is_ml else self._default).add(objective, +1)
        if len(self._ticks) > self.size:
            old_ml, old_value = self._ticks.popleft()
            (self._ml if old_ml else self._default).add(old_value, -1)

    def clear(self) -> None:
        self._ticks.clear()
        self._ml = _Moments()
        self._default = _Moments()

    @property
    def baseline(self) -> float:
        """Mean objective of the default ticks in the window (nan if none)."""
        return self._default.mean()

    def ratio(self, observed: float) -> float:
        """`observed` against the baseline, >1 meaning better whatever the goal."""
        base = self.baseline
        if not math.isfinite(base) or base == 0 or observed == 0:
            return math.nan
        return observed / base if self.goal == "max" else base / observed

    def stats(self) -> EfficiencyStats:
        ml, default = self._ml, self._default
        if ml.n == 0 or default.n == 0:
            return EfficiencyStats(math.nan, math.nan, ml.n, default.n, default.mean())
        efficiency = self.ratio(ml.mean())
        var = (ml.var() if ml.n > 1 else 0.0) / ml.n + (
            default.var() if default.n > 1 else 0.0
        ) / default.n
        diff = ml.mean() - default.mean()
        if self.goal == "min":
            diff = -diff
        if var > 0 and math.isfinite(var):
            confidence = diff / math.sqrt(var)
        else:
            confidence = math.nan
        return EfficiencyStats(efficiency, confidence, ml.n, default.n, default.mean())
