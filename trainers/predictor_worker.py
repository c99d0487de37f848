"""`mlfs train MOUNTPOINT SUBSYSTEM` for a subsystem with targets: the predictor trainer.

An ordinary user of the mount, like the knob trainer: it creates and starts its model
(`mkdir models/<m>`, `echo start > control`), seals and reads the record dataset, labels
each row with what happened afterwards (its entity's event within the target's horizon,
the rule `mlfs.core.outcomes` counts by), fits a calibrated `EventLearner`, and uploads
it as the model's policy, whose output the proxy reads as a probability.  It refits as
rows arrive (every `refit_seconds`, in a thread: a fit on millions of rows can take a
minute on a busy machine), and uploads the policy in force again every
POLICY_KEEPALIVE_SECONDS, so the proxy never calls it silent.

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

import pyarrow as pa

from mlfs import client

from .predictor import MIN_POSITIVES, challenge, fit_predictor
from .schedule import POLICY_KEEPALIVE_SECONDS

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
                  initial_policy: str | None = None,
                  keepalive_seconds: float = POLICY_KEEPALIVE_SECONDS) -> dict[str, Any]:
    """Train predictor `model` on MOUNTPOINT/SUBSYSTEM until `stop` or `max_seconds`;
    `initial_policy`: a fleet predictor's text, run until the host's own beats it;
    `keepalive_seconds`: the policy in force is uploaded again after this long."""
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
    uploads = _Uploads(mdir, stats, keepalive_seconds)
    if initial_policy is not None:
        try:
            uploads.put(initial_policy)
            log.info("predictor trainer: the fleet predictor uploaded as the policy")
        except OSError as exc:  # the proxy refused it (errno and reason in `errors`)
            fleet["prior"], stats["fleet"] = None, "refused"
            log.error("predictor trainer: the fleet predictor was refused (%s); training "
                      "alone", exc.strerror or exc)

    def refit() -> None:
        try:
            _fit_and_upload(sub, target, features, seed + stats["fits"], stats, log, fleet,
                            uploads)
        except OSError as exc:
            log.warning("predictor trainer: %s (retrying)", exc)
        except Exception:  # a fit must never end the trainer: logged, tried again
            log.exception("predictor trainer: a refit failed (retrying)")

    # a refit on millions of rows can outlast the proxy's silence timeout while the
    # daemon keeps the cores busy (`mlfs demo --predict`: one fit a minute), so it runs
    # in a thread and the loop uploads the policy in force again meanwhile
    fitting: threading.Thread | None = None
    next_fit = started
    while not stop.is_set():
        now = time.monotonic()
        if max_seconds is not None and now - started >= max_seconds:
            break
        if fitting is not None and not fitting.is_alive():
            fitting.join()
            fitting, next_fit = None, now + refit_seconds
        if fitting is None and now >= next_fit:
            fitting = threading.Thread(target=refit, name="predictor-fit", daemon=True)
            fitting.start()
        try:
            uploads.keep_alive(now)
        except OSError as exc:
            log.warning("predictor trainer: keep-alive upload refused: %s", exc)
        stop.wait(0.5)
    if fitting is not None:
        fitting.join()
    stats["efficiency"] = client.read_attr_or(mdir / "efficiency", "unknown")
    stats["mode"] = client.read_attr_or(mdir / "mode", "?")
    log.info("predictor trainer done: %d fits, %d policies, efficiency %s, mode %s",
             stats["fits"], stats["policies"], stats["efficiency"], stats["mode"])
    return stats


class _Uploads:
    """The policy in force and when it went up: a refit's and the keep-alive's uploads
    (two threads) go through one lock."""

    def __init__(self, mdir: Path, stats: dict, keepalive_seconds: float) -> None:
        self.mdir, self.stats, self.keepalive_seconds = mdir, stats, keepalive_seconds
        self.text: str | None = None
        self.at = 0.0
        self._lock = threading.Lock()

    def put(self, text: str) -> None:
        with self._lock:
            try:
                with open(self.mdir / "policy", "w") as fh:
                    fh.write(text)
            finally:  # a refused upload is tried again one interval later, not at once
                self.at = time.monotonic()
            self.text = text
            self.stats["policies"] += 1

    def keep_alive(self, now: float) -> None:
        """Upload the policy in force again when the last upload is `keepalive_seconds`
        old (the proxy calls a trainer silent after 60 s by default)."""
        if self.text is not None and now - self.at >= self.keepalive_seconds:
            self.put(self.text)
            self.stats["keepalives"] = self.stats.get("keepalives", 0) + 1


def _fit_and_upload(sub: Path, target: dict, features: list[str], seed: int,
                    stats: dict, log: logging.Logger, fleet: dict, uploads: _Uploads) -> None:
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
                verdict = challenge(prior, cols, target["key"], target["event"],
                                    int(target["horizon_ticks"]), features, seed=seed)
            except ValueError as exc:  # it reads columns this host's rows lack
                verdict = {"chosen": "local", "why": f"it cannot predict these rows: {exc}"}
        stats["challenge"] = verdict
        if verdict["chosen"] == "prior":  # still in force (the keep-alive uploads it again)
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
    uploads.put(learner.policy_text())
    log.info("predictor trainer: fit %d on %d rows (%d positive, negatives kept at %.3g), "
             "policy uploaded", stats["fits"], figures["rows"], positives, rate)
