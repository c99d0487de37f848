"""Anomaly detectors: the proxy of an unsupervised model that scores every record row.

A subsystem with targets (a record source such as sim.disks or linux.health) serves
anomaly models beside predictors (`echo anomaly > models/NAME/kind` before `start`).
The model's policy is an isolation forest (`forest.py`: JSON, verified, scored in numpy;
never a pickle); on every tick each record row gets its anomaly score, in (0, 1], and a
row scoring at or above the alerting level is the model's anomaly.  Its `recommend`
takes one line, ``alert_score=<level> [ttl=N]``: a trainer moves the level it learned
from the judged outcomes without uploading the forest again (a new forest brings its own
level, which replaces a written one).

What a model is judged on is the predictor's, imported, not restated
(`PredictorProxy`, `mlfs.core.models.predictor.ShadowBook`, `mlfs.base.outcomes`): the
target's events are the labelled anomalies (a drive's failure after its degradation),
the target's `rule` column the threshold rule it is compared with (SMART's own
threshold trip on sim.disks), both judged side by side once the horizon has passed,
with the target's costs.  What the mode lets through is raised as an `anomaly` event
and a line of the model's `anomalies` file: emergency and learning, the rule's alone
(the model is shadowed); collaboration, both; recommendation, the model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mlfs.base.errors import invalid
from mlfs.base.text import decode_text

from ..predictor.proxy import PredictorProxy
from .forest import MAX_FOREST_BYTES, Verified, max_rows, score, verify_forest

#: the longest a written level may last, in ticks
MAX_TTL = 1_000_000
NUMERIC = {"int64", "uint64", "int32", "uint32", "uint16", "uint8", "float64", "bool"}


@dataclass(frozen=True)
class AlertLevel:
    """One checked line of `recommend`: ``alert_score=<level in (0, 1]> [ttl=N]``."""

    line: str
    level: float
    ttl: int | None
    expect: None = None


def parse_level(data: bytes) -> list[AlertLevel]:
    """A whole write: one level line (Refused with EINVAL otherwise)."""
    lines = [line.strip() for line in decode_text(data).splitlines() if line.strip()]
    if len(lines) != 1:
        raise invalid("recommend takes one line: alert_score=<level in (0, 1]> [ttl=N]")
    fields: dict[str, str] = {}
    for word in lines[0].split():
        name, sep, value = word.partition("=")
        if not sep or not value or name in fields or name not in ("alert_score", "ttl"):
            raise invalid(f"{word[:40]!r} is not alert_score=<level> or ttl=<ticks>")
        fields[name] = value
    try:
        level = float(fields["alert_score"])
    except KeyError:
        raise invalid("alert_score= is missing") from None
    except ValueError:
        raise invalid("alert_score= is not a number") from None
    if not 0.0 < level <= 1.0:
        raise invalid(f"alert_score={level:g} is not an anomaly score in (0, 1]")
    ttl = None
    if "ttl" in fields:
        raw = fields["ttl"]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TTL:
            raise invalid(f"ttl={raw[:20]} is not a tick count in 1..{MAX_TTL}")
        ttl = int(raw)
    return [AlertLevel(lines[0], level, ttl)]


class AnomalyPolicy:
    """A verified isolation forest over numeric record columns: one score per row."""

    def __init__(self, text: bytes, records: dict[str, str]) -> None:
        if len(text) > MAX_FOREST_BYTES:
            raise invalid(f"policy over {MAX_FOREST_BYTES} bytes")
        self.verified: Verified = verify_forest(text)
        for name in self.verified.features:
            if records.get(name) not in NUMERIC:
                raise invalid(f"forest uses column {name!r}, not a numeric record field")
        self.text = text
        self.max_rows = max_rows(self.verified)
        self.rows_cut = 0

    def score(self, table: pa.Table) -> np.ndarray:
        """Scores for the rows (NaN beyond the step bound: no anomaly, counted)."""
        n = table.num_rows
        rows = min(n, self.max_rows)
        self.rows_cut += n - rows
        matrix = np.empty((rows, len(self.verified.features)))
        for j, name in enumerate(self.verified.features):
            matrix[:, j] = table.column(name).slice(0, rows).to_numpy(
                zero_copy_only=False).astype(np.float64)
        out = np.full(n, math.nan)
        if rows:
            out[:rows] = score(self.verified, matrix)
        return out


class AnomalyProxy(PredictorProxy):
    """An anomaly model's proxy: a forest's scores in, judged beside the rule, anomalies out."""

    kind = "anomaly"
    event = "anomaly"

    def _setup(self) -> None:
        super()._setup()
        #: a level written into `recommend`: (level, last tick it holds or None)
        self.written_level: tuple[float, int | None] | None = None

    # ---- inputs ------------------------------------------------------------------
    def _parse_recommend(self, data: bytes) -> list:
        return parse_level(data)

    def _accept(self, parsed: AlertLevel, rec_id: int) -> None:
        until = None if parsed.ttl is None else self.runtime.next_tick + parsed.ttl
        self.written_level = (parsed.level, until)

    def _build_policy(self, text: bytes) -> AnomalyPolicy:
        return AnomalyPolicy(text, self.runtime.subsystem.records)

    def check_policy(self, text: bytes) -> AnomalyPolicy:
        """Verify and build (any thread).  No check process: nothing but this module's
        numpy code reads a forest, and the verifier bounds what it reads."""
        running = self.policy
        if running is not None and text == running.text:
            return running
        return self._build_policy(text)

    def set_policy(self, text: bytes, policy=None) -> None:
        before = self.policy_text()
        super().set_policy(text, policy)
        if text and text != before:  # a new forest brings its own level (a keep-alive
            self.written_level = None  # upload of the same one keeps the written level)

    # ---- the tick (PredictorProxy.observe calls these) -------------------------------
    def _probabilities(self, target: str, tick: int, keys: np.ndarray,
                       table: pa.Table) -> np.ndarray:
        if self.policy is not None:
            try:
                return self.policy.score(table)
            except Exception as exc:  # a policy never stops the tick loop
                self._remove_policy(f"failed: {type(exc).__name__}: {str(exc)[:200]}")
        return np.full(len(keys), math.nan)

    def alert_level(self) -> float:
        """The level in force: a written one while it holds, else the forest's."""
        written = self.written_level
        if written is not None and (written[1] is None or self.runtime.next_tick <= written[1]):
            return written[0]
        return self.policy.verified.alert_score if self.policy is not None else math.inf

    def _alerting(self, p: np.ndarray) -> np.ndarray:
        return np.nan_to_num(p, nan=0.0) >= self.alert_level()

    # ---- what the files show -------------------------------------------------------------
    def anomalies_text(self) -> str:
        return self.alerts_text()


def anomaly_metrics(proxy: AnomalyProxy, w, labels: dict) -> None:
    """The kind's metric families, beside every model's."""
    for source in ("model", "rule"):
        w.metric("mlfs_model_anomalies_total", "counter",
                 "Anomalies an anomaly model raised, by whose they were (its mode decides).",
                 proxy.alerts_raised[source], source=source, **labels)
    if proxy.policy is not None:
        w.metric("mlfs_model_anomaly_rows_cut_total", "counter",
                 "Record rows left unscored over the per-tick step bound.",
                 proxy.policy.rows_cut, **labels)


__all__ = ["AlertLevel", "AnomalyPolicy", "AnomalyProxy", "anomaly_metrics", "parse_level"]
