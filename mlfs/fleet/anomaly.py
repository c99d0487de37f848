"""`mlfs fleet train` of an anomaly model: one isolation forest from every host's records.

The local anomaly trainer's rules (`mlfs.trainers.anomaly.learner`, imported, none
restated), applied across hosts on the Dask cluster:
- each host's record portions are read as one task each and put together per host and
  subsystem (an entity's history lies in many portions);
- one task per host draws its share of `FIT_ROWS` rows evenly from its rows; the forest
  is grown on those (a tree reads `SAMPLES` rows: the fit itself is small and runs here);
- one task per host scores every one of its rows with the daemon's own scorer
  (`mlfs.core.models.kinds.anomaly.forest.score`) and judges each candidate level on its
  rows whose outcome is known (`mlfs.base.outcomes.score`, the proxy's counting rule);
- the level published is the candidate with the least cost over all hosts, at the
  target's costs; validation holds out whole hosts: the level chosen on the others,
  judged on the held-out host (its recall and false alarms per 1,000 rows).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from mlfs.base import outcomes
from mlfs.trainers.anomaly.learner import (
    CANDIDATE_QUANTILES,
    FIT_ROWS,
    default_features,
    export_forest,
    fit_forest,
    forest_scores,
)

from .predictors import _PATH, HOST


def _host_rows(parts: list[pd.DataFrame], features: list[str], share: int) -> dict:
    """One host's rows: its columns, and `share` rows drawn evenly to grow the forest from."""
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    frame = frame.dropna(subset=[f for f in features if f in frame.columns])
    step = max(1, len(frame) // max(1, share))
    sample = frame[features].to_numpy(dtype=np.float64)[::step] if len(frame) else None
    return {"frame": frame, "sample": sample, "rows": len(frame)}


def _sample(host: dict):
    return host["sample"], host["rows"]


def _judge(host: dict, text: str, levels: list[float], target: dict,
           features: list[str]) -> list[tuple[int, int, int, int]]:
    """(events, caught, false alarms, negatives) of each level on the host's known rows."""
    from mlfs.core.models.kinds.anomaly.forest import score, verify_forest

    frame = host["frame"]
    if not len(frame):
        return [(0, 0, 0, 0)] * len(levels)
    ticks = frame["tick"].to_numpy(dtype=np.int64)
    known = ticks <= ticks.max() - int(target["horizon_ticks"])
    scores = score(verify_forest(text.encode()), frame[features].to_numpy(np.float64)[known])
    keys = frame[target["key"]].to_numpy()[known]
    events = frame[target["event"]].to_numpy(dtype=bool)[known]
    out = []
    for level in levels:
        s = outcomes.score(keys, ticks[known], events, scores >= level,
                           int(target["horizon_ticks"]))
        out.append((s.events, s.caught, s.false_alarms, s.negatives))
    return out


def _cost(counts, target: dict) -> float:
    events, caught, false_alarms, _ = counts
    return (float(target["miss_cost"]) * (events - caught)
            + float(target["false_alarm_cost"]) * false_alarms)


def _sum(rows) -> tuple[int, int, int, int]:
    return tuple(int(sum(r[i] for r in rows)) for i in range(4))


def train_anomaly(client, paths: list[str], futures: list, info: dict, *, folds: int,
                  progress) -> tuple[str, dict]:
    """The forest's text and the card's fields (the caller publishes), from the portions'
    read futures (one per path)."""
    target_name, target = next(iter(info["targets"].items()))
    features = default_features(info["records"], target)
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for path, future in zip(paths, futures, strict=True):
        match = _PATH.search(path)
        groups[(match["host"], match["sub"])].append(future)
    share = max(1, FIT_ROWS // max(1, len(groups)))
    hosts = {g: client.submit(_host_rows, parts, features, share, pure=False)
             for g, parts in groups.items()}
    samples = client.gather([client.submit(_sample, h, pure=False) for h in hosts.values()])
    per_host: dict[str, int] = defaultdict(int)
    for (host, _), (_, rows) in zip(hosts, samples, strict=True):
        per_host[host] += rows
    drawn = [s for s, _ in samples if s is not None and len(s)]
    if not drawn or sum(len(s) for s in drawn) < 2:
        raise ValueError(f"{sum(per_host.values())} record rows; need 2")
    x = np.concatenate(drawn)
    progress(f"fit: a forest on {len(x)} rows drawn from {len(per_host)} hosts", True)
    forest = fit_forest(x, seed=0)
    levels = sorted(set(np.quantile(forest_scores(forest, x), CANDIDATE_QUANTILES).tolist()))
    text = export_forest(forest, features, levels[-1])
    judged = client.gather([client.submit(_judge, h, text, levels, target, features,
                                          pure=False) for h in hosts.values()])
    names = [g[0] for g in hosts]
    totals = [_sum([j[i] for j in judged]) for i in range(len(levels))]
    best = min(range(len(levels)), key=lambda i: (_cost(totals[i], target), -levels[i]))
    progress(f"level: {levels[best]:.4f} of {len(levels)} candidates, "
             f"{totals[best][0]} events judged", True)
    validation: dict[str, dict] = {}
    for held in sorted(set(names))[:folds] if len(set(names)) >= 2 else []:
        others = [_sum([j[i] for j, n in zip(judged, names, strict=True) if n != held])
                  for i in range(len(levels))]
        pick = min(range(len(levels)), key=lambda i: (_cost(others[i], target), -levels[i]))
        mine = _sum([j[pick] for j, n in zip(judged, names, strict=True) if n == held])
        validation[held] = {"alert_score": levels[pick],
                            "recall": mine[1] / mine[0] if mine[0] else math.nan,
                            "false_alarms_per_1000": 1000.0 * mine[2] / max(1, mine[3])}
    events, caught, false_alarms, negatives = totals[best]
    card = {
        "kind": "anomaly",
        "target": target_name,
        "rows": int(sum(per_host.values())),
        "hosts": dict(sorted(per_host.items())),
        "columns": features,
        "alert_score": levels[best],
        "trees": len(forest.estimators_),
        "fit_rows": int(len(x)),
        "judged": {"events": events, "caught": caught, "false_alarms": false_alarms,
                   "negatives": negatives},
        "validation": {"method": "leave one host out (the level chosen on the others)",
                       "mae": None, "per_host": validation},
    }
    return export_forest(forest, features, levels[best]), card


def train_anomaly_policy(store, subsystem: str, info: dict, pairs: set[tuple[str, str]],
                         scheduler: str | None, *, folds: int, n_workers: int,
                         num_boost_round: int | None, since, until, fit_timeout: float,
                         key: Path | None, say, dashboard: str | None,
                         started: float) -> dict:
    """The `anomaly` entry of `mlfs.fleet.kinds`: read, fit, judge and publish as the
    predictor's round does (`num_boost_round` and `fit_timeout` do not apply: a forest
    is grown here from a bounded sample)."""
    from distributed import Client, LocalCluster

    from mlfs import __version__

    from .manifest import consistent, objects
    from .train import (
        CONNECT_TIMEOUT,
        TrainError,
        _announce,
        _session,
        agreeing,
        portion_futures,
        publish,
        utc,
    )

    paths = agreeing(consistent(store, objects(store, subsystem, "records")), pairs)
    paths = [p for p in paths if "/kind=records/" in p]
    if not paths:
        raise TrainError(f"{store.url}: no records of {subsystem}")
    _, target = next(iter(info["targets"].items()))
    columns = [target["key"], "tick", target["event"], HOST,
               *default_features(info["records"], target)]
    if since is not None or until is not None:
        columns.append("ts")
    with _session(scheduler, n_workers, dashboard, LocalCluster) as cluster:
        with Client(scheduler or cluster, timeout=CONNECT_TIMEOUT) as client:
            _announce(client, scheduler, dashboard, say)
            futures = portion_futures(client, store, paths, list(dict.fromkeys(columns)),
                                      None if since is None else utc(since),
                                      None if until is None else utc(until), say)
            try:
                text, card = train_anomaly(client, paths, futures, info, folds=folds,
                                           progress=say)
            except ValueError as exc:
                raise TrainError(f"{subsystem}: {exc}; nothing published") from exc
    card = dict(card, subsystem=subsystem, mlfs_version=__version__,
                scheduler=scheduler or f"LocalCluster({n_workers} workers)",
                seconds=round(time.perf_counter() - started, 3))
    return publish(store, subsystem, text, card, key)


__all__ = ["train_anomaly", "train_anomaly_policy"]
