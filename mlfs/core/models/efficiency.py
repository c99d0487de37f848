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

Knobs with carry-over (`Knob.settle_ticks`) are measured in episodes
(`mlfs.core.models.episodes` says how and why); the pairing rules below are what
episodes need of the window.

Phases shorter than the gap between default episodes
----------------------------------------------------
The stability test looks only at the two bracketing defaults.  When a
mode's share puts several ML episodes between two default episodes (learning
share 0.8 with k = 5: about 40 ML ticks), a workload phase can begin and end
inside that gap: both defaults fall in one phase, the ML ticks between them
in another, and they are judged against the wrong baseline.  Measured on
fio's writeback phases (15 s) before this rule: the file read 0.026 and
`nan` against an interleaved x0.94-1.07 (bench-results/writeback-win-2).  So,
for carry-over knobs:

- a pair counts only if its two bracketing clean defaults are at most
  `pair_span(k)` = 3k + 1 ticks apart: what one ML episode between two
  default episodes gives (k clean defaults, the ML episode's 2k ticks, the
  default episode's k settling ticks; k // 2 more since reverse pairs, see
  "Balanced against the phase's own profile" below).  A phase has to begin and end
  within the 3k ticks between them to slip through unseen, and then only if
  the phases on either side have the same level; a longer one changes one
  of the two defaults and the unstable-ratio test sees it.  So phases of
  more than 3k ticks are the condition for an honest estimate (15 s for the
  dirty ratios at 1 s ticks: the training phases of the writeback
  experiment were exactly that long).
- so that every mode has such pairs, the proxy *sandwiches*: above a share
  of 0.5, where ML episodes come in runs, a default episode that opens a gap
  is followed by one ML episode and then a second default episode borrowed
  from the end of the run (`Sandwich`); the share per mode stays exact.
  Only the sandwiched ML episodes are counted: a fraction 1 / (run length)
  of the ML ticks (about 1 in 8 at a share of 0.8, 1 in 38 at 0.95), so the
  estimate needs more ticks to be confident, which is the price of
  comparing only like with like.  The other ML ticks still get their
  feedback rows (with the baseline they had).

Balanced against the phase's own profile
----------------------------------------
With carry-over the window also counts *reverse* pairs: a clean default tick
against the clean ML ticks that bracket it, which sit the other way round in a
workload phase; per level sqrt(F / R) cancels the phase's own profile
(`mlfs.core.models.paired` says how and why, with the measurements).


"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from mlfs.abi import Settling
from mlfs.base.sequential import MIN_EPISODES

from .episodes import pair_span
from .paired import Counted, combine, paired, runs


@dataclass(frozen=True)
class EfficiencyStats:
    efficiency: float
    confidence: float
    ml_ticks: int
    default_ticks: int
    baseline: float
    #: default ticks counted against the ML ticks around them (carry-over knobs only)
    reverse_ticks: int = 0
    #: independent samples behind `confidence`: runs of consecutive counted ticks
    #: (forward and reverse), the unit the mode machine's sequential test counts
    episodes: int = 0
    #: clean ticks left out because their episode straddled a phase change (carry-over
    #: knobs): when they outnumber the counted ones, phases are shorter than an episode
    #: and the estimate is a guess (`mlfs.core.models.modes`: unknown)
    straddled: int = 0


@dataclass(frozen=True)
class Pair:
    """One resolved ML tick; `payload` is whatever the caller attached."""

    tick: int
    observed: float
    baseline: float
    ratio: float
    stable: bool
    payload: object


#: ticks of measurement noise kept (`EfficiencyWindow.noise_variance`), and the fewest used
NOISE_SAMPLES = 256
MIN_NOISE_SAMPLES = 16
#: the median absolute deviation of a normal variable in standard deviations
_MAD_TO_SIGMA = 0.6745



class EfficiencyWindow:
    """The last `size` ticks' pairs; `max_span` is `pair_span` (None: no limit).

    With a span (carry-over knobs) the window also keeps *reverse* pairs: a
    clean default tick against the clean ML ticks that bracket it (see
    "Balanced against the phase's own profile" above).
    """

    def __init__(self, size: int, goal: str, unstable_ratio: float = 2.0,
                 max_span: int | None = None) -> None:
        self.size = size
        self.goal = goal
        self.unstable_ratio = unstable_ratio
        #: ticks of episodes that straddled a phase change (`_straddles`), left out
        self._straddled: collections.deque = collections.deque()
        self.max_span = max_span
        self._last_default: float | None = None
        self._last_default_tick: int | None = None
        self._pending: list[tuple[int, float, object, bool]] = []
        #: counted pairs: (tick, observed, baseline, bracket before, bracket after), the
        #: brackets the ticks of the two sides (`paired`: neighbours sharing one)
        self._pairs: collections.deque[Counted] = collections.deque()
        self._defaults: collections.deque[int] = collections.deque()
        # reverse pairs: clean defaults waiting for the next clean ML tick
        self._last_ml: tuple[int, float] | None = None
        self._pending_defaults: list[tuple[int, float]] = []
        self._reverse: collections.deque[Counted] = collections.deque()
        #: |ln| of the ratio of two clean default ticks in a row, the last NOISE_SAMPLES:
        #: what one tick's measurement noise is (`noise_variance`); and of two apart
        #: (recommendation's probes), the workload's drift between them included
        self._tick_noise: collections.deque[float] = collections.deque(maxlen=NOISE_SAMPLES)
        self._far_noise: collections.deque[float] = collections.deque(maxlen=NOISE_SAMPLES)
        #: `stats`' last answer, (since, stats), until the window changes (`_changed`): the
        #: proxy reads it on every tick, and in recommendation 19 ticks in 20 change nothing
        self._stats_cache: tuple[int | None, EfficiencyStats] | None = None
        #: the evidence starts after this tick (`restart`): a mode switch's
        self._since: int | None = None

    def restart(self, tick: int) -> None:
        """Count only what is judged after `tick` from now on (a mode switch: the
        sequential test's sample starts again, so its interval stays valid however
        often it is read).  ML ticks still waiting for their default are kept, so
        their feedback rows are written; they are not counted."""
        self._since = tick
        self._drop_through(tick)
        self._changed()

    @property
    def noise_variance(self) -> float | None:
        """One tick's relative measurement variance, from clean default ticks in a row
        (the median absolute log ratio, so a phase change between two of them does not
        count).  Until MIN_NOISE_SAMPLES such pairs were seen (a model pinned into
        recommendation at once: its probes are never in a row), from consecutive clean
        default ticks further apart, which also count the drift between them (so it
        errs on the safe side); None below MIN_EPISODES of those."""
        kept = self._tick_noise
        if len(kept) < MIN_NOISE_SAMPLES:
            kept = self._far_noise
            if len(kept) < MIN_EPISODES:
                return None
        sigma = statistics.median(kept) / (_MAD_TO_SIGMA * math.sqrt(2))
        return sigma * sigma

    @property
    def baseline(self) -> float:
        """The last default tick's objective (nan before any)."""
        return math.nan if self._last_default is None else self._last_default

    def _ratio(self, observed: float, base: float) -> float:
        if not (math.isfinite(base) and base > 0 and observed > 0):
            return math.nan
        return observed / base if self.goal == "max" else base / observed

    def _bracket_ok(self, before: float, after: float, span: int) -> bool:
        """Two bracketing ticks of one level (unstable_ratio) within the span."""
        return (min(before, after) > 0 and max(before, after) / min(before, after)
                <= self.unstable_ratio and (self.max_span is None or span <= self.max_span))

    def _straddles(self, values: list[float]) -> bool:
        """Clean ticks of one episode at two workload levels (`unstable_ratio` apart):
        the phase changed within the episode, so it is no sample of the model."""
        finite = [v for v in values if math.isfinite(v) and v > 0]
        return len(finite) >= 2 and max(finite) > self.unstable_ratio * min(finite)

    def add_ml(self, tick: int, objective: float, payload: object = None,
               settling: bool = False) -> int:
        """An ML tick waits for the next default tick to be judged.

        A `settling` one (see `Settling`) is resolved with the others but
        never counted.  A clean one closes the reverse pairs of the clean
        defaults since the last clean ML tick; returns how many it counted
        (the statistics changed when > 0).
        """
        self._pending.append((tick, objective, payload, settling))
        if self.max_span is None or settling or not (math.isfinite(objective)
                                                     and objective > 0):
            return 0  # a waiting ML tick changes no statistic
        self._changed()
        counted = 0
        if self._last_ml is not None and self._pending_defaults:
            before_tick, before = self._last_ml
            if self._straddles([v for _, v in self._pending_defaults]):
                self._straddled.extend(t for t, _ in self._pending_defaults
                                       if self._since is None or t > self._since)
            elif self._bracket_ok(before, objective, tick - before_tick):
                base = (before + objective) / 2
                after = [(t, value) for t, value in self._pending_defaults
                         if self._since is None or t > self._since]
                self._reverse.extend(Counted(t, value, base, before_tick, tick)
                                     for t, value in after)
                counted = len(after)
        self._pending_defaults = []
        self._last_ml = (tick, objective)
        return counted

    def add_default(self, tick: int, objective: float, settling: bool = False) -> list[Pair]:
        """A default tick resolves every ML tick since the previous one.

        A `settling` default tick still shows the ML setting before it: it
        is no baseline, resolves nothing (the waiting ML ticks wait for the
        next clean one) and is not counted.
        """
        self._changed()
        if settling:
            self._expire(tick)
            return []
        resolved = self._resolve(objective, tick)
        if (self._last_default_tick is not None and objective > 0
                and self._bracket_ok(self._last_default, objective, 0)):
            kept = self._tick_noise if tick - self._last_default_tick == 1 else self._far_noise
            kept.append(abs(math.log(objective / self._last_default)))
        if math.isfinite(objective):
            self._last_default = objective
            self._last_default_tick = tick
            if self._since is None or tick > self._since:
                self._defaults.append(tick)
            if self.max_span is not None and objective > 0:
                self._pending_defaults.append((tick, objective))
        self._expire(tick)
        return resolved

    def flush(self) -> list[Pair]:
        """Resolve waiting ML ticks with the earlier default alone (model stopping)."""
        self._changed()
        return self._resolve(None, None)

    def _changed(self) -> None:
        """Something `stats` reads may have changed: its cached answer is stale."""
        self._stats_cache = None

    def _resolve(self, following: float | None, tick: int | None) -> list[Pair]:
        before = self._last_default
        if following is not None and not math.isfinite(following):
            following = None
        sides = [v for v in (before, following) if v is not None]
        base = sum(sides) / len(sides) if sides else math.nan
        stable = len(sides) == 2 and self._bracket_ok(
            before, following, 0 if tick is None else tick - self._last_default_tick)
        if stable and self.max_span is not None and self._straddles(
                [o for _, o, _, settling in self._pending if not settling]):
            # the defaults agree but the ML ticks between them span two levels: phases
            # shorter than the bracket, and the agreement of the defaults a coincidence
            stable = False
            self._straddled.extend(t for t, _, _, settling in self._pending
                                   if not settling and (self._since is None or t > self._since))
        brackets = (self._last_default_tick, tick)
        pairs = []
        for ml_tick, observed, payload, settling in self._pending:
            ratio = self._ratio(observed, base)
            ok = stable and not settling and math.isfinite(ratio) and math.isfinite(observed)
            pairs.append(Pair(ml_tick, observed, base, ratio, ok, payload))
            if ok and (self._since is None or ml_tick > self._since):
                self._pairs.append(Counted(ml_tick, observed, base, *brackets))
        self._pending = []
        return pairs

    def _expire(self, tick: int) -> None:
        self._drop_through(tick - self.size)

    def _drop_through(self, oldest: int) -> None:
        """Forget what was judged at or before tick `oldest`."""
        while self._straddled and self._straddled[0] <= oldest:
            self._straddled.popleft()
        for kept in (self._pairs, self._reverse):
            while kept and kept[0][0] <= oldest:
                kept.popleft()
        while self._defaults and self._defaults[0] <= oldest:
            self._defaults.popleft()


    def stats(self, since: int | None = None) -> EfficiencyStats:
        """The paired efficiency and its confidence (see the module's docstring), over
        the ticks after `since` (None: the whole window).

        Without reverse pairs (no carry-over, or none counted yet) it is
        sum(observed) / sum(baseline) over the pairs, as it always was.  With
        them, per workload level: sqrt(F / R) where a level has both kinds, F
        or 1 / R where it has one; the levels weighted by their defaults' sum.
        """
        cached = self._stats_cache
        if cached is not None and cached[0] == since:
            return cached[1]
        stats = self._stats(since)
        self._stats_cache = (since, stats)
        return stats

    def _stats(self, since: int | None) -> EfficiencyStats:
        pairs, reverse = self._pairs, self._reverse
        defaults, straddled = len(self._defaults), len(self._straddled)
        if since is not None:
            pairs = [p for p in pairs if p.tick > since]
            reverse = [p for p in reverse if p.tick > since]
            defaults = sum(1 for t in self._defaults if t > since)
            straddled = sum(1 for t in self._straddled if t > since)
        n, m = len(pairs), len(reverse)
        episodes = runs(p.tick for p in pairs) + runs(p.tick for p in reverse)
        noise = self.noise_variance
        if not m:
            forward = paired(pairs, noise)
            if forward is None:
                return EfficiencyStats(math.nan, math.nan, n, defaults, self.baseline, m)
            ratio, se = forward
        else:
            both = combine(pairs, reverse, noise, self.unstable_ratio)
            if both is None:
                return EfficiencyStats(math.nan, math.nan, n, defaults, self.baseline, m)
            ratio, se = both
            if n + m < 2:
                se = math.nan
        confidence = (ratio - 1.0) / se if se > 0 else math.nan
        if self.goal == "min":
            ratio = 1.0 / ratio
            confidence = -confidence
        return EfficiencyStats(ratio, confidence, n, defaults, self.baseline, m,
                               episodes, straddled)


def replay(rows: Iterable[dict], model: str, goal: str, size: int,
           unstable_ratio: float = 2.0, settle: Mapping[str, int] | None = None,
           on_pair: Callable[[Pair], None] | None = None, evidence: int | None = None
           ) -> list[tuple[int, EfficiencyStats]]:
    """The window's statistics after each tick of `model` that changed them, from
    dataset rows.

    A dataset row with `model` == `model` is a tick the model recorded: an ML tick
    when its `controller` is `ml`, else a default tick.  Fed to an
    `EfficiencyWindow` in tick order they give what the model's `efficiency` file
    showed after each default tick, and after each ML tick that counted reverse
    pairs (carry-over knobs); the value holds until the next one. Two things the
    dataset does not show make the daemon's window differ for up to `size` ticks: a
    daemon restart (its window starts empty) and the cool-down after an efficiency
    collapse (it clears the window); and a default tick on which another started
    model is named in the row is not seen here.  `settle` maps the dataset's knob
    columns (`knob_column`) to the knobs' `settle_ticks`; the pair span is that of
    the largest (the daemon's is that of the knobs the model controls, the same
    unless a model was given a subset).  `on_pair` is called with each counted pair
    as it is resolved (which ticks the estimate rests on, e.g. to split it by
    workload phase).  A row without one of `settle`'s columns (a portion written
    before the knob existed, or rows read without those columns) is settling: its
    knob value is unknown, and taking it for unchanged would count every tick (a
    benchmark read them so and counted 30-40 pairs where the daemon counted 5-15).

    With `evidence` (`[modes] evidence_ticks`) it reads as the mode machine does
    (`ModeMachine.evidence_since`): the rows' `mode` column starts the evidence again
    at each switch, learning reads the last `size` ticks and collaboration and
    recommendation everything since the switch, up to `evidence` ticks.  Without it,
    one sliding window of `size` ticks.
    """
    window = EfficiencyWindow(size if evidence is None else max(size, evidence), goal,
                              unstable_ratio, pair_span(max((settle or {}).values(), default=0)))
    mode, last_tick = None, None

    def stats(tick: int) -> EfficiencyStats:
        if evidence is None:
            return window.stats()
        span = size if mode in ("learning", "emergency") else evidence
        return window.stats(since=tick - span)

    settling = Settling(settle or {})
    known = {name for name, k in (settle or {}).items() if k > 0}
    out: list[tuple[int, EfficiencyStats]] = []
    for row in rows:
        if row.get("model") != model:
            continue
        if evidence is not None and row.get("mode") != mode:
            if mode is not None and last_tick is not None:
                window.restart(last_tick)  # the switch happened after the last row
            mode = row.get("mode")
        last_tick = row["tick"]
        value = row.get("objective")
        value = math.nan if value is None else float(value)
        unsettled = settling(row) or not known.issubset(row)
        if row.get("controller") == "ml":
            if window.add_ml(row["tick"], value, settling=unsettled):
                out.append((row["tick"], stats(row["tick"])))  # reverse pairs counted
        else:
            resolved = window.add_default(row["tick"], value, settling=unsettled)
            if on_pair is not None:
                for pair in resolved:
                    if pair.stable:
                        on_pair(pair)
            out.append((row["tick"], stats(row["tick"])))
    return out
