"""Anytime-valid decisions: the normal-mixture boundary, shared by proxy and trainer.

Two parties decide on evidence they look at again and again: the proxy's mode
machine (mlfs/core/models/modes.py) on the efficiency, every tick, and the trainer's
challenge of an adopted fleet policy (`KnobLearner.challenge`), every refit.
Both use the boundary below, so it lives outside the core, where a trainer may
import it (a rule defined once; the trainers' import contract allows it).

The proxy reads the efficiency on every tick and acts the moment a threshold
is crossed.  A fixed z threshold (2.0) is valid for one look at a sample size
fixed in advance; looked at on every tick it is crossed by chance far more
often than its nominal 2.3 % (the peeking problem of online experiments).
The cure online-experimentation platforms use (Optimizely's Stats Engine, the
mixture SPRT of Johari, Pekelis and Walsh; confidence sequences of Howard,
Ramdas, McAuliffe and Sekhon) is a boundary that widens with the number of
samples as a test martingale allows:

For n independent Gaussian samples of mean theta and variance sigma^2, with
Z_n the usual z statistic of their mean, Robbins' normal mixture over
theta ~ N(0, tau^2) is the martingale

    M_n = (1 + a)^(-1/2) * exp(Z_n^2 * a / (2 (1 + a))),   a = n tau^2 / sigma^2,

and by Ville's inequality P(M_n >= 1/alpha for some n) <= alpha.  So

    |Z_n| >= z_alpha(n) = sqrt((1 + a) / a * (ln(1 + a) + 2 ln(1 / alpha)))

is crossed, when theta = 0, with probability at most alpha over all n at once
however often one looks; the estimate +- z_alpha(n) * se is a confidence
sequence.  `tau^2 / sigma^2 = 1 / n0` makes the boundary tightest around
n0 samples (Howard et al., section 3.5).

Samples are episodes, not ticks (`EfficiencyStats.episodes`: runs of
consecutive counted ticks, the unit the confidence's error is computed over),
and sigma is the window's own estimate (plug-in), so the guarantee holds as
far as the episodes are independent and their ratio near Gaussian; the proxy
also reads a sliding window, not a growing sample.  Both are approximations,
stated in docs/ABI.md with the error rates measured on the scripted subsystem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the error rate of each one-sided decision (promote, demote, collapse)
ALPHA = 0.05
#: the boundary is tightest around this many episodes (tau^2 / sigma^2 = 1 / N0): a
#: clear win shows within a few windows of learning (a few ML episodes per 100 ticks)
N0 = 5
#: fewer episodes than this: the estimate is "unknown", whatever it reads
MIN_EPISODES = 4


def boundary(n: int, alpha: float = ALPHA, n0: float = N0) -> float:
    """z_alpha(n): the |z| that n samples must reach for a decision valid at any n."""
    if n < 1:
        return math.inf
    a = n / n0
    return math.sqrt((1 + a) / a * (math.log(1 + a) + 2 * math.log(1 / alpha)))


@dataclass(frozen=True)
class Interval:
    """The efficiency's anytime-valid interval; `known` False: too little to say."""

    estimate: float
    lower: float
    upper: float
    episodes: int
    known: bool

    @property
    def text(self) -> str:
        if not self.known:
            return "unknown"
        return f"[{self.lower:.3f}, {self.upper:.3f}]"


def interval(efficiency: float, confidence: float, episodes: int,
             alpha: float = ALPHA, min_episodes: int = MIN_EPISODES) -> Interval:
    """The confidence sequence of the efficiency from its point estimate, its z value
    (positive when the model is better: `EfficiencyStats.confidence`) and its episodes.

    Unknown when the estimate is nan, its z is not finite (one episode, or pairs
    whose spread cannot be measured), or it rests on fewer than `min_episodes`
    episodes.  The standard error is (efficiency - 1) / z; at z = 0 exactly
    nothing is learnt about it and the estimate is unknown too."""
    unknown = Interval(efficiency, -math.inf, math.inf, episodes, False)
    if (not math.isfinite(efficiency) or not math.isfinite(confidence) or confidence == 0
            or episodes < min_episodes):
        return unknown
    se = (efficiency - 1.0) / confidence
    if not (se > 0 and math.isfinite(se)):
        return unknown
    half = boundary(episodes, alpha) * se
    return Interval(efficiency, efficiency - half, efficiency + half, episodes, True)
