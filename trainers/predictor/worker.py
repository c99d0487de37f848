"""`mlfs train MOUNTPOINT SUBSYSTEM` for a subsystem with targets: the predictor trainer.

An ordinary user of the mount, like the knob trainer: it creates and starts its model
(`mkdir models/<m>`, `echo start > control`), seals and reads the record dataset, labels
each row with what happened afterwards (its entity's event within the target's horizon,
the rule `mlfs.base.outcomes` counts by), fits a calibrated `EventLearner`, and uploads
it as the model's policy, whose output the proxy reads as a probability.  It refits as
rows arrive (every `refit_seconds`), and uploads the policy in force again every
POLICY_KEEPALIVE_SECONDS, so the proxy never calls it silent.

Each fit runs in a child process with a deadline (`trainers.fitting`: why, and what was
measured): this loop only waits, uploads and keeps the policy alive, so no fit can
starve it, and `max_seconds` holds however long a fit would take.  A fit reads at most
a row budget of the newest rows, from the rate the previous fit measured, stops
boosting at its deadline (at most REFIT_SECONDS, and before `max_seconds` by the time
the daemon took to answer this trainer: an upload and the loop's closing reads), and is
killed if it is still running KILL_GRACE_SECONDS later or when the loop ends.  A fit cut
short at its deadline is a valid model of fewer trees; it is uploaded only while no fit
of this host's own is in force.

Class imbalance is handled by down-sampling negatives to about `NEGATIVES_PER_POSITIVE`
per positive, corrected inside the policy (trainers/predictor/learner.py), never by weights.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from mlfs.trainers.fitting import FitProcess, row_budget
from mlfs.trainers.schedule import POLICY_KEEPALIVE_SECONDS

from mlfs import client

from .learner import MIN_POSITIVES, ROUNDS, challenge, fit_predictor

#: the newest rows read for a fit at most (fewer on a slow machine: `fitting.row_budget`)
MAX_ROWS = 3_000_000
NUMERIC = {"int64", "uint64", "int32", "uint32", "uint16", "uint8", "float64", "bool"}
#: a fit's time at most: the deadline its boosting stops at, when `max_seconds` is further
REFIT_SECONDS = 120.0
#: time kept after a fit's deadline, before `max_seconds`, to send and upload its policy
#: (a verified upload took up to a second beside two busy loops)
UPLOAD_RESERVE_SECONDS = 3.0
#: a fit left fewer seconds than this before its deadline is not started
MIN_FIT_SECONDS = 3.0
#: how long after its deadline a fit still assembling its rows is killed
KILL_GRACE_SECONDS = 10.0
#: requests to the daemon after the loop ends (the model's efficiency and mode)
FINISH_REQUESTS = 2
#: how often the loop looks at its fit, its keep-alive and `stop`
LOOP_SECONDS = 0.25


def _read_records(directory: Path, columns: list[str], max_rows: int) -> pa.Table | None:
    """The newest portions' rows, whole portions until `max_rows` are read."""
    names = client.list_portions(directory)
    tables: list[pa.Table] = []
    rows = 0
    for name in reversed(names):  # newest first
        try:
            table = client.read_portion(directory / name, columns)
        except FileNotFoundError:
            continue  # removed by retention meanwhile
        tables.append(table)
        rows += table.num_rows
        if rows >= max_rows:
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
    entered = time.monotonic()
    deadline = None if max_seconds is None else entered + max_seconds
    process = FitProcess(fit_in_child)
    process.start()  # its imports overlap the set-up below
    try:
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
        uploads.slowest = started - entered  # three requests: the daemon's pace, before any upload
        log.debug("predictor trainer: set up in %.1f s", started - entered)
        if initial_policy is not None:
            try:
                uploads.put(initial_policy)
                log.info("predictor trainer: the fleet predictor uploaded as the policy")
            except OSError as exc:  # the proxy refused it (errno and reason in `errors`)
                fleet["prior"], stats["fleet"] = None, "refused"
                log.error("predictor trainer: the fleet predictor was refused (%s); training "
                          "alone", exc.strerror or exc)
    except BaseException:
        process.close()
        raise
    fit = _Fit(sub, target, features, process)
    next_fit = started
    try:
        while not stop.is_set():
            # the loop ends early enough for the two reads that close it, and a fit early
            # enough for its upload, at the pace the daemon answered this trainer so far
            end = None if deadline is None else deadline - FINISH_REQUESTS * uploads.slowest
            if fit.running:
                result = fit.result(LOOP_SECONDS)
                if result is not None:
                    try:
                        _take(result, stats, log, fleet, uploads)
                    except OSError as exc:  # refused (errno and reason in `errors`), or the
                        # mount went away: the next fit tries again
                        log.warning("predictor trainer: %s (retrying)", exc)
                    next_fit = time.monotonic() + refit_seconds
                elif time.monotonic() >= fit.kill_at and (end is None or fit.kill_at < end):
                    fit.cancel()
                    log.warning("predictor trainer: a fit still running %g s after its "
                                "deadline was ended", KILL_GRACE_SECONDS)
                    next_fit = time.monotonic() + refit_seconds
            else:
                stop.wait(LOOP_SECONDS)
            now = time.monotonic()
            if end is not None and now >= end:
                break
            fit_deadline = now + REFIT_SECONDS
            if end is not None:
                fit_deadline = min(fit_deadline,
                                   end - max(UPLOAD_RESERVE_SECONDS, uploads.slowest))
            if not fit.running and now >= next_fit and fit_deadline - now >= MIN_FIT_SECONDS:
                fit.start(seed + stats["fits"], fit_deadline, end, fleet["prior"])
                log.debug("predictor trainer: a fit started, its deadline in %.1f s",
                          fit_deadline - now)
            try:
                uploads.keep_alive(now)
            except OSError as exc:
                log.warning("predictor trainer: keep-alive upload refused: %s", exc)
    finally:
        if fit.running:
            log.info("predictor trainer: the fit still running when it stopped was ended")
        fit.close()
    stats["efficiency"] = client.read_attr_or(mdir / "efficiency", "unknown")
    stats["mode"] = client.read_attr_or(mdir / "mode", "?")
    log.info("predictor trainer done: %d fits, %d policies, efficiency %s, mode %s",
             stats["fits"], stats["policies"], stats["efficiency"], stats["mode"])
    return stats


class _Uploads:
    """The policy in force and when it went up: a fit's and the keep-alive's uploads."""

    def __init__(self, mdir: Path, stats: dict, keepalive_seconds: float) -> None:
        self.mdir, self.stats, self.keepalive_seconds = mdir, stats, keepalive_seconds
        self.text: str | None = None
        self.at = 0.0
        #: the longest the daemon took to answer this trainer (an upload, which it
        #: verifies, or the set-up's requests): 6 s beside a loaded daemon, against
        #: tens of milliseconds on a quiet machine
        self.slowest = 0.0

    def put(self, text: str) -> None:
        began = time.monotonic()
        try:
            with open(self.mdir / "policy", "w") as fh:
                fh.write(text)
        finally:  # a refused upload is tried again one interval later, not at once
            self.at = time.monotonic()
            self.slowest = max(self.slowest, self.at - began)
        self.text = text
        self.stats["policies"] += 1

    def keep_alive(self, now: float) -> None:
        """Upload the policy in force again when the last upload is `keepalive_seconds`
        old (the proxy calls a trainer silent after 60 s by default)."""
        if self.text is not None and now - self.at >= self.keepalive_seconds:
            self.put(self.text)
            self.stats["keepalives"] = self.stats.get("keepalives", 0) + 1


@dataclass
class _Fit:
    """The fit in its child process, and the rate it read rows at (the next budget)."""

    sub: Path
    target: dict
    features: list[str]
    process: FitProcess
    rows_per_second: float | None = None
    kill_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.process.busy

    def start(self, seed: int, fit_deadline: float, end: float | None,
              prior: str | None) -> None:
        """Start a fit stopping at `fit_deadline`, killed KILL_GRACE_SECONDS later or when
        the trainer's loop ends (`end`), whichever comes first."""
        now = time.monotonic()
        self.kill_at = fit_deadline + KILL_GRACE_SECONDS
        if end is not None:
            self.kill_at = min(self.kill_at, end)
        self.process.submit({
            "sub": str(self.sub), "target": self.target, "features": self.features,
            "seed": seed, "deadline": fit_deadline, "prior": prior,
            "max_rows": row_budget(self.rows_per_second, fit_deadline - now, MAX_ROWS)})

    def result(self, timeout: float) -> dict | None:
        out = self.process.result(timeout)
        if out is not None and out.get("assembly_seconds", 0) > 0:
            self.rows_per_second = out["rows_read"] / out["assembly_seconds"]
        return out

    def cancel(self) -> None:
        self.process.cancel()

    def close(self) -> None:
        self.process.close()


def fit_in_child(request: dict) -> dict:
    """One fit, in the child process (`FitProcess`): the newest `max_rows` record rows,
    `fit_predictor` stopping at `deadline`, and with a fleet predictor (`prior`) still
    held, `challenge`'s verdict.  Returns what the trainer uploads and logs, and how fast
    the rows were assembled (`rows_read` in `assembly_seconds`: the next row budget)."""
    began = time.monotonic()
    sub, target, features = Path(request["sub"]), request["target"], request["features"]
    deadline, seed = request["deadline"], request["seed"]
    client.write_line(sub / "control", "prepare_dataset")
    columns = [target["key"], "tick", target["event"], *features]
    table = _read_records(sub / "records", sorted(set(columns), key=columns.index),
                          request["max_rows"])
    if table is None:
        return {"rows_read": 0, "seconds": time.monotonic() - began}
    cols = {name: table.column(name).to_numpy(zero_copy_only=False)
            for name in table.column_names}
    read_seconds = time.monotonic() - began
    key, event, horizon = target["key"], target["event"], int(target["horizon_ticks"])
    learner, figures = fit_predictor(cols, key, event, horizon, features, seed=seed,
                                     deadline=deadline)
    out: dict[str, Any] = {"rows_read": table.num_rows, "figures": figures,
                           "policy": learner.policy_text() if learner is not None else None}
    if learner is not None:  # the window features were computed: a rate for the next budget
        out["assembly_seconds"] = read_seconds + figures["assembly_seconds"]
    if request["prior"] is not None and learner is not None:
        try:
            out["verdict"] = challenge(request["prior"], cols, key, event, horizon,
                                       features, seed=seed, deadline=deadline)
        except ValueError as exc:  # it reads columns this host's rows lack
            out["verdict"] = {"chosen": "local", "why": f"it cannot predict these rows: {exc}"}
    out["seconds"] = time.monotonic() - began
    return out


def _take(result: dict, stats: dict, log: logging.Logger, fleet: dict,
          uploads: _Uploads) -> None:
    """A fit's result, in the trainer: upload its policy, unless a fleet predictor still
    held wins `challenge` or the fit was cut short while a fit of this host's is in force."""
    if "error" in result:
        log.warning("predictor trainer: a fit failed (retrying): %s\n%s", result["error"],
                    result.get("traceback", ""))
        return
    figures = result.get("figures")
    if figures is None:
        return  # no rows yet
    log.debug("predictor trainer: a fit read %d rows, assembled them in %.1f s, ended "
              "after %.1f s", result["rows_read"], result.get("assembly_seconds", 0.0),
              result["seconds"])
    stats["rows"], stats["positives"] = figures["rows"], figures["positives"]
    if fleet["prior"] is not None:
        verdict = result.get("verdict") or {"chosen": "prior", "why": "no model of its own yet"}
        stats["challenge"] = verdict
        if verdict["chosen"] == "prior":  # still in force (the keep-alive uploads it again)
            log.info("predictor trainer: the fleet predictor kept: %s", verdict["why"])
            return
        fleet["prior"] = None
        stats["fleet"] = "dropped"
        log.info("predictor trainer: the fleet predictor dropped: %s", verdict["why"])
    if result["policy"] is None:
        log.info("predictor trainer: %d positive rows of %d, waiting for %d",
                 figures["positives"], figures["rows"], MIN_POSITIVES)
        return
    trees = figures["trees"]
    if trees < ROUNDS:
        stats["cut_short"] = stats.get("cut_short", 0) + 1
        if stats["fits"]:
            log.info("predictor trainer: a fit on %d rows reached its deadline after %d of "
                     "%d rounds; the policy in force (a whole fit) is kept", figures["rows"],
                     trees, ROUNDS)
            return
    stats["fits"] += 1
    uploads.put(result["policy"])
    log.info("predictor trainer: fit %d on %d rows (%d positive, negatives kept at %.3g, "
             "%d of %d rounds, %d rows read in %.1f s), policy uploaded", stats["fits"],
             figures["rows"], figures["positives"], figures["negative_rate"], trees, ROUNDS,
             result["rows_read"], result.get("assembly_seconds", 0.0))
