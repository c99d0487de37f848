"""`mlfs fleet train` for knob models: one policy from every host's dataset rows.

Each portion is one host's run of ticks, so each partition is turned into training
rows by the local learner itself (`KnobLearner.training_rows`: decision-time
features, knobs, label, weights), and `lightgbm.dask.DaskLGBMRegressor` fits them with
the learner's own parameters (mlfs/fleet/train.py says why and what is published).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from mlfs import __version__
from mlfs.trainers.knob.learner import KnobLearner

from .manifest import consistent, objects
from .store import Store
from .train import (
    CONNECT_TIMEOUT,
    HOST,
    LABEL,
    LABEL_BOUND,
    NETWORK_TIMEOUT_MINUTES,
    WEIGHT,
    TrainError,
    _announce,
    _session,
    agreeing,
    log,
    publish,
    read_portions,
    utc,
    watched,
)


def _aligned(frame: pd.DataFrame, info: Mapping[str, Any]) -> pd.DataFrame:
    """One portion's rows as the local learner trains on them (a map_partitions step)."""
    learner = KnobLearner(info, window=len(frame) + 1, feedback_window=1)
    columns = learner.columns + [LABEL, WEIGHT, HOST]
    if len(frame):
        learner.add_dataset(pa.Table.from_pandas(frame, preserve_index=False))
    X, y, w = learner.training_rows()
    out = pd.DataFrame(X, columns=learner.columns)
    out[LABEL] = y
    out[WEIGHT] = w
    out[HOST] = frame[HOST].iloc[0] if len(frame) and len(y) else ""
    return out[columns]


def train_knob_policy(store: Store, subsystem: str, info: dict, pairs: set[tuple[str, str]],
                      scheduler: str | None, *, folds: int, n_workers: int,
                      num_boost_round: int | None, since, until, fit_timeout: float,
                      key: Path | None, say, dashboard: str | None, started: float) -> dict:
    """A knob model's fleet policy from the hosts' dataset rows; published, its card."""
    import dask
    from distributed import Client, LocalCluster
    from lightgbm.dask import DaskLGBMRegressor

    url = store.url
    timings: dict[str, float] = {}
    probe = KnobLearner(info)
    rounds = num_boost_round or probe.num_boost_round
    wanted = sorted({"tick", "ts", "objective", HOST, *probe.feature_columns,
                     *probe.knob_columns})
    # the manifests' complete objects whose rows carry the host their path names
    paths = agreeing(consistent(store, objects(store, subsystem, "dataset")), pairs)
    if not paths:
        raise TrainError(f"{url}: no dataset rows of {subsystem}")
    since = None if since is None else utc(since)
    until = None if until is None else utc(until)
    with _session(scheduler, n_workers, dashboard, LocalCluster) as cluster:
        with Client(scheduler or cluster, timeout=CONNECT_TIMEOUT) as client:
            _announce(client, scheduler, dashboard, say)
            raw = read_portions(client, store, paths, wanted, since, until, say)
            meta = _aligned(raw._meta, info)
            rows = raw.map_partitions(_aligned, info, meta=meta)
            # one part per portion is many small parts; lightgbm.dask pays per part
            rows = rows.repartition(npartitions=max(1, min(rows.npartitions,
                                                           4 * n_workers)))
            timings["read_align"] = time.perf_counter() - started
            # one graph: the portions are read once for rows, hosts and time range
            # (value_counts is a tree reduction; groupby().size() shuffled, 9 s)
            lo, hi, per_host = dask.compute(raw.ts.min(), raw.ts.max(),
                                            rows[HOST].value_counts())
            per_host = per_host.sort_index()
            per_host = per_host[per_host.index != ""]
            say(f"alignment: {int(per_host.sum())} training rows, {len(per_host)} hosts")
            # values bounded before training: a label beyond LABEL_BOUND x the fleet's
            # median magnitude is not a measurement (1e12 from a rogue host made a leaf
            # of 1.38e11 that every puller would have installed): dropped, counted
            median = float(rows[LABEL].abs().quantile(0.5).compute())
            bound = LABEL_BOUND * max(median, 1e-12)
            kept = rows[np.isfinite(rows[LABEL]) & (rows[LABEL].abs() <= bound)]
            out_of_bounds = int((rows[LABEL].abs() > bound).sum().compute())
            if out_of_bounds:
                log.warning("%s: %d rows with a label beyond %g (x%g the median) left out",
                            subsystem, out_of_bounds, bound, LABEL_BOUND)
            rows = kept.persist()
            if per_host.sum() < 20:
                raise TrainError(f"{subsystem}: {int(per_host.sum())} training rows; need 20")
            hosts = list(per_host.index)
            params = dict(probe.params, n_estimators=rounds, time_out=NETWORK_TIMEOUT_MINUTES)
            params.pop("num_threads", None)
            params.pop("seed", None)

            def fit(frame):
                # lightgbm.dask refuses an empty part ("Input data must be 2
                # dimensional and non empty"): holding a host out empties some
                sizes = frame.map_partitions(len).compute()
                frame = frame.partitions[[i for i, n in enumerate(sizes) if n]]
                model = DaskLGBMRegressor(client=client, random_state=probe.seed, n_jobs=1,
                                          **params)
                watched(client, lambda: model.fit(frame[probe.columns], frame[LABEL],
                                                  sample_weight=frame[WEIGHT]),
                        fit_timeout, "lightgbm.dask fit")
                return model.to_local().booster_

            timings["summaries"] = time.perf_counter() - started
            validation: dict[str, float] = {}
            errors: list[np.ndarray] = []
            if len(hosts) >= 2:
                chosen = hosts[:folds]
                for k, held in enumerate(chosen, start=1):
                    say(f"fold {k}/{len(chosen)}: holding out host {held}")
                    booster = fit(rows[rows[HOST] != held])
                    local = rows[rows[HOST] == held].compute()
                    pred = booster.predict(local[probe.columns].to_numpy())
                    err = np.abs(local[LABEL].to_numpy() - pred)
                    validation[held] = float(err.mean())
                    errors.append(err)
            timings["validation"] = time.perf_counter() - started
            say(f"fit: {int(per_host.sum())} rows, {len(hosts)} hosts")
            booster = fit(rows)
            timings["fit"] = time.perf_counter() - started
    text = booster.model_to_string()
    gains = booster.feature_importance("gain")
    card = {
        "subsystem": subsystem,
        "mlfs_version": __version__,
        "rows": int(per_host.sum()),
        "rows_out_of_bounds": out_of_bounds,
        "hosts": {h: int(n) for h, n in per_host.items()},
        "time_range": [pd.Timestamp(lo).isoformat(), pd.Timestamp(hi).isoformat()],
        "validation": {
            "method": "leave one host out",
            # None with one host: no machine left to hold out
            "mae": float(np.concatenate(errors).mean()) if errors else None,
            "mae_per_host": validation,
        },
        "feature_importance_gain": {n: float(g) for n, g in
                                    zip(booster.feature_name(), gains, strict=True)},
        "columns": probe.columns,
        "objective": info.get("objective"),
        "params": {k: v for k, v in params.items() if isinstance(v, int | float | str)},
        "scheduler": scheduler or f"LocalCluster({n_workers} workers)",
        "seconds": round(time.perf_counter() - started, 3),
        "seconds_after": {k: round(v, 3) for k, v in timings.items()},
    }
    return publish(store, subsystem, text, card, key)
