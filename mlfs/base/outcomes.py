"""Judging predictions on what happened: hits, false alarms, misses, lead time, utility.

A predictor says, per entity (a device, a drive) and tick, how likely an event is within
the next `horizon` ticks; an alert is a prediction at or above the alerting threshold.
Nothing a prediction says changes the world, so the model's alerts and the default
rule's alerts are judged on the same rows, side by side, once the horizon has passed.
This module is the one definition of that judgement: the proxy scores live ticks with it
and the benchmarks score offline rows with it, so the two agree by construction.

Definitions (per entity-tick, the way disk-failure studies count per drive-day):
- a tick *t* of entity *e* is **positive** when *e*'s event happens at a tick in
  (t, t + horizon]: an alert then warns at least one tick ahead;
- the event's own tick is neither positive nor negative (an alert on it warns nobody);
- a **false alarm** is an alert on a negative tick; the false-alarm rate is false alarms
  over negative ticks;
- an event is **caught** when its entity alerted on at least one of its positive ticks;
  recall is caught events over events; a **miss** is an event not caught;
- **lead time** of a caught event: its tick minus the first alerting positive tick.
- **cost** = `miss_cost` × misses + `false_alarm_cost` × false alarms; a predictor's
  utility is minus its cost, and its efficiency against the rule is the rule's cost over
  the model's (> 1: the model costs less), as the knob efficiency is ML over default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NEVER = np.iinfo(np.int64).max


def next_event_ticks(keys: np.ndarray, ticks: np.ndarray, events: np.ndarray) -> np.ndarray:
    """For each row, the tick of the next event of the same key at or after it (NEVER if none).

    Rows may come in any order; `events` marks the rows on which the event happened.
    """
    keys = np.asarray(keys)
    ticks = np.asarray(ticks, dtype=np.int64)
    events = np.asarray(events, dtype=bool)
    order = np.lexsort((ticks, keys))
    k, t, e = keys[order], ticks[order], events[order]
    n = len(order)
    event_pos = np.flatnonzero(e)
    if len(event_pos) == 0:
        return np.full(n, NEVER, dtype=np.int64)
    # the first event at or after each sorted row; it counts when it is of the same key
    idx = np.searchsorted(event_pos, np.arange(n), side="left")
    has = idx < len(event_pos)
    cand = event_pos[np.minimum(idx, len(event_pos) - 1)]
    nxt = np.where(has & (k[cand] == k), t[cand], NEVER)
    out = np.empty(n, dtype=np.int64)
    out[order] = nxt
    return out


def positive_ticks(ticks: np.ndarray, next_event: np.ndarray, horizon: int) -> np.ndarray:
    """True where the next event comes 1..horizon ticks later (see the module docstring)."""
    gap = next_event - np.asarray(ticks, dtype=np.int64)
    return (next_event != NEVER) & (gap >= 1) & (gap <= horizon)


def event_ticks_mask(ticks: np.ndarray, next_event: np.ndarray) -> np.ndarray:
    """True on the event's own tick (excluded from both sides of the count)."""
    return next_event == np.asarray(ticks, dtype=np.int64)


@dataclass(frozen=True)
class Score:
    """How one set of alerts did on a set of rows."""

    events: int
    caught: int
    false_alarms: int
    negatives: int
    lead_ticks: tuple[int, ...]  # one per caught event

    @property
    def misses(self) -> int:
        return self.events - self.caught

    @property
    def recall(self) -> float:
        return self.caught / self.events if self.events else math.nan

    @property
    def false_alarm_rate(self) -> float:
        return self.false_alarms / self.negatives if self.negatives else math.nan

    @property
    def median_lead(self) -> float:
        return float(np.median(self.lead_ticks)) if self.lead_ticks else math.nan

    def cost(self, miss_cost: float, false_alarm_cost: float) -> float:
        return miss_cost * self.misses + false_alarm_cost * self.false_alarms


def score(keys: np.ndarray, ticks: np.ndarray, events: np.ndarray, alerts: np.ndarray,
          horizon: int) -> Score:
    """Judge `alerts` (bool per row) against the `events` in the same rows."""
    keys = np.asarray(keys)
    ticks = np.asarray(ticks, dtype=np.int64)
    alerts = np.asarray(alerts, dtype=bool)
    nxt = next_event_ticks(keys, ticks, events)
    positive = positive_ticks(ticks, nxt, horizon)
    own = event_ticks_mask(ticks, nxt)
    negative = ~positive & ~own
    false_alarms = int((alerts & negative).sum())
    # events: one per (key, event tick); caught when any positive row of it alerted
    event_rows = np.flatnonzero(np.asarray(events, dtype=bool))
    hit_rows = np.flatnonzero(alerts & positive)
    first_alert: dict[tuple, int] = {}
    for key, when, tick in zip(keys[hit_rows].tolist(), nxt[hit_rows].tolist(),
                               ticks[hit_rows].tolist(), strict=True):
        slot = (key, when)
        if slot not in first_alert or tick < first_alert[slot]:
            first_alert[slot] = tick
    leads = []
    for key, tick in zip(keys[event_rows].tolist(), ticks[event_rows].tolist(), strict=True):
        first = first_alert.get((key, tick))
        if first is not None:
            leads.append(tick - first)
    return Score(events=len(event_rows), caught=len(leads), false_alarms=false_alarms,
                 negatives=int(negative.sum()), lead_ticks=tuple(leads))


def threshold_at_false_alarm_rate(p: np.ndarray, negative: np.ndarray, rate: float) -> float:
    """The lowest alerting threshold whose false-alarm rate on `negative` rows is <= `rate`."""
    scores = np.sort(np.asarray(p, dtype=float)[np.asarray(negative, dtype=bool)])[::-1]
    allowed = int(math.floor(rate * len(scores)))
    if allowed >= len(scores):
        return -math.inf
    return float(np.nextafter(scores[allowed], math.inf))


def efficiency(model: Score, rule: Score, miss_cost: float, false_alarm_cost: float,
               ) -> float:
    """The rule's cost over the model's on the same rows (> 1: the model costs less)."""
    mine = model.cost(miss_cost, false_alarm_cost)
    theirs = rule.cost(miss_cost, false_alarm_cost)
    if mine == 0:
        return math.inf if theirs > 0 else 1.0
    return theirs / mine
