"""The settings a rolled-out policy may choose: measured at this workload level, or next to one.

A trainer's policy is a regression of the objective on the state and the
knobs; its argmax is only as good as the rows behind it.  In a workload phase
the trainer has not seen (or has seen only under the default) the trees
extrapolate, and the argmax lands on a setting nobody ever measured there:
on the simulator a model promoted after three of four phases chose 1,024 KiB
of read-ahead in the fourth (strided) phase, ×0.3 of the default, and the
valid test demoted it sixty ticks later (docs/results/learning-34.md).

So whenever a policy acts under automatic switching -- in learning, collaboration
and recommendation -- the proxy lets it choose only among (SafeOpt's safe set,
Sui et al. 2015, on the proxy's own measurements):

- the default;
- settings whose ML ticks, paired with the default ticks around them, were
  measured at the current workload level (a baseline within `LEVEL_RATIO` of
  the latest default tick's objective) with a mean efficiency of at least
  `1 - SAFE_MARGIN`;
- their neighbours, one step on each knob's candidate grid, unless those were
  measured as a loss there (`_losses`): that is how the safe set grows, a step
  at a time, from what is known to be safe.

Learning too: its ML ticks are what promotion judges, so they must run the policy
as collaboration would roll it out.  Left unrestricted there (until this was
changed), a policy fitted on one phase ran its guess in the next: in `mlfs demo`
it ran 32 KiB of read-ahead on a sequential scan (x0.34 of the default) for 150
ticks, the learning efficiency fell to 0.45-0.8 and promotion waited for it to
recover; with learning restricted, 5 of 8 demo runs reached recommendation by tick
1,200, against 1 of 4 on the same code without (docs/results/learning-34.md).
Learning and collaboration pinned by a write to `mode` are left alone (the operator's
experiments); recommendation pinned is not: a pin skips the mode machine's transitions,
not what recommendation may roll out (`RESTRICTED_PINNED`).  The trainer's own
recommendations are never filtered (they are how settings get measured).

The evidence is the proxy's own, not the trainer's word: the stable pairs of
its efficiency window (`mlfs.core.models.efficiency`), the same numbers the mode
machine judges.  Memory is bounded: the last `KEPT_PAIRS` pairs, which survive a
restart of the daemon in the model's state directory (`safe_set_file`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from mlfs.abi import KnobValue

#: a pair counts at the current level when its baseline is within this factor of the
#: latest default tick's objective (a phase's own drift is a few per cent; the simulator's
#: phases differ by x1.8 and more)
LEVEL_RATIO = 1.25
#: a measured setting is safe when its mean efficiency at this level is at least 1 - this
SAFE_MARGIN = 0.05
#: a measured setting is a loss (its neighbours do not open through it) below 1 - SAFE_MARGIN
#: over `LOSS_PAIRS` pairs, or below `CLEAR_LOSS` on fewer (one pair at x0.9 may be noise)
LOSS_PAIRS = 3
CLEAR_LOSS = 0.8
#: pairs remembered (a ring): a few thousand ticks of a mode's ML ticks
KEPT_PAIRS = 20_000
#: distinct settings tracked (a trainer may recommend any value in range); a policy
#: evaluates at most 4,096 candidates, and an untracked setting is simply never safe
MAX_SETTINGS = 4096
#: the candidate grid is dilated as a dense array on every restricted decision, only up
#: to this many cells (beyond, the policy keeps to the safe settings without a step)
MAX_GRID_CELLS = 1 << 16
#: the modes in which the policy's choice is restricted under automatic switching: every
#: mode in which it acts
RESTRICTED_MODES = frozenset({"learning", "collaboration", "recommendation"})
#: ... and pinned by a write to `mode`: a pin sets the mode, it does not pass the mode
#: machine's bar, so what recommendation rolls out stays measured (issue 53: pinned in
#: recommendation, a policy ran the block queue's kyber with 8 requests on an OLTP phase,
#: never measured there, x0.71 the default).  Pinned learning and collaboration are the
#: operator's experiments: there the policy runs its own choice.
RESTRICTED_PINNED = frozenset({"recommendation"})


def restricted(mode: str, switching: str) -> bool:
    """Whether the policy may choose only what `SafeSet.allowed` allows, in `mode` under
    `switching` (`auto` or `pinned`, the model's `mode_switching`)."""
    return mode in (RESTRICTED_MODES if switching == "auto" else RESTRICTED_PINNED)


class SafeSet:
    """Measured outcomes of settings by workload level, and the mask they allow."""

    def __init__(self, kept: int = KEPT_PAIRS) -> None:
        self._baseline = np.zeros(kept)
        self._ratio = np.zeros(kept)
        self._slot = np.zeros(kept, dtype=np.int64)
        #: the pair's tick and whether the model chose its setting (`incumbent`: episodes
        #: are runs of consecutive ticks; the model is judged on its own pairs)
        self._tick = np.zeros(kept, dtype=np.int64)
        self._by_model = np.zeros(kept, dtype=bool)
        self._count = 0  # pairs ever recorded; the ring holds the last `kept`
        self._slots: dict[tuple, int] = {}  # a setting (sorted (column, value)) -> slot
        self._settings: list[dict[str, KnobValue]] = []
        #: (a policy's candidates, their index by setting, slot -> candidate so far)
        self._mapped: tuple[list, dict, list[int]] | None = None
        #: the latest default tick's objective: the workload level decisions are made at
        self.level = math.nan
        #: default ticks seen: a reading of the level, even one equal to the last
        self.level_reads = 0

    def default_tick(self, objective: float) -> None:
        self.level = objective
        self.level_reads += 1

    @property
    def pairs_seen(self) -> int:
        """Pairs ever recorded (a change means the measurements changed)."""
        return self._count

    def setting(self, slot: int) -> dict[str, KnobValue]:
        return dict(self._settings[slot])

    def held(self) -> tuple[list[dict[str, KnobValue]], dict[str, np.ndarray]]:
        """The settings and the pairs the ring holds, oldest first (what `measured`
        replays into an empty SafeSet to rebuild this one: `safe_set_file`)."""
        held = min(self._count, len(self._slot))
        order = (np.arange(held) + self._count - held) % len(self._slot)
        pairs = {"baseline": self._baseline[order], "ratio": self._ratio[order],
                 "slot": self._slot[order], "tick": self._tick[order],
                 "by_model": self._by_model[order]}
        return [dict(s) for s in self._settings], pairs

    def measured(self, knobs: Mapping[str, KnobValue], baseline: float, ratio: float,
                 tick: int = -1, by_model: bool = False) -> None:
        """One stable pair: the setting `knobs` (knob column -> value) ran at `baseline`
        (the default's objective around it) and did `ratio` times as well, on `tick`,
        chosen by the model (`by_model`: `incumbent.Incumbent.measured` says which
        ticks are) or not."""
        if not (math.isfinite(baseline) and baseline > 0 and math.isfinite(ratio)):
            return
        key = tuple(sorted(knobs.items()))
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= MAX_SETTINGS:  # never judged safe: the default holds
                return
            slot = self._slots[key] = len(self._settings)
            self._settings.append(dict(knobs))
        i = self._count % len(self._slot)
        self._baseline[i], self._ratio[i], self._slot[i] = baseline, ratio, slot
        self._tick[i], self._by_model[i] = tick, by_model
        self._count += 1

    def at_level(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The pairs measured at the current level: (slot, tick, ratio, chosen by the model)."""
        held = min(self._count, len(self._slot))
        if not held or not (math.isfinite(self.level) and self.level > 0):
            empty = np.zeros(0)
            return empty.astype(np.int64), empty.astype(np.int64), empty, empty.astype(bool)
        near = np.abs(np.log(self._baseline[:held] / self.level)) <= math.log(LEVEL_RATIO)
        return (self._slot[:held][near], self._tick[:held][near], self._ratio[:held][near],
                self._by_model[:held][near])

    def _at_level(self, candidates: list[dict[str, KnobValue]]
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: pairs measured at the current level and their mean ratio."""
        n = len(candidates)
        counts, sums = np.zeros(n), np.zeros(n)
        slots, _, ratios, _ = self.at_level()
        if not len(slots):
            return counts, sums
        which = self._to_candidate(candidates)[slots]
        known = which >= 0
        counts += np.bincount(which[known], minlength=n)
        sums += np.bincount(which[known], weights=ratios[known], minlength=n)
        return counts, sums

    def _to_candidate(self, candidates: list[dict[str, KnobValue]]) -> np.ndarray:
        """Slot -> index of the candidate with its values of the candidates' knobs (-1:
        none).  Built once per policy (its candidate list) and extended by the settings
        seen since, so a new setting costs one lookup, not a pass over all of them."""
        mapped = self._mapped
        if mapped is None or mapped[0] is not candidates:
            index = {tuple(c.items()): i for i, c in enumerate(candidates)}
            mapped = self._mapped = (candidates, index, [])
        _, index, to_candidate = mapped
        columns = list(candidates[0])
        for setting in self._settings[len(to_candidate):]:
            to_candidate.append(index.get(tuple((c, setting.get(c)) for c in columns), -1))
        return np.asarray(to_candidate, dtype=np.int64)

    def allowed(self, candidates: list[dict[str, KnobValue]], shape: tuple[int, ...],
                default: np.ndarray) -> np.ndarray:
        """The mask of `candidates` (the policy's, in `itertools.product` order over
        grids of `shape`) the policy may choose now; `default`: the default's mask."""
        counts, sums = self._at_level(candidates)
        mean = np.divide(sums, counts, out=np.ones_like(sums), where=counts > 0)
        safe = (counts > 0) & (mean >= 1.0 - SAFE_MARGIN) | default
        loss = ((counts > 0) & (mean < 1.0 - SAFE_MARGIN)
                & ((counts >= LOSS_PAIRS) | (mean < CLEAR_LOSS)))
        cells = math.prod(shape)
        if cells > MAX_GRID_CELLS:
            return safe
        grid = np.zeros(cells, dtype=bool)
        grid[:len(candidates)] = safe
        grid = grid.reshape(shape)
        near = grid.copy()
        for axis in range(len(shape)):  # one step on each knob: Chebyshev distance 1
            grown = near.copy()
            lead = [slice(None)] * len(shape)
            lag = [slice(None)] * len(shape)
            lead[axis], lag[axis] = slice(1, None), slice(None, -1)
            grown[tuple(lead)] |= near[tuple(lag)]
            grown[tuple(lag)] |= near[tuple(lead)]
            near = grown
        return (near.reshape(-1)[:len(candidates)] & ~loss) | safe
