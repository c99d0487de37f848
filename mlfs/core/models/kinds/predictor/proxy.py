"""Predictor models: the proxy of a model that forecasts events instead of setting knobs.

A subsystem with targets (`Subsystem.targets`, a record source) has predictor models.
Their inputs are predictions, written as lines into `recommend`
(``drive_id=17 target=failure p=0.83 [ttl=N]``) or made on every tick by an uploaded
policy whose output is the probability (LightGBM's binary objective, verified like any
policy).  A prediction changes nothing in the world, so nothing is interleaved: on every
tick each record row gets the model's probability and the default rule's verdict (the
target's `rule` field), and both are judged side by side when the horizon has passed
(`mlfs.core.models.predictor.ShadowBook`, the counting rule of `mlfs.base.outcomes`).

The proxy's promise is the knob proxy's: check, act on a share set by the mode, measure
against the human-made algorithm, feed the error back.  Modes gate actions, not
measurement: every mode scores both sides, and what is *raised* (an `alert` event, the
metric, a line in the model's `alerts` file) is
- emergency: the declared rule's alerts alone; learning: the incumbent rule's (the
  model is shadowed); collaboration: the model's and the incumbent rule's;
  recommendation: the model's, replacing the rule's (pinned there by hand, beside the
  rule's until the model beats the rule on outcomes: `_replaces_rule`).
The incumbent rule is the declared one until a single-column threshold rule swept over
the labelled outcomes is proven clearly better (`mlfs.core.models.rule_incumbent`).
An entity's alert is raised once per horizon (the same drive is not re-announced every
tick).  The efficiency (the rule's cost over the model's, docs/ABI.md "Predictors")
drives the same mode machine as a knob model's.
"""

from __future__ import annotations

import collections
import math
import time

import numpy as np
import pyarrow as pa

from mlfs.abi import Target, WindowState
from mlfs.base.clock import rfc3339

from ...efficiency import EfficiencyStats
from ...predictor import Judged, PredictorEfficiency, ShadowBook
from ...proxy import ModelProxy
from ...rule_incumbent import RuleIncumbent, RuleSweep, sweep_columns
from .inputs import Prediction, PredictionPolicy, parse_predictions

#: predictions written into `recommend` kept per target (an entity's newest wins)
MAX_PREDICTIONS = 100_000
#: the alerting threshold on a written or predicted probability
ALERT_THRESHOLD = 0.5
#: lines kept in a model's `alerts` file
ALERTS_KEPT = 1000
#: feedback rows one tick may write (alerts and positives first; the rest are counted)
MAX_FEEDBACK_ROWS_PER_TICK = 5000


class PredictorWindow:
    """Every target's shadow book and the model's efficiency over all of them."""

    def __init__(self, targets: dict[str, Target], min_events: int = 3,
                 records: dict[str, str] | None = None) -> None:
        self.targets = targets
        self.books = {name: ShadowBook(t.horizon_ticks) for name, t in targets.items()}
        #: per target, the threshold rules swept over its labelled rows and the incumbent
        self.sweeps = {name: RuleSweep(t, sweep_columns(records or {}, t))
                       for name, t in targets.items()}
        self.restarts = 0  # mode switches: the incumbent's standing counts from the last
        first = next(iter(targets.values()))
        self.efficiency = PredictorEfficiency(first.miss_cost, first.false_alarm_cost,
                                              min_events)
        self.max_span = 0  # a knob window's attribute; nothing carries over here

    def stats(self, since: int | None = None) -> EfficiencyStats:
        """Over every outcome judged since the last `restart` (a growing sample, as
        the knob window's in collaboration and recommendation; `since` is not used)."""
        ratio, z = self.efficiency.estimate()
        side = self.efficiency.model
        # each judged event is one independent sample of the two sides' costs
        return EfficiencyStats(ratio, z, side.events, side.negatives, math.nan,
                               episodes=side.events)

    def restart(self, tick: int) -> None:
        """A mode switch: the efficiency counts the outcomes judged from now on.  The
        books keep their open predictions, so every outcome is still judged and fed
        back."""
        first = next(iter(self.targets.values()))
        self.efficiency = PredictorEfficiency(first.miss_cost, first.false_alarm_cost,
                                              self.efficiency.min_events)
        self.restarts += 1

    def flush(self) -> list:
        return []  # outcomes are judged when their horizon passes, never guessed at stop


class PredictorProxy(ModelProxy):
    """A predictor's proxy: predictions in, shadow scores and alerts out."""

    kind = "predictor"
    #: the event type an alert is published as (a kind built on this one names its own)
    event = "alert"

    def _new_window(self) -> PredictorWindow:
        return PredictorWindow(dict(self.runtime.subsystem.targets),
                               records=dict(self.runtime.subsystem.records))

    def _setup(self) -> None:
        self.targets: dict[str, Target] = dict(self.runtime.subsystem.targets)
        # the best threshold rule: recommendation must beat it (rule_incumbent.py)
        self.incumbent = RuleIncumbent(self.window, self.window.sweeps)
        self.predictions: dict[str, dict[object, tuple[float, int | None]]] = {
            t: {} for t in self.targets}
        self.raised: dict[tuple[str, object], int] = {}
        self.alerts: collections.deque[str] = collections.deque(maxlen=ALERTS_KEPT)
        self.alerts_raised: collections.Counter[str] = collections.Counter()
        #: per target, the entities' last rows for the policy's window features
        self.history: dict[str, WindowState] = {}

    def _feedback_schema(self, runtime) -> pa.Schema:
        return pa.schema([
            ("tick", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("model", pa.string()),
            ("target", pa.string()), ("key", pa.string()), ("p", pa.float64()),
            ("model_alert", pa.bool_()), ("rule_alert", pa.bool_()),
            ("outcome", pa.int64()), ("error", pa.float64()),
        ])

    # ---- inputs ------------------------------------------------------------------
    def _parse_recommend(self, data: bytes) -> list:
        return parse_predictions(data, self.targets, self.runtime.subsystem.records)

    def _accept(self, parsed: Prediction, rec_id: int) -> None:
        table = self.predictions[parsed.target]
        if parsed.key not in table and len(table) >= MAX_PREDICTIONS:
            table.pop(next(iter(table)))  # the oldest entity's prediction goes
        until = None if parsed.ttl is None else self.runtime.next_tick + parsed.ttl
        table[parsed.key] = (parsed.p, until)

    def _build_policy(self, text: bytes):
        return PredictionPolicy(text, self.runtime.subsystem.records)

    # ---- the tick: score both sides, raise what the mode allows ------------------------
    def observe(self, tick: int, table: pa.Table | None) -> None:
        """The tick's records: predict, book both sides, judge what is due, raise alerts.

        Nothing is interleaved (a prediction changes nothing in the world): the kind's
        entry runs this after every tick (`kinds.ModelKind.after_tick`)."""
        if table is None or table.num_rows == 0:
            return
        if self.state == "started":
            self._set_state("running")
        self.ml_ticks += 1
        self.modes.ml_since_transition += 1
        feedback: list[dict] = []
        for name, target in self.targets.items():
            keys = table.column(target.key).to_numpy(zero_copy_only=False)
            events = table.column(target.event).to_numpy(zero_copy_only=False).astype(bool)
            rule = table.column(target.rule).to_numpy(zero_copy_only=False).astype(bool)
            p = self._probabilities(name, tick, keys, table)
            model = self._alerting(p)
            sweep = self.window.sweeps[name]
            judged = self.window.books[name].add(tick, keys, events, np.nan_to_num(p),
                                                 model, rule, sweep.features(table))
            self.window.efficiency.update(judged)  # against the declared rule (the default)
            self.incumbent.update(name, judged)  # the rule sweep; the standing against it
            feedback += self._feedback_rows(name, judged)
            # the rule's alerts that stand are the incumbent's (the declared rule's until a
            # swept rule is proven clearly better on outcomes); emergency, which runs the
            # default algorithm everywhere, raises the declared rule's
            standing = rule if self.mode == "emergency" else sweep.incumbent_alerts(table,
                                                                                   rule)
            self._raise(name, target, tick, keys, p, model, standing, table)
        ts = int(time.time() * 1_000_000)
        for row in feedback[:MAX_FEEDBACK_ROWS_PER_TICK]:
            row["ts"] = ts
            self.feedback.append(row)

    def _alerting(self, p: np.ndarray) -> np.ndarray:
        """Which rows the model alerts on (a kind built on this one sets its own level)."""
        return np.nan_to_num(p, nan=0.0) >= ALERT_THRESHOLD

    def _probabilities(self, target: str, tick: int, keys: np.ndarray,
                       table: pa.Table) -> np.ndarray:
        if self.policy is not None:
            try:
                return self.policy.predict(table, self._windows(target, keys, table))
            except Exception as exc:  # a policy never stops the tick loop
                self._remove_policy(f"failed: {type(exc).__name__}: {str(exc)[:200]}")
        written = self.predictions[target]
        p = np.full(len(keys), math.nan)
        if written:
            for i, key in enumerate(keys.tolist()):
                hit = written.get(key)
                if hit is not None and (hit[1] is None or tick < hit[1]):
                    p[i] = hit[0]
        return p

    def _windows(self, target: str, keys: np.ndarray, table: pa.Table,
                 ) -> dict[str, np.ndarray] | None:
        """The policy's window features for this tick's rows.  The entities' history is
        kept from the first policy that names them on, and across policies naming the
        same ones (the trainer refits with the same features): a new feature set starts
        a new history, which the first rows of each entity then lack, as the first
        rows of the dataset lacked theirs."""
        names = self.policy.windows
        if not names:
            self.history.pop(target, None)
            return None
        state = self.history.get(target)
        if state is None or state.names != names:
            state = self.history[target] = WindowState(names, MAX_PREDICTIONS)
        fields = {s.field for s in state.specs}
        return state.update(keys, {f: table.column(f).to_numpy(zero_copy_only=False)
                                   for f in fields})

    def _feedback_rows(self, target: str, judged: Judged) -> list[dict]:
        if not len(judged):
            return []
        outcome = judged.column("outcome")
        model = judged.column("model_alert")
        rule = judged.column("rule_alert")
        keep = np.flatnonzero((outcome == 1) | model | rule)
        keys, ticks, p = judged.column("key"), judged.column("tick"), judged.column("p")
        return [{"tick": int(ticks[i]), "model": self.name, "target": target,
                 "key": str(keys[i]), "p": float(p[i]), "model_alert": bool(model[i]),
                 "rule_alert": bool(rule[i]), "outcome": int(outcome[i]),
                 "error": float(outcome[i] - p[i])} for i in keep.tolist()]

    def _raise(self, name: str, target: Target, tick: int, keys: np.ndarray, p: np.ndarray,
               model: np.ndarray, rule: np.ndarray, table: pa.Table) -> None:
        mode = self.mode
        sources = {"emergency": ("rule",), "learning": ("rule",),
                   "collaboration": ("model", "rule"), "recommendation": ("model",)}[mode]
        if mode == "recommendation" and not self._replaces_rule():
            sources = ("model", "rule")
        for source in sources:
            flags = model if source == "model" else rule
            for i in np.flatnonzero(flags).tolist():
                key = keys[i].item() if hasattr(keys[i], "item") else keys[i]
                last = self.raised.get((name, key))
                if last is not None and tick - last < target.horizon_ticks:
                    continue  # announced within the horizon already
                if len(self.raised) >= MAX_PREDICTIONS:
                    self.raised.pop(next(iter(self.raised)))
                self.raised[(name, key)] = tick
                prob = None if math.isnan(p[i]) else round(float(p[i]), 4)
                self.alerts_raised[source] += 1
                self.alerts.append(f"{rfc3339()} tick={tick} target={name} "
                                   f"{target.key}={key} source={source} p={prob} mode={mode}")
                self.bus.publish(self.runtime.name, self.event, model=self.name, target=name,
                                 key=str(key), source=source, p=prob, mode=mode)
                if source == "model" and mode == "recommendation":
                    argument = (table.column(target.argument)[i].as_py() if target.argument
                                else key)
                    self._act(name, str(argument))

    def _replaces_rule(self) -> bool:
        """Whether the model's alerts replace the rule's: under automatic switching the
        mode machine's bar was the proof (`RuleStanding`); pinned by a write to `mode`,
        the model passed no bar, so the rule's alerts stand beside its own until it beats
        the rule since the pin, as a pinned knob policy decides only where it is proven."""
        return self.pinned != "recommendation" or self.incumbent.standing().policy_proven

    def _act(self, target: str, argument: str) -> None:
        """The configured action command for an alert of the model's own (root's, bounded)."""
        runner = self.runtime.mount.actions
        if not runner.configured(self.runtime.name):
            return

        def done(status: str, code: int | None, seconds: float) -> None:
            self.alerts.append(f"{rfc3339()} action target={target} argument={argument} "
                               f"{status} exit={code} seconds={seconds}")
            self.bus.publish(self.runtime.name, "action", model=self.name, target=target,
                             argument=argument, status=status, exit=code, seconds=seconds)

        runner.start(self.runtime.name, argument, done)

    # ---- what the files show -------------------------------------------------------------
    def efficiency_text(self) -> str:
        value = self.window.stats().efficiency
        return "unknown\n" if math.isnan(value) else f"{value:.3f}\n"

    def alerts_text(self) -> str:
        return "".join(line + "\n" for line in self.alerts)


__all__ = ["PredictorProxy", "PredictionPolicy", "parse_predictions", "Prediction"]
