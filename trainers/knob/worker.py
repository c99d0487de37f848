"""`mlfs train MOUNTPOINT SUBSYSTEM [--model NAME]`: the LightGBM trainer worker.

The worker is an ordinary user of the mount, as a user-space trainer of the
ml-lib proposal would be: it creates and starts its model proxy
(`mkdir models/<m>`, `echo start > control`), sleeps on the subsystem's
`events` stream, reads only the Parquet portions it has not seen, trains a
`KnobLearner`, uploads the booster as the proxy's policy, sends exploration
recommendations while the model is learning, and corrects the model with each
feedback portion (error back-propagation).

It treats the mount as something that can fail under it at any moment: the
daemon may restart (ENOTCONN, or the mount point is a plain directory for a
while), the proxy may be destroyed (`rmdir`), a write may be refused (EINVAL,
EBUSY: the reason is the last line of `errors`), a portion may vanish under
retention.  None of that ends the worker; it logs, backs off and carries on,
keeping what it has learned, and re-creates what it needs when the mount is
back.  Only `stop`, `max_seconds` or a signal end it.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from mlfs.trainers.schedule import (
    LEARNING_TTL,
    POLICY_KEEPALIVE_SECONDS,
    Steer,
    TrainerSchedule,
)

from mlfs import client
from mlfs.abi import NAME

from .cadence import fit_due
from .learner import ROLLED_OUT_MODES, KnobLearner, missing_features
from .reading import MountGone, MountReader, gone

__all__ = ["BadOptions", "run_worker"]

POLICY_MIN_SECONDS = 5.0  # each upload costs the daemon a check in a subprocess
PROGRESS_SECONDS = 5.0
RESCAN_SECONDS = 5.0  # safety net for missed events
START_RETRY_SECONDS = 2.0
POLL_SECONDS = 0.5
EMERGENCY_RETRY_SECONDS = 10.0


class BadOptions(Exception):
    """The worker's options do not fit the subsystem (a feature it does not have):
    the caller's mistake, which retrying cannot mend; `run_worker` raises it."""


class _Worker(MountReader):
    """One knob model's trainer: connection, fits, uploads, steering (its reading
    side: `reading.MountReader`)."""

    def __init__(self, mountpoint: str, subsystem: str, model: str, stop: threading.Event,
                 log: logging.Logger, prepare_seconds: float, seed: int,
                 learning_ttl: int = LEARNING_TTL, relative: bool = False,
                 initial_policy: str | None = None,
                 features: list[str] | None = None) -> None:
        self.root = Path(mountpoint)
        self.features = features
        self.initial_policy = initial_policy  # a fleet policy to start from
        self.subsystem = subsystem
        self.model = model
        self.sub = self.root / subsystem
        self.mdir = self.sub / "models" / model
        self.stop = stop
        self.log = log
        self.prepare_seconds = prepare_seconds
        self.seed = seed
        self.learning_ttl = learning_ttl
        self.relative = relative
        self.learner: KnobLearner | None = None
        self.schedule: TrainerSchedule | None = None
        self.info: dict[str, Any] = {}
        self.info_key = ""
        self.tick_seconds = 0.05
        self.connected = False
        self.events: client.EventStream | None = None
        self.seen: dict[str, set[str]] = {"dataset": set(), "feedback": set()}
        self.mode = "unknown"
        self.state = "unknown"
        self.efficiency = math.nan
        self.start_pending = True
        self.policy_live = False
        self.policy_dirty = False
        now = time.monotonic()
        self.t_start_try = 0.0
        self.t_fit = 0.0
        self.t_policy = 0.0
        self.t_progress = now
        self.t_rescan = now
        self.t_mode = 0.0
        self.t_next_rec = 0.0
        self.exploring = False  # the last recommendation sent explores (until t_next_rec)
        self.t_last_portion = now
        self.t_prepare = now
        self.warned: dict[str, float] = {}
        self.stats: dict[str, Any] = {
            "fits": 0, "corrections": 0, "policies": 0, "policy_rejected": 0,
            "recommendations": 0, "explorations": 0, "rejected": 0, "portions": 0,
            "feedback_portions": 0, "skipped_portions": 0, "reconnects": 0,
            "proxy_created": 0, "events": 0, "overflows": 0,
        }
        self.last_fit: dict[str, Any] = {}
        self.last_correction: dict[str, Any] = {}

    # ---- connection -------------------------------------------------------
    def connect(self) -> None:
        """(Re)attach to the mount: info, proxy, event stream, then the backlog."""
        text = self.read_attr(self.sub / "info")
        info = json.loads(text)
        key = json.dumps([info.get("objective"), info.get("knobs"), info.get("features")],
                         sort_keys=True)
        unknown = missing_features(info, self.features or ())
        if unknown:
            raise BadOptions(f"{self.subsystem} has no feature {', '.join(unknown)} "
                             f"(its features: {self.sub / 'info'})")
        self.info = info
        self.tick_seconds = float(info.get("tick_seconds") or 0.05)
        if key != self.info_key:
            self.info_key = key
            self.learner = None
        self.ensure_proxy()
        # open the stream before listing, so nothing sealed in between is missed
        self.open_events()
        self.scan_dataset(initial=True)
        self.scan_feedback()
        self.read_mode()
        self.connected = True
        if self.learner is not None and self.learner.fitted and self.learner.knob_aware:
            self.policy_dirty = True
        self.log.info("attached to %s (model %s, knobs %s, mode %s)", self.sub, self.model,
                      " ".join(self.learner.knobs if self.learner else []), self.mode)

    def disconnect(self, why: str) -> None:
        if self.connected:
            self.log.warning("lost %s (%s); retrying every second", self.sub, why)
            self.stats["reconnects"] += 1
        self.connected = False
        self.policy_live = False
        self.start_pending = True
        self.close_events()

    def ensure_proxy(self) -> None:
        """mkdir models/<m> (EEXIST is fine), pick up its knobs, and start it."""
        try:
            os.mkdir(self.mdir)
            self.stats["proxy_created"] += 1
            self.log.info("created model proxy %s", self.mdir)
            fresh = True
        except FileExistsError:
            fresh = False
        try:
            knobs = self.read_attr(self.mdir / "knobs").split()
        except OSError as exc:
            if gone(exc):
                raise
            knobs = []
        knobs = [k for k in knobs if k in self.info.get("knobs", {})] or None
        if self.learner is None or (knobs and knobs != self.learner.knobs):
            self.learner = KnobLearner(self.info, knobs, features=self.features, seed=self.seed,
                                       relative=self.relative)
            self.schedule = TrainerSchedule(self.learner, seed=self.seed,
                                            learning_ttl=self.learning_ttl)
            self.seen = {"dataset": set(), "feedback": set()}
            if self.initial_policy:
                try:
                    self.learner.adopt(self.initial_policy)
                except ValueError as exc:
                    self.log.error("fleet policy not used: %s", exc)
        if fresh:
            # a new proxy (new daemon, or re-created after rmdir) may number its
            # feedback afresh: what is listed now predates our policy
            self.seen["feedback"] = set(self.list_portions(self.mdir / "feedback"))
        self.policy_live = False
        if self.learner.fitted and self.learner.knob_aware:
            self.policy_dirty = True
        self.start_pending = True
        self.try_start()

    def try_start(self) -> None:
        self.t_start_try = time.monotonic()
        try:
            self.state = self.read_attr(self.mdir / "state")
            if self.state in ("started", "running"):
                self.start_pending = False
                return
            self.write_attr(self.mdir / "control", "start\n")
            self.state = self.read_attr(self.mdir / "state")
            self.start_pending = False
            self.log.info("started model proxy %s", self.mdir)
        except OSError as exc:
            if gone(exc):
                raise
            self.warn("start", "cannot start %s: %s (%s)", self.mdir, os.strerror(exc.errno or 0),
                      self.last_error())

    # ---- learning and steering ---------------------------------------------
    def maybe_fit(self, now: float) -> None:
        learner = self.learner
        assert learner is not None
        if not fit_due(learner.rows_since_fit, now - self.t_fit):
            return
        self.t_fit = now
        if learner.adopted:  # a fleet policy: kept, tuned in level or dropped (challenge)
            if not self.stats["policies"]:
                return  # the host starts from the fleet policy: it is uploaded first
            challenge = learner.challenge(
                rolled_out=self.mode in ROLLED_OUT_MODES)
            self.log.debug("fleet policy challenged: %s", challenge)
            if not challenge.get("dropped"):
                if challenge.get("chosen") in ("prior", "tuned"):
                    self.policy_dirty = learner.knob_aware  # the booster was replaced
                return
            stats = challenge["fit"]
        else:
            stats = learner.fit()
        if not stats.get("fitted"):
            return
        self.stats["fits"] += 1
        self.last_fit = stats
        self.log.debug("fit: %s", stats)
        if learner.knob_aware:
            self.policy_dirty = True

    def upload_policy(self, now: float) -> None:
        learner = self.learner
        assert learner is not None
        self.t_policy = now
        text = learner.policy_text()
        try:
            with open(self.mdir / "policy", "w", encoding="ascii") as f:
                f.write(text)
        except OSError as exc:
            self.check_gone(exc)
            if gone(exc):  # the proxy was removed under us and is re-created
                return
            self.stats["policy_rejected"] += 1
            self.warn("policy", "policy of %d bytes refused: %s (%s)", len(text),
                      os.strerror(exc.errno or 0), self.last_error())
            return
        self.policy_dirty = False
        self.policy_live = True
        self.stats["policies"] += 1
        self.log.debug("policy uploaded (%d trees, %d bytes)", learner.booster.num_trees(),
                       len(text))

    def recommend(self, steer: Steer) -> bool:
        line = steer.line()
        try:
            self.write_attr(self.mdir / "recommend", line)
        except OSError as exc:
            self.check_gone(exc)
            if gone(exc):  # the proxy was removed under us and is re-created: not a refusal
                return False
            self.stats["rejected"] += 1
            reason = self.last_error()
            if exc.errno == errno.EINVAL and "not started" in reason:
                self.start_pending = True
            self.warn(f"recommend-{exc.errno}", "recommendation %r refused: %s (%s)",
                      line.strip(), os.strerror(exc.errno or 0), reason)
            return False
        self.stats["recommendations"] += 1
        if steer.exploring:
            self.stats["explorations"] += 1
        return True

    def steer(self, now: float) -> None:
        """Ask the schedule what to send; pace it by the recommendation's ttl."""
        if now < self.t_next_rec or self.start_pending:
            return
        self.read_features()
        decision = self.schedule.decide(self.mode, policy_live=self.policy_live)
        if self.mode == "emergency":
            self.t_next_rec = now + EMERGENCY_RETRY_SECONDS
        else:
            ticks = self.schedule.ticks_to_next_decision(decision)
            self.t_next_rec = now + ticks * self.tick_seconds
        sent = decision is not None and self.recommend(decision)
        # an upload held back while it runs goes first at the next decision
        self.exploring = sent and decision.exploring

    def read_features(self) -> None:
        """Decide on the last tick's features (`features`), the state the proxy is in,
        not on the newest sealed row (`KnobLearner.note_features`)."""
        try:
            text = self.read_attr(self.sub / "features")
        except OSError as exc:
            self.check_gone(exc)
            self.warn("features", "cannot read %s: %s", self.sub / "features",
                      os.strerror(exc.errno or 0))
            return
        try:
            sample = json.loads(text)
            tick, features = sample["tick"], sample["features"]
        except (ValueError, KeyError, TypeError):
            self.warn("features", "unreadable %s: %r", self.sub / "features", text[:80])
            return
        if isinstance(tick, int) and isinstance(features, dict):
            assert self.learner is not None
            self.learner.note_features(tick, features)

    def read_mode(self) -> None:
        try:
            mode = self.read_attr(self.mdir / "mode")
        except OSError as exc:
            self.check_gone(exc)
            return
        if mode and mode != self.mode:
            if self.mode != "unknown":
                self.log.info("mode %s -> %s", self.mode, mode)
            self.mode = mode
        self.t_mode = time.monotonic()

    def progress(self, now: float) -> None:
        self.t_progress = now
        try:
            text = self.read_attr(self.mdir / "efficiency")
            self.efficiency = float(text)
        except OSError as exc:
            self.check_gone(exc)
        except ValueError:
            self.efficiency = math.nan
        learner = self.learner
        assert learner is not None
        fit = self.last_fit
        corr = self.last_correction
        corr_text = ""
        if corr:
            corr_text = (f" |error| {corr.get('recorded_mae', math.nan):.4g}"
                         f" -> {corr.get('mae_after', math.nan):.4g}")
        self.log.info(
            "tick %s rows %d mae %.4g (naive %.4g) efficiency %.3f mode %s%s",
            learner.max_tick if learner.max_tick is not None else "-", learner.rows,
            fit.get("val_mae", math.nan), fit.get("val_mae_naive", math.nan), self.efficiency,
            self.mode, corr_text)

    def housekeeping(self) -> None:
        now = time.monotonic()
        if self.start_pending and now - self.t_start_try >= START_RETRY_SECONDS:
            if not self.mdir.is_dir():
                self.ensure_proxy()
            else:
                self.try_start()
        if now - self.t_mode >= 2.0:
            self.read_mode()
        if now - self.t_rescan >= RESCAN_SECONDS:
            self.t_rescan = now
            if not self.mdir.is_dir():
                self.log.warning("model proxy %s was destroyed; re-creating it", self.mdir)
                self.ensure_proxy()
            self.scan_dataset()
            self.scan_feedback()
        if (self.prepare_seconds > 0 and self.mode == "learning" and not self.start_pending
                and now - self.t_last_portion >= self.prepare_seconds
                and now - self.t_prepare >= self.prepare_seconds):
            # learning needs fresh rows sooner than the store seals them on its own
            self.t_prepare = now
            try:
                self.write_attr(self.mdir / "control", "prepare_dataset\n")
            except OSError as exc:
                self.check_gone(exc)
                self.warn("prepare", "prepare_dataset refused: %s", os.strerror(exc.errno or 0))
        self.maybe_fit(now)
        learner = self.learner
        assert learner is not None
        if learner.fitted and learner.knob_aware:
            due = self.policy_dirty or now - self.t_policy >= POLICY_KEEPALIVE_SECONDS
            wait = EMERGENCY_RETRY_SECONDS if self.mode == "emergency" else POLICY_MIN_SECONDS
            # a newer policy wins over an older recommendation in the proxy: uploaded
            # now, it would end the exploration in flight after the ticks it has run
            # (bench-results/dirty-win-16: 6 of 37 explorations of 10 ticks cut to 1-2)
            exploring = self.exploring and now < self.t_next_rec
            if due and now - self.t_policy >= wait and not exploring:
                self.upload_policy(now)
        self.steer(now)
        if now - self.t_progress >= PROGRESS_SECONDS:
            self.progress(now)

    def next_timeout(self) -> float:
        now = time.monotonic()
        return float(np.clip(self.t_next_rec - now, 0.01, POLL_SECONDS))

    # ---- the loop -----------------------------------------------------------
    def run(self, max_seconds: float | None) -> dict[str, Any]:
        deadline = None if not max_seconds else time.monotonic() + max_seconds
        while not self.stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            if not self.connected:
                if not self.try_connect():
                    self.stop.wait(1.0)
                continue
            try:
                self.handle(self.wait_events(self.next_timeout()))
                self.housekeeping()
            except MountGone as exc:
                self.disconnect(str(exc))
            except OSError as exc:
                try:
                    self.check_gone(exc)
                    self.warn(f"os-{exc.errno}", "%s (continuing)", exc)
                except MountGone as gone:
                    self.disconnect(str(gone))
                except OSError as again:
                    self.disconnect(str(again))
            except Exception:  # a bug or odd data must not end a long-running trainer
                self.log.exception("unexpected error in the trainer loop; continuing")
                self.stop.wait(1.0)
        self.close_events()
        return self.summary()

    def try_connect(self) -> bool:
        try:
            self.connect()
            return True
        except MountGone as exc:
            self.warn("connect", "waiting for %s: %s", self.sub, exc)
        except OSError as exc:
            self.warn("connect", "waiting for %s: %s", self.sub, exc)
        except ValueError as exc:
            self.warn("connect", "cannot use %s/info: %s", self.sub, exc)
        self.close_events()
        return False

    def summary(self) -> dict[str, Any]:
        learner = self.learner
        out = dict(self.stats)
        out.update(
            mode=self.mode, state=self.state, efficiency=self.efficiency,
            rows=learner.rows if learner else 0,
            ticks=learner.max_tick if learner else None,
            val_mae=self.last_fit.get("val_mae", math.nan),
            val_mae_naive=self.last_fit.get("val_mae_naive", math.nan),
            last_correction=dict(self.last_correction),
        )
        return out


def run_worker(
    mountpoint: str,
    subsystem: str,
    model: str = "lgbm",
    *,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    log: logging.Logger = logging.getLogger("mlfs.train"),  # noqa: B008
    prepare_seconds: float = 3.0,
    seed: int = 0,
    learning_ttl: int = LEARNING_TTL,
    relative: bool = False,
    initial_policy: str | None = None,
    features: list[str] | None = None,
) -> dict[str, Any]:
    """Train `model` on MOUNTPOINT/SUBSYSTEM until `stop` is set or `max_seconds` pass.

    Returns the final statistics (fits, corrections, uploads, recommendations,
    the last validation MAE, efficiency and mode).  `prepare_seconds`: in
    learning mode, ask the proxy to seal the dataset when no portion arrived
    for that long (0: never), so the first models need not wait for the
    store's own sealing interval.  `learning_ttl`: ticks each exploration
    lasts; `relative`: fit relative error (`KnobLearner`), for objectives
    spanning orders of magnitude; `features`: the subsystem features the
    model may use (default all; `KnobLearner` says which to leave out).
    Never raises on OSError from the mount; raises BadOptions when
    `features` names one the subsystem does not have.
    """
    if not NAME.fullmatch(model):
        raise ValueError(f"model name {model!r} is not [a-z0-9][a-z0-9._-]{{0,63}}")
    worker = _Worker(mountpoint, subsystem, model, stop or threading.Event(), log,
                     prepare_seconds, seed, learning_ttl, relative, initial_policy, features)
    stats = worker.run(max_seconds)
    log.info("trainer done: %d fits, %d corrections, %d policies, %d recommendations, "
             "efficiency %.3f, mode %s", stats["fits"], stats["corrections"],
             stats["policies"], stats["recommendations"], stats["efficiency"], stats["mode"])
    return stats
