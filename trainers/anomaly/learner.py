"""Learning an anomaly detector: an isolation forest, and the score it alerts at.

The forest is unsupervised (Liu, Ting, Zhou 2008; scikit-learn's `IsolationForest`): it
is grown on the records' numeric columns alone, with no label, and a row is anomalous
when random splits isolate it in few steps.  Only the alerting level uses what happened:
the records carry the target's event (a drive's failure), so each row is labelled by the
counting rule the proxy judges with (`mlfs.base.outcomes`, imported, not restated), and
the level is the one of `CANDIDATE_QUANTILES` whose alerts cost least on the known rows,
at the target's own costs (`miss_cost` per event missed, `false_alarm_cost` per alert on
a negative row): the same cost the proxy's efficiency compares with the rule's.

The fitted forest leaves as JSON (`export_forest`, the format of
mlfs/core/models/kinds/anomaly/forest.py), never as a pickle: the daemon verifies it and
scores it in numpy itself.
"""

from __future__ import annotations

import json
import math

import numpy as np
from sklearn.ensemble import IsolationForest

from mlfs.base import outcomes

__all__ = ["CANDIDATE_QUANTILES", "SAMPLES", "TREES", "choose_alert_score", "default_features",
           "export_forest", "fit_anomaly", "fit_forest", "forest_scores"]

#: trees and rows per tree: the paper's defaults (256 rows isolate an anomaly as well as
#: more do, and keep every tree at most 8 deep)
TREES = 100
SAMPLES = 256
#: rows a forest is grown from at most (each tree draws SAMPLES of them)
FIT_ROWS = 100_000
#: alerting levels tried, as quantiles of the rows' scores.  On sim.disks (3,000 drives,
#: seed 1) 0.99 alerted on 1 drive-day in 80 and caught 0.68 of failures; 0.999, 1 in
#: 1,100 and 0.64; 0.9999, none of the negatives and 0.45
CANDIDATE_QUANTILES = (0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999)
#: events the rows must hold before a level is chosen on them (else the 0.999 quantile)
MIN_EVENTS = 3
NUMERIC = {"int64", "uint64", "int32", "uint32", "uint16", "uint8", "float64", "bool"}


def default_features(records: dict[str, str], target: dict) -> list[str]:
    """Every numeric record column but the entity's key and the event itself."""
    return [n for n, kind in records.items()
            if kind in NUMERIC and n not in (target["key"], target["event"])]


def matrix(columns: dict[str, np.ndarray], features: list[str]) -> np.ndarray:
    return np.column_stack([np.asarray(columns[f], dtype=np.float64) for f in features])


def fit_forest(x: np.ndarray, seed: int = 0, trees: int = TREES,
               samples: int = SAMPLES) -> IsolationForest:
    """The forest, grown on at most FIT_ROWS rows drawn evenly from `x`."""
    step = max(1, len(x) // FIT_ROWS)
    return IsolationForest(n_estimators=trees, max_samples=min(samples, len(x[::step])),
                           max_features=1.0, random_state=seed).fit(x[::step])


def forest_scores(forest: IsolationForest, x: np.ndarray) -> np.ndarray:
    """The anomaly score in (0, 1] (the daemon's; scikit-learn's `score_samples` negated)."""
    return -forest.score_samples(x)


def choose_alert_score(scores: np.ndarray, keys: np.ndarray, ticks: np.ndarray,
                       events: np.ndarray, horizon: int, miss_cost: float,
                       false_alarm_cost: float) -> tuple[float, dict]:
    """The candidate level whose alerts cost least on the rows whose outcome is known,
    and the figures of each candidate (recall, false alarms, cost)."""
    ticks = np.asarray(ticks, dtype=np.int64)
    known = ticks <= ticks.max() - horizon if len(ticks) else np.zeros(0, bool)
    judged = {}
    best = (math.inf, float(np.quantile(scores, 0.999)) if len(scores) else 1.0)
    events_known = int(np.asarray(events, dtype=bool)[known].sum())
    for q in CANDIDATE_QUANTILES:
        level = float(np.quantile(scores, q))
        if events_known < MIN_EVENTS:
            continue
        s = outcomes.score(keys[known], ticks[known], events[known], scores[known] >= level,
                           horizon)
        cost = s.cost(miss_cost, false_alarm_cost)
        judged[str(q)] = {"alert_score": level, "recall": s.recall, "cost": cost,
                          "false_alarms": s.false_alarms, "negatives": s.negatives}
        if cost < best[0]:
            best = (cost, level)
    return min(1.0, max(best[1], 1e-9)), {"events": events_known, "candidates": judged}


def export_forest(forest: IsolationForest, features: list[str], alert_score: float) -> str:
    """The fitted forest in the daemon's JSON format (mlfs/core/models/kinds/anomaly/forest.py)."""
    if forest.n_features_in_ != len(features):
        raise ValueError("one feature name per column the forest was fitted on")
    if forest._max_features != forest.n_features_in_:
        # each tree would read its own subset of columns; the format has one for all
        raise ValueError("export needs max_features=1.0 (every tree reads every column)")
    trees = []
    for estimator in forest.estimators_:
        t = estimator.tree_
        leaf = t.children_left == -1
        trees.append({"feature": np.where(leaf, -1, t.feature).tolist(),
                      "threshold": np.where(leaf, 0.0, t.threshold).tolist(),
                      "left": t.children_left.tolist(), "right": t.children_right.tolist(),
                      "size": t.n_node_samples.tolist()})
    return json.dumps({"format": "mlfs.isolation_forest", "version": 1,
                       "features": list(features), "samples": int(forest.max_samples_),
                       "alert_score": float(alert_score), "trees": trees},
                      separators=(",", ":"))


def fit_anomaly(columns: dict[str, np.ndarray], features: list[str], target: dict,
                seed: int = 0) -> tuple[str | None, dict]:
    """One fit on a dataset's columns: (the policy text, figures); no policy without rows."""
    x = matrix(columns, features)
    finite = np.isfinite(x).all(axis=1)
    if finite.sum() < 2:
        return None, {"rows": int(len(x))}
    forest = fit_forest(x[finite], seed=seed)
    scores = np.where(finite, 0.0, math.nan)
    scores[finite] = forest_scores(forest, x[finite])
    keep = finite
    level, judged = choose_alert_score(
        scores[keep], np.asarray(columns[target["key"]])[keep],
        np.asarray(columns["tick"])[keep], np.asarray(columns[target["event"]], bool)[keep],
        int(target["horizon_ticks"]), float(target["miss_cost"]),
        float(target["false_alarm_cost"]))
    figures = {"rows": int(len(x)), "rows_fitted": int(finite.sum()),
               "alert_score": level, **judged}
    return export_forest(forest, features, level), figures
