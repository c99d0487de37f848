"""Episodes: how a model and the default take turns when a knob's effect carries over.

Knobs with carry-over
---------------------
Pairing ticks assumes a knob's effect stays inside its tick.  Some do not:
dirty pages let in under a high `vm.dirty_ratio` are written back during
the next ticks, and a `read_ahead_kb` reaches only files opened after the
change.  With ML and default ticks alternating, each tick then measures
mostly its neighbour's setting and the estimate is wrong in either
direction: a synthetic knob whose effect shows one tick late, 20 % better
under ML, reads 0.92 / 0.84 / 1.00 in learning / collaboration /
recommendation instead of 1.20; declared, 1.21 / 1.20 / 1.19, and with a
3-tick lag 1.21 / 1.20 / 1.19 (2,000 ticks, tests/unit/test_efficiency_carryover.py).

A knob declares its carry-over as `Knob.settle_ticks` (k).  Two things
follow, and a subsystem without such knobs behaves exactly as before:

- `Settling` marks a tick *settling* when a carry-over knob's value in
  effect differs from its value on any of the k ticks before (so both the
  ML tick right after a change and the default tick right after the return
  to the default).  A settling ML tick still gets its feedback row but is
  not counted; a settling default tick is no baseline (the ML ticks before
  it wait for the next clean default).
- Excluding ticks alone would exclude everything under tick-by-tick
  interleaving (every tick is within k of a change), so the proxy
  interleaves in *episodes* of `episode_ticks(k)` = 2k ticks: the first k
  of each episode settle, the last k are measured.  The share of ML ticks
  per mode stays exact to within an episode (the credit accumulator counts
  ticks; `Interleaving`).  A default episode gets a random tail of 0..k // 2
  ticks, so that the schedule does not lock in phase with a periodic
  workload (see `Interleaving`); it costs about 10-15 % of the counted pairs
  per tick (fewer default episodes, and now and then two ML episodes in a
  row): 1245 against 1495 in 6000 ticks of collaboration on one steady phase.

Why not compare whole episodes (episode mean against episode mean)?  It
needs the same exclusion of the first k ticks anyway (else the settling
ticks dominate), gives one sample per episode instead of k (a wider
confidence for the same ticks), and would be a second estimator beside the
tick pairs; with the exclusion, the clean ticks of an episode are paired
with the clean defaults bracketing the episode by the one rule above.  The
price: 2k-tick episodes react k ticks later to a phase change than single
ticks, and a k larger than the workload's phases leaves few clean pairs
(efficiency stays `nan`, which is the honest answer).  The k clean ML ticks
of an episode share their baselines and their place in the workload's
phase, so `confidence` counts an episode (a run of consecutive counted
ticks) as one sample: one episode alone gives no confidence at all.

Measured on sim.readahead with a carry-over of 1 and 3 ticks (3 seeds, a
static value and the per-phase oracle, docs/results/efficiency-carryover.md):
against an interleaved evaluation of the same ticks, the undeclared estimate
was off by -0.15 to -0.26 on average (the oracle, truth 1.25, read 0.80 in
collaboration: it would have been demoted); declared, by at most 0.035 in
learning and collaboration and 0.096 in recommendation at k = 3.

A policy that changes its mind
------------------------------
A policy decides every ML tick from the latest features, and some of those
features move with the knob itself (the dirty pages under a dirty ratio).
Its choice can then flip from tick to tick, and every ML tick settles: on
fio's checkpoint/scratch phases a trained policy ran 248 s in collaboration
and left 0 counted pairs (bench-results/dirty-win-2).  A change of a carry-over
knob cannot be measured, and does not take effect, unless it stays k ticks
and k more, so the proxy *holds* a policy's setting (`Hold`): once the
setting changes, it is kept for `episode_ticks(k)` ticks of uninterrupted
policy control.  A policy that is steady within a workload phase is not
slowed (its change at a phase boundary is taken at once if the last one is
an episode old); a flip-flopping one changes at most once per episode.

Knobs without carry-over (k = 0) keep the tick pairing unchanged: there a
gap of 19 ML ticks in recommendation is accepted, as it always was, and a
policy may change the knobs on every tick.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from mlfs.abi import episode_ticks


def pair_span(settle: int) -> int | None:
    """The widest bracket (ticks between the two clean defaults) a pair may have.

    None (no limit) without carry-over; 3k + 1 + k // 2 with it: one ML
    episode between two default episodes (3k + 1, see "Phases shorter than
    the gap" in efficiency.py), or one default episode, with its random tail of up to
    k // 2 ticks (`Interleaving`), between two ML episodes (a reverse pair).
    """
    return 3 * settle + 1 + settle // 2 if settle > 0 else None


class Sandwich:
    """Reorders a run of ML episodes so that one ML episode sits between two defaults.

    Fed the episode decisions of the credit accumulator (True: ML), it
    returns what to run.  At a share above 0.5 the accumulator gives runs of
    ML episodes with single defaults between them, so no ML episode has a
    default on both sides; here a default that follows an ML run opens a
    sandwich, the next ML episode fills it, and the episode after that is
    turned into a default (one borrowed), paid back by running the next
    default the accumulator asks for as ML.  Over a period the counts of ML
    and default episodes are the accumulator's exactly.
    """

    def __init__(self) -> None:
        self._step = 0  # 1: a sandwich was opened; 2: and filled, it closes next
        self._borrowed = 0  # defaults run ahead of the accumulator

    def reset(self) -> None:
        self._step = 0
        self._borrowed = 0

    def __call__(self, ml: bool) -> bool:
        if self._step == 1:
            if ml:
                self._step = 2
            return ml  # a second default in a row keeps the sandwich open
        if self._step == 2:
            self._step = 0
            if ml:
                self._borrowed += 1
            return False  # the closing default
        if not ml:
            if self._borrowed:
                self._borrowed -= 1
                return True  # paid back
            self._step = 1
        return ml


class Interleaving:
    """Which controller runs each tick: the credit accumulator, in episodes.

    ML episodes are `episode_ticks(k)` long, as the pair span assumes; a
    default episode is that plus a random 0..k ticks.  Fixed episodes lock in
    phase with a periodic workload: fio's checkpoint/tempfiles cycle of 61
    ticks against a 20-tick period of default and ML episodes shifted by one
    tick a cycle, so a judged stretch either had a default, an ML and a
    default episode inside every checkpoint visit or inside none (10 pairs in
    one run, none in two: bench-results/dirty-win-12).  The random tail lets the
    schedule drift across the workload's cycle, and the credit counts ticks,
    not episodes, so the ML share stays the mode's (ML asked while the credit
    covers an ML episode; the default ticks asked earn it).  Without carry-over
    (k = 0) it is the tick-by-tick accumulator it always was.  Seeded, so a
    model's schedule is reproducible.
    """

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._sandwich = Sandwich()
        self._credit = 0.0  # share x ticks asked, less ML ticks asked
        self._left = 0  # ticks left of the running episode
        self._ml = False
        self._upper = True  # the sandwich is of ML episodes (share >= 0.5), not of defaults

    def __call__(self, share: float, settle: int) -> bool:
        """Whether ML runs this tick, at `share` with a carry-over of `settle` ticks.

        A share of 0 (emergency) ends an ML episode at once; with carry-over the
        episodes are sandwiched (`Sandwich`) so that some ML episodes have a
        default episode on both sides.
        """
        if share == 0.0:
            self._left = 0
            self._sandwich.reset()
            return False
        if self._left > 0:
            self._left -= 1
            return self._ml
        length = episode_ticks(settle)
        asked_ml = self._credit + share * length >= length * (1.0 - 1e-9)
        default_length = length + (self._rng.randint(0, settle // 2) if settle else 0)
        self._credit += share * (length if asked_ml else default_length)
        self._credit -= length if asked_ml else 0
        if not settle:
            self._ml = asked_ml
        else:
            # above a share of 0.5 ML episodes come in runs: one is put between two
            # defaults (`Sandwich`); below it the defaults do, and one of them is put
            # between two ML episodes, for the reverse pairs (the same on the inverse)
            upper = share >= 0.5
            if upper != self._upper:
                self._sandwich.reset()
                self._upper = upper
            self._ml = (self._sandwich(asked_ml) if upper
                        else not self._sandwich(not asked_ml))
        self._left = (length if self._ml else default_length) - 1
        return self._ml


class Hold:
    """Keeps a policy's setting for an episode after each change (see "A policy that
    changes its mind" above), but lets a run's first choice be corrected once.

    Called once per policy tick with the policy's choice, the setting in effect
    and the episode length; returns the setting to apply and its prediction
    (None for a held setting: the policy predicted another one).  A tick that
    follows one not decided by the policy (a default, a recommendation) starts a
    run: its choice is taken, and held if it changes the setting in effect.
    That first choice was made from a window another controller ran, often a
    workload's transition (fio's idle second between two jobs reads 0.0-0.1 KiB
    per write call), so the hold would pin a guess for a whole episode: a
    trained policy ran the first 10 ticks of every checkpoint visit at the
    setting it chose for that idle second (bench-results/dirty-win-12: 124 of 458
    samples).  So within the run's first hold the policy may change its mind
    once, to anything but the setting the run left (a return to it is the
    flip-flop the hold exists for); after that, one change per episode.
    """

    def __init__(self) -> None:
        self._knobs: Mapping[str, object] | None = None
        self._since = self._last = -2  # tick of the last change / of the last call
        self._left: Mapping[str, object] | None = None  # the setting the run left
        self._correctable = False

    def __call__(self, tick: int, knobs: Mapping[str, object], expected: float | None,
                 episode: int, current: Mapping[str, object] | None = None
                 ) -> tuple[Mapping[str, object], float | None]:
        uninterrupted = self._last == tick - 1
        self._last = tick
        if not uninterrupted:
            before = {k: current[k] for k in knobs if k in current} if current else None
            self._knobs, self._left = dict(knobs), before
            self._correctable = True
            # no change, no hold (without `current`, every run's start counts as one)
            self._since = -episode if before == dict(knobs) else tick
            return knobs, expected
        if knobs == self._knobs:
            return knobs, expected
        if tick - self._since >= episode:
            self._correctable = False
        elif self._correctable and knobs != self._left:
            self._correctable = False  # the run's one correction
        else:
            return dict(self._knobs), None
        self._knobs, self._since = dict(knobs), tick
        return knobs, expected
