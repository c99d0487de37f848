"""The incumbent: the best fixed knob setting measured so far at the current workload level.

A user judges mlfs against the best thing they could do without it: a fixed
setting found by a sweep.  The mode machine compares a policy only with the
kernel's default, so a policy x1.14 the default was promoted where a fixed
setting gave x1.28 (issue 53's writeback run).  The proxy therefore keeps an
incumbent of its own, from its own paired measurements (the stable pairs of
`mlfs.core.models.safe_set.SafeSet`: every ML tick against the default ticks
around it, whatever chose the setting: a trainer's exploration, the policy, the
incumbent's own probes):

- each setting measured at the current level (a baseline within `LEVEL_RATIO`
  of the latest default tick) is an *arm*; its samples are its episodes (runs of
  consecutive ticks at that setting, as the efficiency counts them), its
  estimate their mean ratio to the default, its interval the anytime-valid one
  of `mlfs.base.sequential` (the mode machine's, so it stays valid however
  often it is read);
- successive elimination: an arm whose interval's upper end is below the best
  lower end (the default's is exactly 1) is out; the survivors still undecided
  are the ones the bandit samples (`next_arm`: the fewest episodes first);
- the incumbent is the default unless an arm's interval lies wholly above 1;
  then it is the proven arm with the highest estimate.  A challenger replaces a
  standing incumbent only when its interval's lower end passes the incumbent's
  estimate: the incumbent wins ties (an operator's hand-picked setting is not
  swapped for one that is only as good).

The model is judged at the same level on its own ticks (`measured`: its
policy's, and outside learning its trainer's recommendations): `Standing.policy`
is their interval, and the model is *proven* when that interval's lower end is
within `TOLERANCE` of the incumbent's estimate (or the incumbent is the default).
The mode machine
promotes to recommendation only a proven policy (`mlfs.core.models.modes`);
in recommendation a policy not proven at this level gives way to the incumbent, the
default included (`choose`: every tick when it is proven worse, turn about while
undecided), so recommendation never runs a guess alone.  Pinned in recommendation by a
write to `mode`, the policy has passed no bar at all: it decides only where it is
proven here, and the incumbent runs everywhere else (`pinned`).  docs/ABI.md, "The incumbent".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mlfs.abi import KnobValue
from mlfs.base.sequential import Interval, interval

from .safe_set import LEVEL_RATIO, SafeSet

#: the policy may trail the incumbent by this fraction and still be promoted (within
#: it, the incumbent's own noise dominates; beyond it, the fixed setting is better)
TOLERANCE = 0.02
#: the least standard error of an episode's ratio: a setting whose few episodes
#: happened to agree exactly (a quiet simulator) is not proven by that alone
MIN_EPISODE_SE = 0.01
#: recommendation's ML ticks per turn while the policy and the incumbent are undecided
DUEL_TICKS = 5
#: feedback rows' `efficiency_vs_incumbent` reads an incumbent at most this many pairs old
REFRESH_PAIRS = 50
#: pinned in recommendation, a fixed setting other than the default runs at most this
#: many ML ticks on one reading of the level before a default tick reads it again
LEVEL_AGE_TICKS = 16


@dataclass(frozen=True)
class Arm:
    """One fixed setting at the current level: its mean ratio to the default over its
    episodes and the interval of that mean."""

    knobs: dict[str, KnobValue]
    interval: Interval

    @property
    def estimate(self) -> float:
        return self.interval.estimate


@dataclass(frozen=True)
class Standing:
    """What the proxy shows and decides on at the current level: the incumbent (None:
    the default), its estimate against the default (1.0 for the default) and the
    policy's interval there (unknown without enough of its own episodes)."""

    incumbent: Arm | None
    policy: Interval
    contenders: int  # arms not yet eliminated, the incumbent included

    @property
    def estimate(self) -> float:
        return 1.0 if self.incumbent is None else self.incumbent.estimate

    @property
    def vs_incumbent(self) -> float:
        """The policy's estimate over the incumbent's (nan while the policy's is unknown
        here: too few of its episodes at this level)."""
        return self.policy.estimate / self.estimate if self.policy.known else math.nan

    @property
    def policy_proven(self) -> bool:
        """The promotion's bar: the policy's interval reaches the incumbent within
        TOLERANCE (the default as incumbent: nothing to beat here beyond what the mode
        machine tests, over every level)."""
        return self.incumbent is None or self.policy_holds_here

    @property
    def policy_holds_here(self) -> bool:
        """Recommendation's bar at this level: the policy's own interval here reaches the
        incumbent's estimate (the default's, 1, when no fixed setting beats it) within
        TOLERANCE.  A policy promoted on its efficiency over all levels may still be
        unproven, or worse than the default, at this one."""
        return self.policy.known and self.policy.lower >= self.estimate * (1.0 - TOLERANCE)

    @property
    def policy_worse_here(self) -> bool:
        """The policy's interval here lies wholly below the incumbent's estimate."""
        return self.policy.known and self.policy.upper < self.estimate

    @property
    def why(self) -> str:
        """What the promotion's event says of the incumbent."""
        if self.incumbent is None:
            return ""
        return f", x{self.vs_incumbent:.3f} the incumbent (interval {self.policy.text})"

    def text(self) -> str:
        """The model's `incumbent` file: the setting (or `default`), its estimate and
        interval, and the policy's ratio to it."""
        if self.incumbent is None:
            head = "default x1.000"
        else:
            setting = " ".join(f"{k}={v}" for k, v in self.incumbent.knobs.items())
            iv = self.incumbent.interval
            head = f"{setting} x{iv.estimate:.3f} {iv.text} over {iv.episodes} episodes"
        vs = self.vs_incumbent
        policy = "nan" if math.isnan(vs) else f"{vs:.3f}"
        return f"{head}\npolicy_vs_incumbent {policy}\ncontenders {self.contenders}\n"


def _episode_means(slots: np.ndarray, ticks: np.ndarray, ratios: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(slot, mean ratio) per episode: a run of consecutive ticks of one slot."""
    order = np.lexsort((ticks, slots))
    slots, ticks, ratios = slots[order], ticks[order], ratios[order]
    starts = np.ones(len(slots), dtype=bool)
    starts[1:] = (slots[1:] != slots[:-1]) | (ticks[1:] - ticks[:-1] > 1)
    episode = np.cumsum(starts) - 1
    count = np.bincount(episode)
    return slots[starts], np.bincount(episode, weights=ratios) / count


def _interval(samples: np.ndarray) -> Interval:
    """The anytime-valid interval of the mean of `samples` (episode ratios)."""
    n = len(samples)
    mean = float(samples.mean()) if n else math.nan
    if n < 2:
        return interval(mean, math.nan, n)
    se = max(float(samples.std(ddof=1)) / math.sqrt(n), MIN_EPISODE_SE / math.sqrt(n))
    return interval(mean, (mean - 1.0) / se, n) if mean != 1.0 else interval(
        mean, math.nan, n)


class Incumbent:
    """The bandit over the settings the proxy measured (`SafeSet`'s pairs).

    `names` maps the pairs' knob columns (`knob_column`) to the knobs' names: the
    settings it returns are as `recommend` and a `Decision` name knobs."""

    def __init__(self, safe: SafeSet, names: Mapping[str, str] | None = None) -> None:
        self.safe = safe
        self._names = dict(names or {})
        #: the incumbent's setting per level bucket (`_bucket`): a standing one keeps
        #: its place against challengers that only tie with it
        self._held: dict[int, tuple] = {}
        self._cache: tuple[tuple, Standing, list[Arm]] | None = None
        #: the bandit's probe of the last ML tick, (tick, setting): kept while ML ticks
        #: follow each other, so an episode runs one setting throughout
        self._probe: tuple[int, dict[str, KnobValue]] | None = None
        #: the incumbent's estimate for the feedback rows' `efficiency_vs_incumbent`,
        #: (pairs seen, level bucket, estimate), refreshed every REFRESH_PAIRS pairs
        self._row_mark: tuple[int, int, float] | None = None
        #: the default tick (`SafeSet.level_reads`) whose level a tick read off (`ran`):
        #: the workload moved since, and the level waits for the next default tick
        self._stale_read: int | None = None
        #: learning's ML episodes that reached the bandit (`decide`), and the last tick
        #: of the latest: with a policy, the odd ones are the policy's, the even ones
        #: the bandit's
        self._episodes = 0
        self._last_ml_tick: int | None = None
        #: pinned: the level read (`SafeSet.level_reads`) the incumbent last ran on, and
        #: the first ML tick after it (`LEVEL_AGE_TICKS`)
        self._read_seen = -1
        self._read_tick = 0

    @staticmethod
    def _bucket(level: float) -> int:
        return round(math.log(level) / math.log(LEVEL_RATIO))

    def arms(self) -> tuple[list[Arm], Interval]:
        """Every setting's arm at the current level, and the policy's interval there
        (`tests/bench/levels.py` shows them level by level)."""
        slots, ticks, ratios, by_model = self.safe.at_level()
        unknown = interval(math.nan, math.nan, 0)
        if not len(slots):
            return [], unknown
        episode_slot, means = _episode_means(slots, ticks, ratios)
        arms = [Arm(self._named(self.safe.setting(int(slot))),
                    _interval(means[episode_slot == slot]))
                for slot in np.unique(episode_slot)]
        policy = unknown
        if by_model.any():  # the policy's own ticks as one arm, whatever it chose
            _, means = _episode_means(np.zeros(int(by_model.sum()), dtype=np.int64),
                                      ticks[by_model], ratios[by_model])
            policy = _interval(means)
        return arms, policy

    def standing(self) -> Standing:
        """The incumbent and the policy's standing at the current level (cached until a
        pair is measured or the level moves)."""
        return self._evaluate()[0]

    def _evaluate(self) -> tuple[Standing, list[Arm]]:
        key = (self.safe.pairs_seen, self.safe.level)
        cached = self._cache
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        arms, policy = self.arms()
        known = [a for a in arms if a.interval.known]
        best_lower = max([1.0] + [a.interval.lower for a in known])
        survivors = [a for a in arms if not a.interval.known or a.interval.upper >= best_lower]
        proven = [a for a in known if a.interval.lower > 1.0]
        incumbent = None
        if proven and math.isfinite(self.safe.level) and self.safe.level > 0:
            bucket = self._bucket(self.safe.level)
            best = max(proven, key=lambda a: a.estimate)
            held = next((a for a in proven if _key(a.knobs) == self._held.get(bucket)), None)
            incumbent = held if held is not None and best.interval.lower <= held.estimate \
                else best
            self._held[bucket] = _key(incumbent.knobs)
        standing = Standing(incumbent, policy, len(survivors))
        self._cache = (key, standing, survivors)
        return standing, survivors

    def next_arm(self) -> dict[str, KnobValue] | None:
        """The setting the bandit would sample next at this level: among the arms not
        eliminated and not yet proven either way (interval unknown or straddling the
        incumbent's estimate), the one with the fewest episodes; None when all are
        decided.  Only measured settings: the safe set, not the bandit, opens new ones."""
        standing, survivors = self._evaluate()
        mark = standing.estimate
        open_arms = [a for a in survivors if a is not standing.incumbent and (
            not a.interval.known or a.interval.lower <= mark <= a.interval.upper)
            and (a.interval.known or a.interval.estimate >= 1.0)]
        if not open_arms:
            return None
        return dict(min(open_arms, key=lambda a: a.interval.episodes).knobs)

    def _named(self, setting: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
        return {self._names.get(column, column): value for column, value in setting.items()
                if value is not None}

    def choose(self, mode: str, controlled: list[str], tick: int = 0,
               has_policy: bool = True, promoted: bool = True
               ) -> dict[str, KnobValue] | None:
        """In recommendation: what runs instead of a policy not proven here against the
        incumbent, the incumbent's setting of the `controlled` knobs, or `{}` for the
        default when no fixed setting beats it here (None: the policy decides).

        Undecided (the policy's interval reaches the incumbent's estimate but its lower
        end is not within TOLERANCE of it), the two take turns in blocks of
        `DUEL_TICKS` ML ticks: the policy's turns are its evidence at this level, which
        the incumbent running alone would never give it (on the simulator, the policy
        read features the incumbent cannot: the incumbent alone was 0.951-0.963 of the
        oracle on seed 1, the policy 0.975).  Proven worse (its interval's upper end
        below the incumbent's estimate), or without a policy, it gives way at every tick.
        Where no fixed setting beats the default, a policy proven worse than the default
        at this level gives way to it at every tick: a policy promoted on its efficiency
        over all levels ran read_ahead_kb=0 on a sequential scan in recommendation, x0.65
        the default there (issue 53), and nothing held it.

        Not `promoted` (recommendation pinned by a write to `mode`), the policy has not
        passed the mode machine's bar, so none of the above rests on it: it decides only
        where it is proven here (`policy_holds_here`), and elsewhere the incumbent runs,
        the default included, without turns (`pinned`).  Pinned so, block-queue policies
        without evidence at a level ran there at x0.71 to x0.98 the default (issue 53)."""
        if mode != "recommendation":
            return None
        if not promoted:
            return self.pinned(controlled, has_policy, tick)
        if self._stale_read == self.safe.level_reads:
            return None
        standing = self.standing()
        if standing.incumbent is None:
            # the default as incumbent: it runs where the policy is proven worse here, and
            # only there (a policy without evidence at this level passed the mode
            # machine's bar, which is the default's, over all levels)
            return {} if has_policy and standing.policy_worse_here else None
        if standing.policy_holds_here:
            return None
        if has_policy and not standing.policy_worse_here and (tick // DUEL_TICKS) % 2:
            return None  # the policy's turn
        knobs = standing.incumbent.knobs
        if not all(name in knobs for name in controlled):
            return None
        return {name: knobs[name] for name in controlled}

    def pinned(self, controlled: list[str], has_policy: bool, tick: int = 0
               ) -> dict[str, KnobValue]:
        """Pinned recommendation's tick: None where the policy is proven here, else the
        incumbent's setting of the `controlled` knobs, or `{}` (the default) where no
        fixed setting beats it, where that setting does not name every controlled knob,
        or where the tick before read off this level, the incumbent's or the policy's
        (`ran`): a default tick reads the workload's level again (pinned at
        `recommendation_probe` 0 there are no others, and a policy proven on a
        sequential scan ran its 512 KiB of read-ahead on into the mmap phase after it,
        x0.37 there).

        A fixed setting also hands over to a default tick after `LEVEL_AGE_TICKS` ML
        ticks on one reading of the level: a setting that moves the objective a lot can
        read on the next phase what it read on its own, and nothing then says the
        workload moved.  4 KiB of read-ahead, proven x3.2 on an mmap phase (18.8 MiB/s
        by default), read the same ~60 MiB/s on the sequential scan after it and ran
        there for a whole visit, x0.29 the default (issue 53's read-ahead run at
        579f6f6)."""
        reads = self.safe.level_reads
        if reads != self._read_seen:
            self._read_seen, self._read_tick = reads, tick
        if self._stale_read == reads:
            return {}  # a default tick: the level again
        standing = self.standing()
        if has_policy and standing.policy_holds_here:
            return None
        if standing.incumbent is None:
            return {}
        if tick - self._read_tick >= LEVEL_AGE_TICKS:
            self._stale_read = reads
            return {}
        knobs = standing.incumbent.knobs
        if not all(name in knobs for name in controlled):
            return {}
        return {name: knobs[name] for name in controlled}

    def ran(self, source: str, objective: float, promoted: bool = True) -> None:
        """An ML tick ran with `objective`: one of the incumbent's own that read outside
        `LEVEL_RATIO` of what it does at this level (level x estimate) says the workload
        changed since the latest default tick, the level it was chosen at.  Until the
        next default tick the policy decides (it reads the tick's features; the
        incumbent knows only the level).  Without this, recommendation's defaults come
        every ~20 ticks and the incumbent of the phase before ran that long into the
        next: on the simulator 0.951 of the oracle against the policy's 0.975 (seed 1).

        Not `promoted` (pinned), the policy's ticks are read the same way against its
        own estimate here: it decides only at the level it is proven at (`pinned`), so
        one that reads off it hands over to a default tick, which reads the level."""
        if not (math.isfinite(objective) and objective > 0):
            return
        standing = self.standing()
        if source == "incumbent":
            estimate = standing.estimate
        elif source == "policy" and not promoted and standing.policy.known:
            estimate = standing.policy.estimate
        else:
            return
        level = self.safe.level
        expected = level * estimate
        if math.isfinite(expected) and expected > 0 and \
                abs(math.log(objective / expected)) > math.log(LEVEL_RATIO):
            self._stale_read = self.safe.level_reads

    def measured(self, setting: Mapping[str, KnobValue], baseline: float, ratio: float,
                 tick: int, source: str, mode: str) -> None:
        """One stable pair (`SafeSet.measured`), from a feedback row's `source` in `mode`.

        The model's own ticks, the ones it is judged on against the incumbent: its
        policy's, and outside learning its trainer's recommendations (a model driven by
        recommendations alone rolls them out); learning's recommendations are the
        trainer's explorations, and the incumbent's probes are the incumbent's."""
        by_model = source == "policy" or (source == "recommendation" and mode != "learning")
        self.safe.measured(setting, baseline, ratio, tick, by_model)

    def decide(self, tick: int, mode: str, controlled: list[str], has_policy: bool,
               promoted: bool = True) -> dict[str, KnobValue] | None:
        """The proxy's fixed setting for this ML tick, or None (the policy decides, or
        the default runs): in recommendation the incumbent while the policy is not
        proven against it (`choose`); in learning, the bandit's probe of an undecided
        arm (`next_arm`), a whole episode each, on the exploration share the mode grants
        that no recommendation claims: every ML episode without a policy, every other
        one with a policy.  The bandit yielded every episode to a policy once one was
        uploaded (within seconds, in every real-device run), so its arms grew only from
        the trainer's explorations, spread over the whole grid: on read-ahead's mmap
        phase no setting was proven in 180 s, where the sweep's best read x3 the
        default, and the incumbent ran on 2 of 722 ticks (issue 53)."""
        if mode == "recommendation":
            return self.choose(mode, controlled, tick, has_policy, promoted)
        if mode != "learning":
            return None
        if self._last_ml_tick is None or tick != self._last_ml_tick + 1:
            self._episodes += 1
        self._last_ml_tick = tick
        probe = self._probe
        if probe is not None and probe[0] == tick - 1:
            self._probe = (tick, probe[1])
            return dict(probe[1])
        if has_policy and self._episodes % 2:
            return None  # the policy's episode
        arm = self.next_arm()
        if arm is None or not all(name in arm for name in controlled):
            self._probe = None
            return None
        setting = {name: arm[name] for name in controlled}
        self._probe = (tick, setting)
        return dict(setting)

    def versus(self, ratio: float) -> float | None:
        """A feedback row's efficiency over the incumbent's estimate at the current level
        (None where the ratio is unknown); the estimate is refreshed every
        REFRESH_PAIRS pairs or when the level moves, not on every row."""
        if not math.isfinite(ratio):
            return None
        level = self.safe.level
        bucket = self._bucket(level) if math.isfinite(level) and level > 0 else 0
        mark = self._row_mark
        if (mark is None or mark[1] != bucket
                or self.safe.pairs_seen - mark[0] >= REFRESH_PAIRS):
            mark = self._row_mark = (self.safe.pairs_seen, bucket, self.standing().estimate)
        return ratio / mark[2]

    def file_text(self) -> str:
        """The model's `incumbent` file (`Standing.text`)."""
        return self.standing().text()

    def versus_text(self) -> str:
        """The model's `efficiency_vs_incumbent` file: the policy's estimate at this level
        over the incumbent's (`Standing.vs_incumbent`)."""
        value = self.standing().vs_incumbent
        return "nan\n" if math.isnan(value) else f"{value:.3f}\n"


def _key(knobs: dict[str, KnobValue]) -> tuple:
    return tuple(sorted(knobs.items()))
