"""`mlfs train MOUNTPOINT SUBSYSTEM` for a subsystem with targets: the predictor trainer.

An ordinary user of the mount, like the knob trainer: it creates and starts its model
(`mkdir models/<m>`, `echo start > control`), seals and reads the record dataset, labels
each row with what happened afterwards (its entity's event within the target's horizon,
the rule `mlfs.core.outcomes` counts by), fits a calibrated `EventLearner`, and uploads
it as the model's policy, whose output the proxy reads as a probability.  It refits as
rows arrive (every `refit_seconds`), which also keeps the proxy from calling it silent.

Class imbalance is handled by down-sampling negatives to about `NEGATIVES_PER_POSITIVE`
per positive, corrected inside the policy (trainers/predictor.py), never by weights.
Rows too recent to know their outcome (within the horizon of the newest tick, with no
event yet) are left out of the fit.

With a fleet predictor to start from (`mlfs train --fleet`), that policy is uploaded
before anything else, so a new host predicts from its first day; each refit then
challenges it with the host's own (`trainers.predictor.challenge`: log loss on the
host's newest rows) and drops it for good once the host's own predicts them better.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mlfs import client

from .predictor import MIN_POSITIVES, challenge, fit_predictor

#: the newest rows read for a fit at most
MAX_ROWS = 3_000_000
NUMERIC = {"int64", "uint64", "int32", "uint32", "uint16", "uint8", "float64", "bool"}


def _read_records(directory: Path, columns: list[str]) -> pa.Table | None:
    names = client.list_portions(directory)
    tables: list[pa.Table] = []
    rows = 0
    for name in reversed(names):  # newest first, up to MAX_ROWS
        try:
            table = client.read_portion(directory / name, columns)
        except FileNotFoundError:
            continue  # removed by retention meanwhile
        tables.append(table)
        rows += table.num_rows
        if rows >= MAX_ROWS:
            break
    if not tables:
        return None
    return pa.concat_tables(list(reversed(tables)))


def run_predictor(mountpoint: str, subsystem: str, model: str = "lgbm", *,
                  stop: threading.Event | None = None, max_seconds: float | None = None,
                  log: logging.Logger = logging.getLogger("mlfs.train"),  # noqa: B008
                  seed: int = 0, refit_seconds: float = 10.0,
                  initial_policy: str | None = None) -> dict[str, Any]:
    """Train predictor `model` on MOUNTPOINT/SUBSYSTEM until `stop` or `max_seconds`;
    `initial_policy`: a fleet predictor's text, run until the host's own beats it."""
    stop = stop or threading.Event()
    sub = Path(mountpoint) / subsystem
    info = json.loads(client.read_attr(sub / "info"))
    target_name, target = next(iter(info["targets"].items()))
    records = info["records"]
    features = [n for n, kind in records.items()
                if kind in NUMERIC and n not in (target["key"], target["event"])]
    mdir = sub / "models" / model
    if not mdir.exists():
        mdir.mkdir()
    client.write_line(mdir / "control", "start")
    started = time.monotonic()
    stats: dict[str, Any] = {"fits": 0, "policies": 0, "rows": 0, "positives": 0,
                             "target": target_name,
                             "fleet": "prior" if initial_policy is not None else None}
    fleet = {"prior": initial_policy}
    if initial_policy is not None:
        try:
            _upload(mdir, initial_policy, stats)
            log.info("predictor trainer: the fleet predictor uploaded as the policy")
        except OSError as exc:  # the proxy refused it (errno and reason in `errors`)
            fleet["prior"], stats["fleet"] = None, "refused"
            log.error("predictor trainer: the fleet predictor was refused (%s); training "
                      "alone", exc.strerror or exc)
    next_fit = started
    while not stop.is_set():
        now = time.monotonic()
        if max_seconds is not None and now - started >= max_seconds:
            break
        if now >= next_fit:
            next_fit = now + refit_seconds
            try:
                _fit_and_upload(sub, mdir, target, features, seed + stats["fits"], stats, log,
                                fleet)
            except OSError as exc:
                log.warning("predictor trainer: %s (retrying)", exc)
        stop.wait(min(0.5, max(0.0, next_fit - time.monotonic())))
    stats["efficiency"] = client.read_attr_or(mdir / "efficiency", "unknown")
    stats["mode"] = client.read_attr_or(mdir / "mode", "?")
    log.info("predictor trainer done: %d fits, %d policies, efficiency %s, mode %s",
             stats["fits"], stats["policies"], stats["efficiency"], stats["mode"])
    return stats


def _upload(mdir: Path, text: str, stats: dict) -> None:
    with open(mdir / "policy", "w") as fh:
        fh.write(text)
    stats["policies"] += 1


def _fit_and_upload(sub: Path, mdir: Path, target: dict, features: list[str], seed: int,
                    stats: dict, log: logging.Logger, fleet: dict) -> None:
    """One refit; with a fleet predictor still held (`fleet["prior"]`), the host's own
    replaces it only when `challenge` finds it predicts the host's rows better."""
    client.write_line(sub / "control", "prepare_dataset")
    columns = [target["key"], "tick", target["event"], *features]
    table = _read_records(sub / "records", sorted(set(columns), key=columns.index))
    if table is None:
        return
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    learner, figures = fit_predictor(cols, target["key"], target["event"],
                                     int(target["horizon_ticks"]), features, seed=seed)
    stats["rows"], stats["positives"] = figures["rows"], figures["positives"]
    prior = fleet["prior"]
    if prior is not None:
        verdict = {"chosen": "prior", "why": "no model of its own yet"}
        if learner is not None:
            try:
                verdict = challenge(prior, {n: np.array(v) for n, v in cols.items()},
                                    target["key"], target["event"],
                                    int(target["horizon_ticks"]), features, seed=seed)
            except ValueError as exc:  # it reads columns this host's rows lack
                verdict = {"chosen": "local", "why": f"it cannot predict these rows: {exc}"}
        stats["challenge"] = verdict
        if verdict["chosen"] == "prior":
            # re-uploaded: a trainer that uploads nothing is called silent by the proxy
            _upload(mdir, prior, stats)
            log.info("predictor trainer: the fleet predictor kept: %s", verdict["why"])
            return
        fleet["prior"] = None
        stats["fleet"] = "dropped"
        log.info("predictor trainer: the fleet predictor dropped: %s", verdict["why"])
    if learner is None:
        log.info("predictor trainer: %d positive rows of %d, waiting for %d",
                 figures["positives"], figures["rows"], MIN_POSITIVES)
        return
    rate = figures["negative_rate"]
    positives = figures["positives"]
    stats["fits"] += 1
    _upload(mdir, learner.policy_text(), stats)
    log.info("predictor trainer: fit %d on %d rows (%d positive, negatives kept at %.3g), "
             "policy uploaded", stats["fits"], figures["rows"], positives, rate)
