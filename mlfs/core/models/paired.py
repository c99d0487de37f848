"""The paired estimate behind the efficiency: a ratio of sums, its error, and levels.

`mlfs.core.models.efficiency` keeps the window (which ticks are paired with
which); this module turns its counted pairs into a number and its standard
error: `paired` for one kind of pair (the ratio of sums and its error over
episodes), `combine` for forward and reverse pairs together, level by level.

Balanced against the phase's own profile
----------------------------------------
A counted pair needs a default, an ML and a default episode inside one
workload phase, so where phases are a few episodes long its ML ticks sit
in a phase's middle and its defaults at the phase's edges.  A phase whose
middle differs from its edges (a job that starts and ends slowly; fio's
checkpoint writer, whose MiB/s runs a ~10 s cycle from the visit's start)
is then read as the model's doing: a policy running the default's own
setting read 1.17 in checkpoint (50 pairs, bench-results/dirty-win-13, run 1),
and a simulated phase whose middle runs 1.5 times its edges turned a true
1.20 into 1.33 in every mode (tests/unit/test_efficiency_carryover.py).
So with carry-over the window also counts *reverse* pairs: a clean default
tick against the clean ML ticks that bracket it (the same span and
stability rules), which sit the other way round in the phase.  With a
forward ratio F = gain x profile and a reverse ratio R = profile / gain,
sqrt(F / R) cancels the profile (the crossover design's ABA against BAB);
the simulated phase reads 1.19.

A visit holds one kind of sandwich or the other, seldom both, so the two
kinds can fall in different phases (dirty-win-13, run 2: 30 of the 35
forward pairs in tempfiles, all 23 reverse ones in checkpoint), and one
sqrt(F / R) would blend two phases' gains (1.125 against an equal-time
1.01).  So the pairs are grouped by the default's level (sorted by it, a
group ends where the level passes `unstable_ratio` times the group's
lowest: the rule that already calls two defaults one workload level), and
per group

    efficiency(group) = sqrt(F / R), or F, or 1 / R   (what the group has)
    efficiency        = the groups' mean weighted by their defaults' sum

(the defaults' sum: the baselines of the group's forward pairs and the
defaults of its reverse ones, which weighs a group as the plain ratio of
sums weighed its pairs).  Without reverse pairs it is sum(observed) /
sum(baseline) exactly as before.  Replayed on the judged rows of six runs
(docs/results/dirty-ratios.md, seventh try) it read within 0.02-0.07 of the
interleaved equal-time ratio, where F alone was off by up to 0.50 (1.54
against 1.04: no tempfiles pair counted); reverse pairs also bring in the
phases where no forward pair fits.  The confidence is the delta method's
over the groups, each group's error counted over its episodes.  A group with
one kind of pair only keeps its phase's profile uncorrected, so it adds the
doubt the profile measured in the groups that have both kinds (ln sqrt(F x R),
its mean square; with no such group, a doubt as large as its ratio): replayed
on the nine judged stretches of bench-results/dirty-win-12..15 (estimates off
by up to 0.17), the confidence was above 2 in absolute value in six, up to
10.4, and is now within +-1.03 (none would have been promoted or demoted on
them).  Reverse pairs need a default episode between two ML
episodes: above a share of 0.5 the ML runs give them; below it
`Interleaving` sandwiches a default episode between two ML ones, as
`Sandwich` does the other way round.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Collection, Iterable
from typing import NamedTuple


class Counted(NamedTuple):
    """One counted tick: an ML tick against the defaults around it (forward), or a
    default tick against the ML ticks around it (reverse); `before` and `after` are
    the ticks of those two brackets."""

    tick: int
    observed: float
    baseline: float
    before: int | None
    after: int | None


def _by_tick(counted: Counted) -> int:
    return counted.tick


def runs(ticks: Iterable[int]) -> int:
    """How many runs of consecutive ticks: the episodes `paired` counts as samples."""
    runs, last = 0, None
    for tick in sorted(ticks):
        if last is None or tick - last > 1:
            runs += 1
        last = tick
    return runs



def paired(pairs: Collection[Counted], noise_variance: float | None = None
            ) -> tuple[float, float] | None:
    """sum(observed) / sum(baseline) and its standard error; None without a
    usable pair.

    The error is the delta method's over *episodes*, not ticks: pairs on
    consecutive ticks (one episode's clean ticks, or the clean defaults of
    one default episode) share their brackets and their place in the
    workload's phase, so they are one sample (a cluster-robust variance).
    Counted tick by tick, one tempfiles episode of 10 pairs read 1.23 with
    the file's confidence at 10.4 where the experiment said 0.94
    (bench-results/dirty-win-15, run 2).  Without carry-over most episodes are
    one tick and this is the plain per-pair error (in recommendation mode the
    ML ticks between two probes are one).  nan below two episodes.

    Two neighbouring episodes may share a bracket: in recommendation every
    probe is the baseline of the run of ML ticks before it and of the run
    after it (in collaboration every default tick of the two ML ticks around
    it), so the probes' noise enters two episodes with the same sign and the
    episodes are not independent samples.  Their covariance is counted
    (a lag-one term, as Newey and West's estimator has, for the neighbours
    that share a bracket; a negative estimate of it is noise and counts as
    none), and the variance never reads below `noise_variance`'s floor.
    Without them the error read half what it was: in `mlfs demo` a policy
    1.3 % better than the default in random_pread read 0.952 over 8 episodes,
    its interval's upper end below 1, and was demoted (docs/results/learning-34.md,
    "71a4517 and 50069c5: the error of a ratio whose probes are shared").
    """
    # one pass: the sums, the episodes (runs of consecutive ticks) with their
    # brackets, and what the measurement-noise floor needs
    observed = base = observed_sq = 0.0
    brackets: dict[int | None, float] = collections.defaultdict(float)
    episodes: list[list] = []  # [observed, baseline, bracket before, bracket after]
    last = None
    for p in sorted(pairs, key=_by_tick):
        observed += p.observed
        base += p.baseline
        observed_sq += p.observed * p.observed
        brackets[p.before] += p.baseline / 2
        brackets[p.after] += p.baseline / 2
        if last is None or p.tick - last > 1:
            episodes.append([0.0, 0.0, p.before, p.after])
        episode = episodes[-1]
        episode[0] += p.observed
        episode[1] += p.baseline
        episode[3] = p.after
        last = p.tick
    if not pairs or base <= 0 or observed <= 0:
        return None
    ratio = observed / base
    g = len(episodes)
    se = math.nan
    if g >= 2:
        residuals = [o - ratio * b for o, b, _, _ in episodes]
        variance = sum(r * r for r in residuals)
        shared = sum(residuals[i] * residuals[i + 1] for i in range(g - 1)
                     if episodes[i][3] is not None
                     and episodes[i][3] == episodes[i + 1][2])
        variance = (variance + 2 * max(0.0, shared)) * g / (g - 1)
        if noise_variance is not None:
            # the floor: each counted tick's noise, and each bracket's once however
            # many pairs share it (it is half of each pair's baseline)
            floor = noise_variance * (observed_sq + ratio * ratio * sum(
                w * w for w in brackets.values()))
            variance = max(variance, floor)
        se = math.sqrt(variance) / base
    return ratio, se


def levels(pairs: Collection[Counted], reverse: Collection[Counted], unstable_ratio: float
           ) -> list[tuple[list, list]]:
    """The forward and reverse pairs grouped by the default's level: sorted by it,
    a group ends where the level passes `unstable_ratio` times the group's lowest
    (the rule that calls two defaults one workload level)."""
    ranked = sorted([(p.baseline, 0, p) for p in pairs]
                    + [(p.observed, 1, p) for p in reverse])
    groups: list[tuple[list, list]] = []
    floor = None
    for level, kind, counted in ranked:
        if floor is None or level > floor * unstable_ratio:
            groups.append(([], []))
            floor = level
        groups[-1][kind].append(counted)
    return groups


def combine(pairs: Collection[Counted], reverse: Collection[Counted],
            noise_variance: float | None, unstable_ratio: float) -> tuple[float, float] | None:
    """The efficiency (ML over default, before any goal inversion) and its standard
    error from forward and reverse pairs: per workload level (`levels`) sqrt(F / R)
    where a level has both kinds, F or 1 / R where it has one; the levels weighted by
    their defaults' sum; a one-sided level in doubt as the two-sided ones measured the
    profile to be (the module's docstring).  None without a usable level."""
    found = []  # (ratio, se, mass, one-sided)
    profiles = []  # ln of sqrt(F * R): a two-sided level's own profile
    for forward_pairs, reverse_pairs in levels(pairs, reverse, unstable_ratio):
        forward = paired(forward_pairs, noise_variance)
        backward = paired(reverse_pairs, noise_variance)
        if forward is None and backward is None:
            continue
        if backward is None:
            ratio, se = forward
        elif forward is None:  # ML against the default, from the default's side
            ratio, se = 1.0 / backward[0], backward[1] / backward[0] ** 2
        else:  # balanced: the phase's own profile cancels
            ratio = math.sqrt(forward[0] / backward[0])
            se = ratio / 2 * math.sqrt((forward[1] / forward[0]) ** 2
                                       + (backward[1] / backward[0]) ** 2)
            profiles.append(0.5 * math.log(forward[0] * backward[0]))
        mass = (sum(p.baseline for p in forward_pairs)
                + sum(p.observed for p in reverse_pairs))  # the defaults' sum
        found.append((ratio, se, mass, forward is None or backward is None))
    # a one-sided level carries its phase's profile uncorrected: as much doubt
    # as the two-sided levels measured it to be (none measured: fully in doubt)
    bias = (sum(p * p for p in profiles) / len(profiles)) if profiles else 1.0
    total = weighted = variance = 0.0
    for ratio, se, mass, one_sided in found:
        total += mass
        weighted += mass * ratio
        # a level resting on one episode has no measured spread: fully in doubt
        level_variance = se ** 2 if math.isfinite(se) else ratio ** 2
        if one_sided:
            level_variance += ratio ** 2 * bias
        variance += mass ** 2 * level_variance
    if total <= 0:
        return None
    return weighted / total, math.sqrt(variance) / total
