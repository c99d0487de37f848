"""`mlfs train --kind anomaly`: fit an isolation forest on the records, upload it, refit.

The anomaly kind's trainer worker (the `anomaly` entry of `mlfs.trainers.kinds`).  Every
`refit_seconds` it reads the newest record rows of the subsystem through the mount
(`mlfs.client`), grows a forest on them (`learner.fit_anomaly`: unsupervised), picks the
score it alerts at by the target's costs on the rows whose outcome is known, and uploads
the forest as JSON into the model's `policy`.  Between fits it reads the model's
`feedback/` (the proxy's judged outcomes: every positive row and every alert, with the
score the daemon gave it) and moves the level through `recommend` when those outcomes
say another candidate level would have cost less (`level_from_feedback`).

With a fleet forest to start from (`mlfs train --fleet`) that forest goes up first and is
replaced by the host's own at the first fit.  The policy in force is uploaded again every
`keepalive_seconds` (the proxy calls a trainer silent after a minute).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from mlfs.trainers.predictor.worker import _read_records, _Uploads
from mlfs.trainers.schedule import POLICY_KEEPALIVE_SECONDS

from mlfs import client

from .learner import CANDIDATE_QUANTILES, MIN_EVENTS, default_features, fit_anomaly

#: the newest record rows a fit reads at most (scoring them all picks the level)
MAX_ROWS = 300_000
#: feedback rows read at most for the level
MAX_FEEDBACK_ROWS = 200_000
#: judged events the feedback needs before it moves the level
MIN_FEEDBACK_EVENTS = 3
LOOP_SECONDS = 0.25


def run_anomaly(mountpoint: str, subsystem: str, model: str = "anomaly", *,
                stop: threading.Event | None = None, max_seconds: float | None = None,
                log: logging.Logger = logging.getLogger("mlfs.train"),  # noqa: B008
                seed: int = 0, initial_policy: str | None = None,
                refit_seconds: float = 10.0,
                keepalive_seconds: float = POLICY_KEEPALIVE_SECONDS) -> dict[str, Any]:
    """Train anomaly model `model` on MOUNTPOINT/SUBSYSTEM until `stop` or `max_seconds`."""
    stop = stop or threading.Event()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    sub = Path(mountpoint) / subsystem
    info = json.loads(client.read_attr(sub / "info"))
    target_name, target = next(iter(info["targets"].items()))
    features = default_features(info["records"], target)
    mdir = sub / "models" / model
    if not mdir.exists():
        mdir.mkdir()
    if client.read_attr_or(mdir / "kind", "anomaly").strip() != "anomaly":
        client.write_line(mdir / "kind", "anomaly")
    client.write_line(mdir / "control", "start")
    stats: dict[str, Any] = {"fits": 0, "policies": 0, "levels": 0, "target": target_name,
                             "fleet": "prior" if initial_policy is not None else None}
    uploads = _Uploads(mdir, stats, keepalive_seconds)
    if initial_policy is not None:
        try:
            uploads.put(initial_policy)
        except OSError as exc:
            stats["fleet"] = "refused"
            log.error("anomaly trainer: the fleet forest was refused (%s)", exc.strerror or exc)
    next_fit = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        try:
            if now >= next_fit:
                _fit(sub, mdir, target, features, seed + stats["fits"], stats, uploads, log)
                next_fit = time.monotonic() + refit_seconds
            elif stats["fits"]:
                _feedback_level(mdir, target, stats, log)
            uploads.keep_alive(time.monotonic())
        except OSError as exc:  # refused (reason in `errors`) or the mount went away
            log.warning("anomaly trainer: %s (retrying)", exc)
            next_fit = time.monotonic() + refit_seconds
        stop.wait(LOOP_SECONDS)
    stats["efficiency"] = client.read_attr_or(mdir / "efficiency", "unknown")
    stats["mode"] = client.read_attr_or(mdir / "mode", "?")
    log.info("anomaly trainer done: %d fits, %d policies, efficiency %s, mode %s",
             stats["fits"], stats["policies"], stats["efficiency"], stats["mode"])
    return stats


def _fit(sub: Path, mdir: Path, target: dict, features: list[str], seed: int, stats: dict,
         uploads: _Uploads, log: logging.Logger) -> None:
    client.write_line(sub / "control", "prepare_dataset")
    columns = [target["key"], "tick", target["event"], *features]
    table = _read_records(sub / "records", list(dict.fromkeys(columns)), MAX_ROWS)
    if table is None:
        return
    cols = {n: table.column(n).to_numpy(zero_copy_only=False) for n in table.column_names}
    text, figures = fit_anomaly(cols, features, target, seed=seed)
    if text is None:
        return
    if stats["fleet"] == "prior" and figures["events"] < MIN_EVENTS:
        # the fleet forest's level was chosen on the fleet's events; this host's would
        # be a guess until it has events of its own
        log.info("anomaly trainer: the fleet forest kept (%d events known here, %d needed)",
                 figures["events"], MIN_EVENTS)
        return
    uploads.put(text)
    stats["fits"] += 1
    stats["fleet"] = "dropped" if stats["fleet"] == "prior" else stats["fleet"]
    stats.update(rows=figures["rows"], events=figures["events"],
                 alert_score=figures["alert_score"])
    stats["feedback_seen"] = 0
    stats.pop("written_level", None)
    log.info("anomaly trainer: fit %d on %d rows (%d events known), alerting at %.4f, "
             "forest uploaded", stats["fits"], figures["rows"], figures["events"],
             figures["alert_score"])


def level_from_feedback(p: np.ndarray, keys: np.ndarray, ticks: np.ndarray,
                        outcome: np.ndarray, model_alert: np.ndarray, level: float,
                        miss_cost: float, false_alarm_cost: float) -> float | None:
    """A level the proxy's judged rows say costs less than `level`, or None.

    The feedback holds every positive row the proxy judged and every negative row that
    alerted, with the score it had.  A level at or above `level` turns none of the
    unseen negatives into alarms, so its cost on these rows is exact: misses (an event,
    keyed by its entity and the last tick of its run of positive rows, with no positive
    row scoring at the level) times `miss_cost` plus the alerting negatives scoring at
    the level times `false_alarm_cost`.  Only levels up from `level` are tried; one
    down would need the negatives the feedback does not hold (a refit finds those)."""
    positive = outcome == 1
    if not positive.any():
        return None
    # an event: the positive rows of one entity; its caught when any of them scores high
    events: dict[object, float] = {}
    for key, score in zip(keys[positive].tolist(), p[positive].tolist(), strict=True):
        events[key] = max(events.get(key, 0.0), score)
    if len(events) < MIN_FEEDBACK_EVENTS:
        return None
    best = np.asarray(list(events.values()))
    alarms = p[~positive & model_alert]
    candidates = sorted({level, *np.quantile(np.concatenate([best, alarms]),
                                             CANDIDATE_QUANTILES).tolist()})

    def cost(at: float) -> float:
        return (miss_cost * int((best < at).sum())
                + false_alarm_cost * int((alarms >= at).sum()))

    tried = [c for c in candidates if c >= level]
    chosen = min(tried, key=lambda c: (cost(c), c))
    return chosen if cost(chosen) < cost(level) else None


def _feedback_level(mdir: Path, target: dict, stats: dict, log: logging.Logger) -> None:
    """Read the judged outcomes since the last look; write a cheaper level if they hold one."""
    names = client.list_portions(mdir / "feedback")
    if len(names) <= stats.get("feedback_seen", 0):
        return
    stats["feedback_seen"] = len(names)
    table = _read_records(mdir / "feedback", ["key", "tick", "p", "outcome", "model_alert"],
                          MAX_FEEDBACK_ROWS)
    if table is None or "alert_score" not in stats:
        return
    col = {n: table.column(n).to_numpy(zero_copy_only=False) for n in table.column_names}
    level = stats.get("written_level", stats["alert_score"])
    chosen = level_from_feedback(col["p"].astype(float), col["key"], col["tick"],
                                 col["outcome"], col["model_alert"].astype(bool), level,
                                 float(target["miss_cost"]), float(target["false_alarm_cost"]))
    stats["judged_events"] = int(len(set(col["key"][col["outcome"] == 1].tolist())))
    if chosen is None:
        return
    client.write_line(mdir / "recommend", f"alert_score={min(1.0, chosen):.6f}")
    stats["levels"] += 1
    stats["written_level"] = chosen
    log.info("anomaly trainer: the judged outcomes moved the level from %.4f to %.4f",
             level, chosen)
