"""The statistics every row is reported with: percentiles, median with spread, the row."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of a non-empty list."""
    vals = sorted(values)
    if len(vals) == 1:
        return vals[0]
    k = (len(vals) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def summarize(values: list[float]) -> dict[str, Any]:
    """Median, min-max and quartiles of repetitions: the spread is the point."""
    if not values:
        raise ValueError("no repetitions to summarize")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "q1": percentile(values, 25),
        "q3": percentile(values, 75),
        "n": len(values),
        "values": [round(v, 6) for v in values],
    }


@dataclass
class Row:
    """One line of the report: measured figures, the same-run reference, the ratio."""

    key: str
    what: str
    measured: dict[str, dict[str, Any]]
    reference: dict[str, dict[str, Any]] | None
    ratio: dict[str, Any] | None
    target: str
    met: bool | None
    note: str = ""
    skipped: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def latency_summary(rounds: list[list[float]]) -> dict[str, dict[str, Any]]:
    """Per-round p50 and p99 (ms): the rounds are the repetitions."""
    return {
        "p50 ms": summarize([percentile(r, 50) * 1e3 for r in rounds]),
        "p99 ms": summarize([percentile(r, 99) * 1e3 for r in rounds]),
    }
