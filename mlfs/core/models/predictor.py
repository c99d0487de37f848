"""Shadow scoring: a predictor's alerts and the default rule's, judged side by side.

A prediction changes nothing in the world, so there is nothing to interleave: on every
tick the proxy has, for each entity of the tick's records (a drive, a device), the
model's probability and the rule's verdict, and both are kept here until their outcome
is known.  An event of entity *e* at tick *t* judges *e*'s rows of the `horizon` ticks
before it (positive: caught if any alerted, with the lead of the first alert); a row
older than `horizon` ticks whose entity had no event is a negative (a false alarm if it
alerted).  The counting rule is `mlfs.base.outcomes`'s, so a live book and an offline
`outcomes.score` over the same rows give the same figures (a test pins that).

Memory is bounded: the book holds `horizon + 1` ticks of rows, each tick at most
`max_rows` (a source publishing more is cut, and the cut counted).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from mlfs.base.outcomes import Score

#: rows one tick may bring into the book; more are dropped and counted (`rows_dropped`)
MAX_ROWS_PER_TICK = 200_000


@dataclass
class Judged:
    """The rows one tick judged (columns as numpy chunks), for feedback and the efficiency."""

    chunks: list[dict[str, np.ndarray]] = field(default_factory=list)
    lead_model: list[int] = field(default_factory=list)  # per event caught by the model
    lead_rule: list[int] = field(default_factory=list)
    events: int = 0

    def add(self, old: _Tick, rows: np.ndarray, outcome: int, event_tick: int = -1) -> None:
        """`event_tick`: the tick of the event a positive row warned of (-1: a negative),
        so a rule judged later on these rows groups them by event as the book did."""
        if len(rows):
            chunk = {"key": old.keys[rows], "tick": np.full(len(rows), old.tick),
                     "p": old.p[rows], "outcome": np.full(len(rows), outcome),
                     "event_tick": np.full(len(rows), event_tick, dtype=np.int64),
                     "model_alert": old.model_alert[rows],
                     "rule_alert": old.rule_alert[rows]}
            if old.features is not None:  # rows past the matrix's (a cut tick's) are NaN
                held = old.features
                values = np.full((len(rows), held.shape[1]), np.nan, dtype=held.dtype)
                inside = rows < len(held)
                values[inside] = held[rows[inside]]
                chunk["features"] = values
            self.chunks.append(chunk)

    def column(self, name: str) -> np.ndarray:
        """One column of the judged rows; "features" is the rows' feature matrix (the
        columns the book was given, `ShadowBook.add`), absent when none were."""
        if name == "features" and any("features" not in c for c in self.chunks):
            return np.zeros((0, 0), dtype=np.float32)
        if not self.chunks:
            return np.zeros(0, dtype=bool if name.endswith("alert") else np.float64)
        return np.concatenate([c[name] for c in self.chunks])

    def __len__(self) -> int:
        return sum(len(c["tick"]) for c in self.chunks)


@dataclass
class _Tick:
    tick: int
    keys: np.ndarray
    p: np.ndarray
    model_alert: np.ndarray
    rule_alert: np.ndarray
    judged: np.ndarray  # True once a row was judged positive (or is an event's own row)
    #: (rows, columns) float32 for the rule sweep; may hold fewer rows than `keys`
    features: np.ndarray | None = None


class ShadowBook:
    """The model's and the rule's alerts for one target, until their outcomes are known."""

    def __init__(self, horizon: int, max_rows: int = MAX_ROWS_PER_TICK) -> None:
        if horizon < 1:
            raise ValueError("horizon must be at least one tick")
        self.horizon = horizon
        self.max_rows = max_rows
        self._ticks: collections.deque[_Tick] = collections.deque()
        self.rows_dropped = 0

    def add(self, tick: int, keys: np.ndarray, events: np.ndarray, p: np.ndarray,
            model_alert: np.ndarray, rule_alert: np.ndarray,
            features: np.ndarray | None = None) -> Judged:
        """Record one tick's rows and judge everything whose outcome is now known.

        `features`: the rows' values of the columns candidate rules read (a float32
        matrix, one row per key), carried to the judged rows for the rule sweep
        (`mlfs.core.models.rule_incumbent`)."""
        keys = np.asarray(keys)
        n = len(keys)
        if n > self.max_rows:
            self.rows_dropped += n - self.max_rows
            n = self.max_rows
        judged = Judged()
        events = np.asarray(events, dtype=bool)[:n]
        keys = keys[:n]
        for key in keys[events].tolist():
            self._judge_event(key, tick, judged)
        own = np.zeros(n, bool)
        own[events] = True  # an event's own row warns nobody: judged neither way
        self._ticks.append(_Tick(tick, keys, np.asarray(p, dtype=np.float64)[:n],
                                 np.asarray(model_alert, dtype=bool)[:n],
                                 np.asarray(rule_alert, dtype=bool)[:n], own,
                                 None if features is None else features[:n]))
        while self._ticks and self._ticks[0].tick < tick - self.horizon + 1:
            self._expire(self._ticks.popleft(), judged)
        return judged

    def _judge_event(self, key, tick: int, judged: Judged) -> None:
        judged.events += 1
        first_model = first_rule = None
        for old in self._ticks:
            if not 1 <= tick - old.tick <= self.horizon:
                continue
            rows = np.flatnonzero((old.keys == key) & ~old.judged)
            if not len(rows):
                continue
            old.judged[rows] = True
            judged.add(old, rows, 1, tick)
            if first_model is None and old.model_alert[rows].any():
                first_model = old.tick
            if first_rule is None and old.rule_alert[rows].any():
                first_rule = old.tick
        if first_model is not None:
            judged.lead_model.append(tick - first_model)
        if first_rule is not None:
            judged.lead_rule.append(tick - first_rule)

    def _expire(self, old: _Tick, judged: Judged) -> None:
        judged.add(old, np.flatnonzero(~old.judged), 0)

    def flush(self) -> Judged:
        """Judge every row still held as negative (the end of the data)."""
        judged = Judged()
        while self._ticks:
            self._expire(self._ticks.popleft(), judged)
        return judged


@dataclass
class Tally:
    """Running counts for one source (the model or the rule) over the judged rows."""

    events: int = 0
    caught: int = 0
    false_alarms: int = 0
    negatives: int = 0
    leads: list[int] = field(default_factory=list)

    def score(self) -> Score:
        return Score(self.events, self.caught, self.false_alarms, self.negatives,
                     tuple(self.leads))


class PredictorEfficiency:
    """The rule's cost over the model's, with its confidence, over the judged rows so far.

    Costs: `miss_cost` per event not caught, `false_alarm_cost` per alerting negative
    row.  The confidence treats misses and false alarms as Poisson counts: the log of
    the ratio has a variance of sum(cost^2 * count) / total^2 on each side (the two
    sides' covariance is ignored, which overstates the doubt when they share events).
    With fewer than `min_events` events judged, the estimate is unknown (NaN), never a
    number a mode rule could act on.
    """

    def __init__(self, miss_cost: float, false_alarm_cost: float, min_events: int = 3) -> None:
        self.miss_cost = miss_cost
        self.false_alarm_cost = false_alarm_cost
        self.min_events = min_events
        self.model = Tally()
        self.rule = Tally()

    def update(self, judged: Judged) -> None:
        for side, alerts, leads in ((self.model, "model_alert", judged.lead_model),
                                    (self.rule, "rule_alert", judged.lead_rule)):
            side.events += judged.events
            side.caught += len(leads)
            side.leads.extend(leads)
            negative = judged.column("outcome") == 0
            side.negatives += int(negative.sum())
            side.false_alarms += int((judged.column(alerts) & negative).sum())

    def _cost(self, side: Tally) -> tuple[float, float]:
        misses = side.events - side.caught
        cost = self.miss_cost * misses + self.false_alarm_cost * side.false_alarms
        var = self.miss_cost ** 2 * misses + self.false_alarm_cost ** 2 * side.false_alarms
        return cost, var

    def estimate(self) -> tuple[float, float]:
        """(efficiency, z of its log against 1); NaN while unknown."""
        if self.model.events < self.min_events:
            return math.nan, math.nan
        mine, var_mine = self._cost(self.model)
        theirs, var_theirs = self._cost(self.rule)
        # half a unit on each side: a run with no miss and no false alarm is not infinite
        mine += 0.5 * self.false_alarm_cost
        theirs += 0.5 * self.false_alarm_cost
        ratio = theirs / mine
        sd = math.sqrt(var_mine / mine ** 2 + var_theirs / theirs ** 2)
        return ratio, (math.log(ratio) / sd if sd > 0 else math.nan)


def median_lead(side: Tally) -> float:
    return float(np.median(side.leads)) if side.leads else 0.0


def beats(one: Tally, other: Tally) -> bool:
    """The book's measure of one set of alerts against another on the same outcomes:
    no more false alarms, and more events caught or as many with a longer median lead
    (the model against its incumbent rule, a candidate rule against another)."""
    if one.events == 0 or one.false_alarms > other.false_alarms:
        return False
    return one.caught > other.caught or (
        one.caught == other.caught and median_lead(one) > median_lead(other))


@dataclass(frozen=True)
class RuleStanding:
    """A predictor's standing against its incumbent, the rule it is shadowed against
    (the `incumbent.Standing` the mode machine reads): the model `beats` it on outcomes
    when it raises no more false alarms and catches more events, or as many with a
    longer median lead.  The cost ratio (`efficiency`) can favour a model that buys one
    more catch with several false alarms; an operator keeps the rule then (issue 53's
    failing disk: the model caught 4/4 with two false alarms, "alert after the first
    error" 4/4 with none), so recommendation, where the model's alerts replace the
    rule's, waits for this; collaboration raises both.  `rule` is the standing rule's
    tally on the rows the model's was counted on (`rule_incumbent.RuleIncumbent`), and
    `rule_name` names it (the declared rule, or the swept "COLUMN >= t")."""

    model: Tally
    rule: Tally
    efficiency: float
    rule_name: str = "rule"

    #: the rule is the incumbent and the default at once: its estimate is 1
    estimate = 1.0

    @property
    def incumbent(self) -> str:
        return self.rule_name

    @property
    def vs_incumbent(self) -> float:
        return self.efficiency

    @property
    def policy_proven(self) -> bool:
        return beats(self.model, self.rule)

    @property
    def why(self) -> str:
        model, rule = self.model, self.rule
        return (f", against the rule {self.rule_name}: caught {model.caught}/{model.events} "
                f"(rule {rule.caught}), false alarms {model.false_alarms} (rule "
                f"{rule.false_alarms}), median lead {median_lead(model):g} ticks (rule "
                f"{median_lead(rule):g})")

    def text(self) -> str:
        """The standing's lines of the predictor's `incumbent` file."""
        proven = "yes" if self.policy_proven else "no"
        return f"model{self.why}\nmodel_beats_rule {proven}\n"
