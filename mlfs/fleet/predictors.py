"""`mlfs fleet train` for a subsystem with targets: one predictor from every host's records.

The local predictor trainer's rules, applied across hosts (each imported from
`mlfs.trainers.predictor.learner`, none restated): rows labelled by what happened to their entity
within the target's horizon, rows too recent to know left out, the window features
`default_windows` picks, negatives down-sampled to `NEGATIVES_PER_POSITIVE` a positive
(one rate for the whole fleet, so one correction fits every row), LightGBM's binary
objective with the local parameters, and the log-odds corrected in the first tree
(`calibrated`): the published policy gives probabilities, like a local one.

An entity's history (its labels, its window features) lies in many portions, so rows are
put together per host and subsystem, never per portion: the portions are read as one task
each (the progress line counts them), then one task per host and subsystem labels them,
counts positives and negatives, and, once the fleet's rate is known, computes the window
features and keeps the sampled rows.  `lightgbm.dask.DaskLGBMClassifier` fits those.
Validation holds out whole hosts; the error reported is the held-out host's log loss over
all its usable rows (its sampled negatives weighted back by 1/rate).
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlfs.trainers.predictor.learner import (
    MIN_POSITIVES,
    NUM_LEAVES,
    ROUNDS,
    calibrated,
    classifier_params,
    default_windows,
    label_rows,
    negative_rate,
)

LABEL, HOST, WEIGHT = "__label", "host_id", "__weight"
#: record field kinds a predictor reads (trainers/predictor/worker.py reads the same)
NUMERIC = {"int64", "uint64", "int32", "uint32", "uint16", "uint8", "float64", "bool"}
#: rows of each host kept to pick the window features from
SAMPLE_ROWS = 20_000
_PATH = re.compile(r"subsystem=(?P<sub>[^/]+)/host=(?P<host>[^/]+)/kind=records/")


def _labelled(parts: list[pd.DataFrame], target: dict) -> dict[str, Any]:
    """One host's rows with their labels: (columns, label, usable, counts, sample)."""
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    columns = {name: frame[name].to_numpy() for name in frame.columns}
    if not len(frame):
        return {"columns": columns, "positives": 0, "negatives": 0, "sample": frame}
    ticks = columns["tick"].astype(np.int64)
    horizon = int(target["horizon_ticks"])
    label, usable = label_rows(columns[target["key"]], ticks, columns[target["event"]],
                               horizon)
    usable &= label | (ticks <= ticks.max() - horizon)
    positives = int((label & usable).sum())
    return {"columns": columns, "label": label, "usable": usable, "positives": positives,
            "negatives": int(usable.sum()) - positives, "sample": frame.head(SAMPLE_ROWS)}


def _counts(host: dict) -> tuple[int, int, pd.DataFrame]:
    return host["positives"], host["negatives"], host["sample"]


def _sampled(host: dict, target: dict, fields: list[str], windows: list[str], rate: float,
             seed: int, name: str) -> pd.DataFrame:
    """The host's training rows: window features, every positive, negatives at `rate`
    (the local learner's draw: a uniform number per row below the rate)."""
    from mlfs.abi import window_features

    columns = host["columns"]
    if not host["positives"] + host["negatives"]:  # also the frame's meta
        out = pd.DataFrame({c: pd.Series(dtype="float64")
                            for c in [*fields, *windows, LABEL, WEIGHT]})
        out[HOST] = pd.Series([], dtype=str)
        return out
    columns = dict(columns, **window_features(columns[target["key"]], columns["tick"],
                                              columns, windows))
    label = host["label"]
    rng = np.random.default_rng(seed)
    keep = np.flatnonzero(host["usable"] & (label | (rng.random(len(label)) < rate)))
    out = pd.DataFrame({name_: np.asarray(columns[name_], dtype=np.float64)[keep]
                        for name_ in [*fields, *windows]})
    out[LABEL] = label[keep].astype(np.float64)
    # log loss over all usable rows: a kept negative stands for 1/rate of them
    out[WEIGHT] = np.where(label[keep], 1.0, 1.0 / rate)
    out[HOST] = pd.Series([name] * len(out), dtype=str)
    return out


class TooFewEvents(Exception):
    """Too few positive rows to learn from (str() says how many)."""


def wanted_columns(info: dict, filtering: bool) -> list[str]:
    """The record columns a predictor reads."""
    _, target = next(iter(info["targets"].items()))
    fields = [n for n, kind in info["records"].items()
              if kind in NUMERIC and n not in (target["key"], target["event"])]
    wanted = [target["key"], "tick", target["event"], HOST, *fields]
    return list(dict.fromkeys(wanted + (["ts"] if filtering else [])))


def train_predictor(client, paths: list[str], futures: list, info: dict, *, folds: int,
                    rounds: int | None, fit: Callable,
                    progress: Callable[[str], None]) -> tuple[str, dict]:
    """The calibrated policy text and the card's fields (the caller publishes), from the
    portions' read futures (one per path)."""
    target_name, target = next(iter(info["targets"].items()))
    key, event = target["key"], target["event"]
    fields = [n for n, kind in info["records"].items()
              if kind in NUMERIC and n not in (key, event)]
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for path, future in zip(paths, futures, strict=True):
        match = _PATH.search(path)
        groups[(match["host"], match["sub"])].append(future)
    hosts = {group: client.submit(_labelled, parts, target, pure=False)
             for group, parts in groups.items()}
    counts = client.gather([client.submit(_counts, h, pure=False) for h in hosts.values()])
    positives = sum(c[0] for c in counts)
    negatives = sum(c[1] for c in counts)
    names = [g[0] for g in hosts]
    per_host: dict[str, int] = defaultdict(int)
    for (host, _), (pos, neg, _) in zip(hosts, counts, strict=True):
        per_host[host] += pos + neg
    progress(f"alignment: {positives + negatives} usable rows, {positives} positive, "
             f"{len(per_host)} hosts", True)
    if positives < MIN_POSITIVES:
        raise TooFewEvents(f"{positives} positive rows ({target_name} within "
                         f"{target['horizon_ticks']} ticks); need {MIN_POSITIVES}")
    sample = pd.concat([c[2] for c in counts], ignore_index=True)
    windows = default_windows({n: sample[n].to_numpy() for n in fields}, fields)
    rate = negative_rate(positives, negatives)
    import dask.dataframe as dd

    parts = [client.submit(_sampled, h, target, fields, windows, rate, i, names[i],
                           pure=False) for i, h in enumerate(hosts.values())]
    meta = _sampled({"columns": {}, "positives": 0, "negatives": 0}, target, fields,
                    windows, rate, 0, "")
    rows = dd.from_delayed(parts, meta=meta).persist()
    columns = [*fields, *windows]
    params = dict(classifier_params(NUM_LEAVES, negative_rate=rate),
                  n_estimators=rounds or ROUNDS)
    params.pop("seed", None)
    validation: dict[str, float] = {}
    losses: list[tuple[float, float]] = []
    held_hosts = sorted(per_host)
    if len(held_hosts) >= 2:
        chosen = held_hosts[:folds]
        for k, held in enumerate(chosen, start=1):
            progress(f"fold {k}/{len(chosen)}: holding out host {held}", True)
            booster = fit(rows[rows[HOST] != held], columns, params)
            local = rows[rows[HOST] == held].compute()
            text = calibrated(booster.model_to_string(), rate)
            loss, weight = _log_loss(text, local, columns)
            validation[held] = loss / weight if weight else math.nan
            losses.append((loss, weight))
    progress(f"fit: {len(per_host)} hosts, {positives + negatives} usable rows, "
             f"negatives kept at {rate:.3g}", True)
    booster = fit(rows, columns, params)
    text = calibrated(booster.model_to_string(), rate)
    total = sum(w for _, w in losses)
    gains = booster.feature_importance("gain")
    card = {
        "kind": "predictor",
        "target": target_name,
        "rows": int(sum(per_host.values())),
        "positives": positives,
        "hosts": dict(sorted(per_host.items())),
        "negative_rate": rate,
        "window_features": windows,
        "columns": columns,
        "validation": {
            "method": "leave one host out",
            "log_loss": sum(v for v, _ in losses) / total if total else None,
            "log_loss_per_host": validation,
            "mae": None,
        },
        "feature_importance_gain": {n: float(g) for n, g in
                                    zip(booster.feature_name(), gains, strict=True)},
        "params": {k: v for k, v in params.items() if isinstance(v, int | float | str)},
    }
    return text, card


def _log_loss(text: str, frame: pd.DataFrame, columns: list[str]) -> tuple[float, float]:
    """(weighted log loss summed, weights summed) of the calibrated policy on `frame`."""
    import lightgbm as lgb

    if not len(frame):
        return 0.0, 0.0
    p = lgb.Booster(model_str=text).predict(frame[columns].to_numpy(), num_threads=1)
    p = np.clip(p, 1e-12, 1 - 1e-12)
    y = frame[LABEL].to_numpy()
    w = frame[WEIGHT].to_numpy()
    return float(-(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum()), float(w.sum())


def train_predictor_policy(store, subsystem: str, info: dict, pairs: set[tuple[str, str]],
                           scheduler: str | None, *,
                           folds: int, n_workers: int, num_boost_round: int | None, since,
                           until, fit_timeout: float, key: Path | None, say,
                           dashboard: str | None, started: float) -> dict:
    """A subsystem with targets: mlfs/fleet/predictors.py on the same kind of cluster,
    published the same way."""
    from distributed import Client, LocalCluster
    from lightgbm.dask import DaskLGBMClassifier as classifier

    from mlfs import __version__

    from .manifest import consistent, objects
    from .train import (
        CONNECT_TIMEOUT,
        NETWORK_TIMEOUT_MINUTES,
        TrainError,
        _announce,
        _session,
        agreeing,
        portion_futures,
        publish,
        utc,
        watched,
    )

    paths = agreeing(consistent(store, objects(store, subsystem, "records")), pairs)
    if not paths:
        raise TrainError(f"{store.url}: no records of {subsystem}")
    with _session(scheduler, n_workers, dashboard, LocalCluster) as cluster:
        with Client(scheduler or cluster, timeout=CONNECT_TIMEOUT) as client:
            _announce(client, scheduler, dashboard, say)

            def fit(frame, columns, params):
                sizes = frame.map_partitions(len).compute()
                frame = frame.partitions[[i for i, n in enumerate(sizes) if n]]
                model = classifier(client=client, random_state=0,
                                   time_out=NETWORK_TIMEOUT_MINUTES, **params)
                watched(client, lambda: model.fit(frame[columns], frame[LABEL]),
                        fit_timeout, "lightgbm.dask fit")
                return model.to_local().booster_

            paths = [p for p in paths if "/kind=records/" in p]
            futures = portion_futures(
                client, store, paths, wanted_columns(info, since is not None or
                                                     until is not None),
                None if since is None else utc(since), None if until is None else utc(until),
                say)
            try:
                text, card = train_predictor(client, paths, futures, info, folds=folds,
                                             rounds=num_boost_round, fit=fit, progress=say)
            except TooFewEvents as exc:
                raise TrainError(f"{subsystem}: {exc}; nothing published") from exc
    card = dict(card, subsystem=subsystem, mlfs_version=__version__,
                scheduler=scheduler or f"LocalCluster({n_workers} workers)",
                seconds=round(time.perf_counter() - started, 3))
    return publish(store, subsystem, text, card, key)
