"""The mode machine's decisions from the efficiency: promote, demote, collapse.

Pure and FUSE-free: `transition` takes the mode and the efficiency window's
statistics and returns the switch to make (or None); the proxy calls it on
every tick past the dwell and applies the switch.  Every decision rests on
the anytime-valid interval of `mlfs.core.sequential`, so it stays valid
however often the proxy looks:

- unknown (nan, fewer than `sequential.MIN_EPISODES` episodes, no
  measurable spread, or more clean ticks in episodes that straddled a phase
  change than counted ones: phases shorter than an episode, where the few
  pairs that look clean are coincidences): no promotion, no demotion, no
  collapse; the model stays where it is (a new one in learning, at the
  learning share);
- collapse to emergency: only when the whole interval lies below
  `collapse_below` (a confident collapse; the subsystem's critical state is
  the proxy's other safety net);
- learning -> collaboration: the estimate reaches `to_collaboration` and the
  interval's lower end is at least `demote_below` (confidently not harmful);
- collaboration -> recommendation: the estimate reaches `to_recommendation`
  and the interval lies above 1 (a win the data supports);
- collaboration / recommendation -> learning: the estimate is below
  `demote_below` and the interval lies below 1 (a loss the data supports).

The `recommendation_confidence` and `demote_confidence` settings of the older
fixed-z rule are not used by it (docs/ABI.md, "Mode switching").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlfs.core.efficiency import EfficiencyStats
from mlfs.core.sequential import Interval, interval


@dataclass(frozen=True)
class Switch:
    mode: str
    why: str
    cause: str | None = None


def efficiency_interval(stats: EfficiencyStats) -> Interval:
    """The window's efficiency as the mode machine sees it (known or unknown)."""
    if stats.straddled > stats.ml_ticks + stats.reverse_ticks:  # phases shorter than
        return Interval(stats.efficiency, -math.inf, math.inf, stats.episodes, False)
    return interval(stats.efficiency, stats.confidence, stats.episodes)


def transition(mode: str, stats: EfficiencyStats, config) -> Switch | None:
    """The switch the efficiency supports from `mode` (learning, collaboration or
    recommendation), or None.  `config`: the `[modes]` settings."""
    iv = efficiency_interval(stats)
    if not iv.known:
        return None
    eff = iv.estimate
    said = (f"(interval {iv.text} over {iv.episodes} episodes, "
            f"z={stats.confidence:.1f})")
    if iv.upper < config.collapse_below:
        return Switch("emergency", f"efficiency collapsed to {eff:.3f} {said}", "collapse")
    if mode == "learning":
        if eff >= config.to_collaboration and iv.lower >= config.demote_below:
            return Switch("collaboration",
                          f"efficiency {eff:.3f} >= {config.to_collaboration} {said}")
        return None
    if mode == "collaboration" and eff >= config.to_recommendation and iv.lower > 1.0:
        return Switch("recommendation",
                      f"efficiency {eff:.3f} >= {config.to_recommendation} {said}")
    if eff < config.demote_below and iv.upper < 1.0:
        return Switch("learning", f"efficiency {eff:.3f} < {config.demote_below} {said}")
    return None
