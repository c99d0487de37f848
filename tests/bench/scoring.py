"""The one rule for "overall" (issue 33): equal work per phase.

A job made of the same amount of work in every phase, where "an amount of
work" is what the reference (the default) does in one unit of time in that
phase, takes time sum_p 1/r_p under a condition whose per-phase speed-up
over the reference is r_p, against n under the reference.  Its speed-up is
then n / sum_p 1/r_p: the harmonic mean of the per-phase ratios.  Every
sweep, evaluation, summary and README table scores "overall" with
`overall`; a phase that runs slower counts for the time it takes, and a fast
phase's gain cannot hide a slow one's loss.

Not to be confused with the equal-*time* figure (`equal_time`): the
throughput of a job that spends the same time in every phase, i.e. the
ratio of the summed per-phase rates.  It weighs each phase by how fast the
reference runs it (what the proxy's paired-tick efficiency weighs by), so
a phase with a large rate dominates it.  It is reported beside "overall",
never instead of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def overall(ratios: Mapping[str, float] | Iterable[float]) -> float:
    """The harmonic mean of the per-phase speed-up ratios (equal work per phase).

    `ratios` is {phase: ratio} or the ratios themselves.  0.0 when a phase
    did no work (ratio <= 0: the job would never end); nan without phases.
    """
    values = list(ratios.values()) if isinstance(ratios, Mapping) else list(ratios)
    if not values:
        return math.nan
    if any(r <= 0 for r in values):
        return 0.0
    return len(values) / sum(1.0 / r for r in values)


def phase_ratios(rates: Mapping[str, float], reference: Mapping[str, float],
                 phases: Iterable[str] | None = None) -> dict[str, float]:
    """{phase: rate / reference rate} over `phases` (default: the reference's); 0.0 where
    the reference did nothing."""
    keys = list(phases) if phases is not None else [p for p in reference if p != "overall"]
    return {p: (rates[p] / reference[p] if reference[p] else 0.0) for p in keys}


def equal_time(rates: Mapping[str, float], reference: Mapping[str, float],
               phases: Iterable[str] | None = None) -> float:
    """The equal-*time* ratio: sum of the per-phase rates over the reference's sum."""
    keys = list(phases) if phases is not None else [p for p in reference if p != "overall"]
    base = sum(reference[p] for p in keys)
    return sum(rates[p] for p in keys) / base if base else 0.0


def oracle_share(mlfs: float, oracle: float) -> float:
    """The share of the oracle's gain over the default that mlfs reaches:
    (mlfs - 1) / (oracle - 1), both "overall" ratios to the default; nan when the
    oracle gains nothing (oracle <= 1)."""
    return (mlfs - 1.0) / (oracle - 1.0) if oracle > 1.0 else math.nan
