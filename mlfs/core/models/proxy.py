"""The ML model proxy: the kernel-side representative of one user-space model.

It owns the model's lifecycle (initialized -> started -> running -> stopped),
its mode (emergency, learning, collaboration, recommendation; automatic or
pinned), the recommendations it accepted, the policy it runs, the efficiency
window, the feedback it writes back and the journal of every input.  It never
waits for a trainer: a tick with nothing valid to apply runs the default.
"""

from __future__ import annotations

import collections
import errno
import logging
import math
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pyarrow as pa

from mlfs.abi import KnobValue, Settling, knob_column
from mlfs.base.clock import rfc3339
from mlfs.base.durable import set_aside
from mlfs.base.errors import Refused, busy, error_line, invalid
from mlfs.base.portion import Portion, StoreError, StoreOwner, errno_name
from mlfs.base.text import decode_text, escape_input, one_word, parse_recommendations
from mlfs.core.mount.context import ModelOwner
from mlfs.core.storage.store import PortionStore

from .decision import Decision, Recommendation
from .efficiency import EfficiencyStats, EfficiencyWindow
from .episodes import Hold, Interleaving, episode_ticks, pair_span
from .incumbent import Incumbent
from .installed_policy import InstalledPolicy
from .journal import Journal
from .model_files import (
    MODES,
    POLICY_FILE,
    feedback_schema,
    read_back_settings,
    save_settings,
)
from .modes import ModeMachine
from .policy import Policy, PolicyRemoved
from .safe_set import RESTRICTED_MODES, SafeSet

log = logging.getLogger("mlfs.proxy")

ERRORS_KEPT = 100
#: modes only root may pin a model to (they skip the proxy's efficiency gate)
ROOT_ONLY_PINS = frozenset({"recommendation"})


class ModelProxy:
    def __init__(self, runtime: ModelOwner, name: str, directory: Path,
                 generation: int) -> None:
        self.runtime = runtime
        self.name = name
        self.directory = directory
        self.generation = generation  # never reused: a re-created model is a new object
        self.config = runtime.mount.config.modes
        self.bus = runtime.mount.bus
        directory.mkdir(parents=True, exist_ok=True)
        store_config = runtime.mount.config.store
        self.journal = Journal(directory / "recommendations", store_config.journal(),
                               runtime.watch, name, runtime.mount.count_recommendation)
        self.feedback = PortionStore(directory / "feedback", self._feedback_schema(runtime),
                                     "tick", store_config.feedback(), runtime.watch, "feedback")
        self.feedback.owner = StoreOwner(runtime.name, "feedback", f"{self.path}/feedback", name)
        self.state = "initialized"
        self.destroyed = False  # rmdir'd: a late write must not land in a successor's files
        #: the mode, its pin and why it is in emergency (`mode`, `pinned`, `emergency_cause`)
        self.modes = ModeMachine(self.config, self.bus, runtime.name, name,
                                 lambda: runtime.next_tick)
        self.controlled: list[str] = list(runtime.subsystem.knobs)
        self.errors: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        self.window = EfficiencyWindow(max(self.config.window_ticks, self.config.evidence_ticks),
                                      runtime.subsystem.objective.goal,
                                      self.config.unstable_baseline_ratio)
        self.modes.on_switch = self.window.restart
        #: what the policy may choose in collaboration and recommendation
        self.safe = SafeSet()
        self._knob_columns = [knob_column(name) for name in runtime.subsystem.knobs]
        #: the best fixed setting measured at the current level (incumbent.py)
        self.incumbent = Incumbent(self.safe, dict(zip(self._knob_columns,
                                                       runtime.subsystem.knobs, strict=True)))
        self.current: Recommendation | None = None
        #: the policy it runs (`policy`), kept in policy.txt
        self.installed = InstalledPolicy(
            directory / POLICY_FILE, self._build_policy, self.errors, f"{runtime.name}/{name}",
            lambda **kw: self.bus.publish(runtime.name, "policy", model=name, **kw))
        #: seconds for trainer silence (the only wall-time rule of the modes: ModeConfig);
        #: the mount's, time.monotonic unless a test drives it in virtual time
        self.clock = runtime.mount.clock
        self.last_trainer_input = self.clock()
        # knobs with carry-over (Knob.settle_ticks): episodes and settling ticks
        self._settle = {name: knob.settle_ticks for name, knob in runtime.subsystem.knobs.items()}
        self.settling = Settling(self._settle)
        self.interleaving = Interleaving(zlib.crc32(name.encode()))
        self.policy_hold = Hold()
        self.window.max_span = pair_span(self.carry_over())
        self.ml_ticks = 0
        self.default_ticks = 0
        self.errors_abs_sum = 0.0  # feedback |observed - expected|, for metrics
        self.errors_count = 0
        self._load()
        if runtime.mount.emergency_pinned:  # created (or reloaded) under the pin
            self.modes.operator_pin(quietly=True)

    #: what the model's recommendations are: knob settings (a predictor: predictions)
    kind = "knobs"

    def _feedback_schema(self, runtime: ModelOwner) -> pa.Schema:
        return feedback_schema(runtime)

    # ---- persistence ------------------------------------------------------
    def _load(self) -> None:
        """Read back model.json and policy.txt; what fails validation is set aside.

        Damaged state never stops a mount: a model.json that does not parse
        or has a wrong field is renamed `.damaged` and the model starts with
        its defaults; a saved policy is verified again (as on upload) and one
        that fails is renamed `.damaged`, the model starts without a policy.
        Either way a log line and an `errors` line say why.
        """
        saved, damaged = read_back_settings(self.directory, self.runtime.subsystem.knobs,
                                            self.runtime.name)
        for path, reason in damaged:
            self._state_damaged(path, reason)
        if saved is None:
            try:
                self._save()
            except OSError as exc:  # e.g. a full disk: run on the defaults, save later
                log.error("%s/%s: model.json not written: %s", self.runtime.name, self.name, exc)
        else:
            self.controlled = saved["knobs"] or self.controlled
            if saved["pinned"] is not None:
                self.modes.pinned = self.modes.mode = saved["pinned"]
            if saved["state"] in ("started", "running"):
                self.state = "started"
            elif saved["state"] == "stopped":
                self.state = "stopped"
        for path, reason in self.installed.restore():
            self._state_damaged(path, reason)

    def _state_damaged(self, path: Path, reason: str) -> None:
        """A state file failed validation: set it aside, say so in errors (and the log)."""
        moved = set_aside(path, f"{self.runtime.name}/{self.name}: {reason}")
        where = f"set aside as {moved.name}" if moved else "could not be set aside"
        self.errors.append(f"{rfc3339()} {path.name} {reason} ({where})")

    def _save(self) -> None:
        save_settings(self.directory, self.controlled, self.pinned, self.state)

    # ---- shown attributes -------------------------------------------------
    @property
    def path(self) -> str:
        return f"{self.runtime.name}/models/{self.name}"

    @property
    def mode(self) -> str:
        return self.modes.mode

    @property
    def pinned(self) -> str | None:
        return self.modes.pinned

    @property
    def emergency_cause(self) -> str | None:
        return self.modes.cause

    @property
    def mode_history(self) -> collections.deque[tuple[str, str, str]]:
        return self.modes.history

    @property
    def mode_switching(self) -> str:
        return self.modes.switching

    @property
    def active(self) -> bool:
        return self._state in ("started", "running")

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, new: str) -> None:
        # the tick loop keeps a list of active models; idle ones then cost
        # nothing per tick (2,000 `active` checks were ~1 % CPU at 50 ticks/s)
        self._state = new
        self.runtime.models_changed()

    def portion_views(self) -> dict[str, Mapping[int, Portion]]:
        """recommendations/ and feedback/: sealed portions, live and read-only."""
        return {"recommendations": MappingProxyType(self.journal.portions),
                "feedback": MappingProxyType(self.feedback.portions)}

    def evidence(self) -> EfficiencyStats:
        """The efficiency the mode machine decides on, and that `efficiency`, `status`
        and the metrics show: over `ModeMachine.evidence_since`."""
        return self.window.stats(since=self.modes.evidence_since())

    def efficiency_text(self) -> str:
        value = self.evidence().efficiency
        return "nan\n" if math.isnan(value) else f"{value:.3f}\n"

    def errors_text(self) -> str:
        return "".join(line + "\n" for line in self.errors)

    def policy_text(self) -> bytes:
        return self.installed.text()

    @property
    def policy(self) -> Policy | None:
        return self.installed.policy

    # ---- refusals ---------------------------------------------------------
    def refuse(self, file: str, data: bytes, exc: Refused) -> Refused:
        """Record a refused input everywhere it must show, and return it to raise."""
        shown = escape_input(data)
        self.errors.append(error_line(file, exc.reason, shown))
        self.runtime.mount.count_error(self.runtime.name, file)
        log.warning("%s/%s: %s refused (%s): %s", self.runtime.name, self.name, file,
                    exc.reason, shown)
        if file == "recommend":
            seq = self._journal("rejected", None, shown, exc.reason)
            self.bus.publish(self.runtime.name, "recommendation", model=self.name, id=seq,
                             status="rejected", reason=exc.reason)
        return exc

    # ---- lifecycle --------------------------------------------------------
    def start(self) -> None:
        if self.active:
            return
        owner = self.runtime.owner_conflict(self, self.controlled)
        if owner:
            raise busy(f"knob {owner[0]!r} is controlled by started model {owner[1]!r}")
        self._set_state("started")
        self.last_trainer_input = self.clock()
        self.modes.last_transition_tick = self.runtime.next_tick

    def stop(self) -> None:
        if not self.active:
            return
        if self.current is not None:
            self._finish(self.current, "ignored", "model stopped")
            self.current = None
        self._write_feedback(self.window.flush())
        self._set_state("stopped")
        self.runtime.subsystem.release(list(self.controlled))

    def _set_state(self, new: str) -> None:
        old, self.state = self.state, new
        self._save()
        self.bus.publish(self.runtime.name, "state", model=self.name, **{"from": old, "to": new})

    def destroy(self) -> None:
        self.destroyed = True
        self.stop()
        self.journal.close()
        self.feedback.close()

    # ---- knobs and mode attributes ----------------------------------------
    def set_knobs(self, data: bytes) -> None:
        try:
            names = decode_text(data).split()
            if not names:
                raise invalid("knobs takes one or more knob names")
            for name in names:
                if name not in self.runtime.subsystem.knobs:
                    raise invalid(f"unknown knob {name!r}")
            if len(set(names)) != len(names):
                raise invalid("a knob is named twice")
            if self.active:
                owner = self.runtime.owner_conflict(self, names)
                if owner:
                    raise busy(f"knob {owner[0]!r} is controlled by started model {owner[1]!r}")
        except Refused as exc:
            raise self.refuse("knobs", data, exc) from None
        self.controlled = [k for k in self.runtime.subsystem.knobs if k in names]
        if self.current is not None and set(self.current.knobs) - set(self.controlled):
            self._finish(self.current, "ignored", "knobs changed")
            self.current = None
        self._save()

    def set_mode(self, data: bytes, uid: int = 0) -> None:
        """A write to `mode`: pin one, or `auto`.  Pinning `recommendation` (past the
        efficiency gate) is root's; the mount's group pins up to `collaboration`."""
        try:
            word = one_word(data, "mode")
            if word != "auto" and word not in MODES:
                raise invalid(f"unknown mode {word!r} (one of auto {' '.join(MODES)})")
            if word in ROOT_ONLY_PINS and uid != 0:
                raise Refused(errno.EPERM, f"pinning {word} (past the efficiency gate) is "
                              "root's; the group pins up to collaboration")
        except Refused as exc:
            raise self.refuse("mode", data, exc) from None
        self.modes.pin(word)
        self._save()

    # ---- trainer inputs ---------------------------------------------------
    def _journal(self, status: str, rec_id: int | None, line: str, reason: str,
                 expect: float | None = None, ttl: int | None = None,
                 strict: bool = False) -> int:
        return self.journal.write(status, rec_id, line, reason, self.runtime.next_tick,
                                  expect, ttl, strict)

    def _finish(self, rec: Recommendation, status: str, reason: str) -> None:
        self._journal(status, rec.id, rec.line, reason, rec.expect, rec.ttl)
        self.bus.publish(self.runtime.name, "recommendation", model=self.name, id=rec.id,
                         status=status, reason=reason)

    def recommend(self, data: bytes) -> list[int]:
        """Check a whole write; journal and publish; return accepted ids.

        Each accepted row is written to the journal's WAL before anything
        changes; when that fails (ENOSPC, EIO, EMFILE, the store is full) the
        rows already written are withdrawn and the writer gets the errno.
        The caller then fdatasyncs the WAL (`journal.sync`) before success.
        """
        try:
            lines = self._parse_recommend(data)
            if not self.active:
                raise invalid(f"model is {self.state}, not started")
            failing = self.runtime.watch.error()
            if failing is not None:  # nothing could be recorded: say why, not just EBUSY
                raise Refused(failing[0], f"state directory: {failing[1]}")
            if self.mode == "emergency" and (self.emergency_cause in ("critical", "operator")
                                             or self.pinned == "emergency"):
                raise busy("model is in emergency" + {
                    "critical": " (critical state)",
                    "operator": " (pinned by the operator via MOUNT/control)",
                }.get(self.emergency_cause, " (pinned)"))
        except Refused as exc:
            raise self.refuse("recommend", data, exc) from None
        ids: list[int] = []
        for parsed in lines:
            try:
                rec_id = self._journal("accepted", None, parsed.line, "", parsed.expect,
                                       parsed.ttl, strict=True)
            except StoreError as exc:
                reason = f"journal not writable: {errno_name(exc)}"
                self.withdraw(ids, reason)
                self.errors.append(f"{rfc3339()} recommend {reason}: {escape_input(data)}")
                self.runtime.mount.count_error(self.runtime.name, "recommend")
                log.error("%s/%s: recommend failed (%s): %s", self.runtime.name, self.name,
                          reason, escape_input(data))
                raise Refused(exc.errno, reason) from None
            self.bus.publish(self.runtime.name, "recommendation", model=self.name, id=rec_id,
                             status="accepted", reason="")
            self._accept(parsed, rec_id)
            ids.append(rec_id)
        self._heard_from_trainer("recommendation")
        return ids

    def _parse_recommend(self, data: bytes) -> list:
        """A whole write to `recommend`, checked (Refused on the first bad line)."""
        return parse_recommendations(data, self.runtime.subsystem.knobs, set(self.controlled))

    def _accept(self, parsed, rec_id: int) -> None:
        """A journaled recommendation takes effect: it is the one in force from now on."""
        rec = Recommendation(rec_id, parsed.line, parsed.knobs, parsed.expect, parsed.ttl,
                             self.runtime.next_tick, time.monotonic_ns())
        if self.current is not None and self.current.valid_at(self.runtime.next_tick):
            self._finish(self.current, "superseded", f"superseded by {rec_id}")
        self.current = rec

    @property
    def journal_wal(self):
        """The write-ahead file holding the last accepted recommendation (`sync_journal`)."""
        return self.journal.strict_path

    def sync_journal(self, wal) -> None:
        """fdatasync the journal's write-ahead file `wal` (a worker thread; OSError)."""
        self.journal.sync(wal)

    def withdraw(self, ids: list[int], reason: str) -> None:
        """Accepted rows whose write failed after all: no longer in effect."""
        if self.current is not None and self.current.id in ids:
            self._finish(self.current, "ignored", reason)
            self.current = None

    def _heard_from_trainer(self, what: str) -> None:
        self.last_trainer_input = self.clock()
        self.modes.trainer_back(what)

    def check_policy(self, text: bytes) -> Policy:
        """Verify and check `text` out of process (any thread); changes nothing."""
        return self.installed.check(text)

    def _build_policy(self, text: bytes) -> Policy:
        subsystem = self.runtime.subsystem
        return Policy(text, subsystem.knobs, list(self.controlled),
                      list(self.runtime.feature_columns), subsystem.objective.goal)

    def set_policy(self, text: bytes, policy: Policy | None = None) -> None:
        """Install a policy from `check_policy` (trio thread); empty text removes it."""
        if self.destroyed:  # removed while its upload was being checked
            raise Refused(errno.ENODEV, "the model was removed while its policy was checked")
        self.installed.install(text, policy)
        if text:
            self._heard_from_trainer("policy")

    def _remove_policy(self, reason: str) -> None:
        self.installed.drop(reason)

    # ---- the tick ---------------------------------------------------------
    def share(self) -> float:
        config = self.config
        return {
            "emergency": 0.0,
            "learning": config.learning_share,
            "collaboration": config.collaboration_share,
            "recommendation": 1.0 - config.recommendation_probe,
        }[self.mode]

    def carry_over(self) -> int:
        """The longest carry-over (settle_ticks) of the knobs this model controls."""
        return max((self._settle[k] for k in self.controlled), default=0)

    def episode_ticks(self) -> int:
        """Ticks per episode: 1, or 2k when a controlled knob carries over k ticks."""
        return episode_ticks(self.carry_over())

    def wants_ml(self) -> bool:
        """Deterministic interleaving at the mode's share (`Interleaving`).

        It decides per episode (`episode_ticks`, one tick unless a controlled
        knob carries over: efficiency.py says why).
        """
        settle = self.carry_over()
        self.window.max_span = pair_span(settle)
        return self.interleaving(self.share(), settle)

    def expire(self, tick: int) -> None:
        rec = self.current
        if rec is not None and not rec.valid_at(tick):
            self._finish(rec, "expired", f"ttl {rec.ttl} ticks ran out")
            self.current = None

    def decide(self, tick: int, features: dict | None, current: dict[str, KnobValue]
               ) -> Decision | None:
        """What ML wants on this tick, or None (then the default runs)."""
        rec = self.current
        use_rec = rec is not None and (self.policy is None
                                       or rec.accepted_ns >= self.installed.loaded_ns)
        if use_rec:
            if not rec.applied:
                rec.applied = True
                self._finish(rec, "applied", f"tick {tick}")
            return Decision(dict(rec.knobs), rec.expect, "recommendation", rec.id)
        fixed = self.incumbent.decide(tick, self.mode, self.controlled, self.policy is not None)
        if fixed is not None:  # recommendation's unproven policy, or the bandit's probe
            return Decision(fixed, None, "incumbent", None)
        if self.policy is not None and features is not None:
            allowed = None
            if self.mode in RESTRICTED_MODES and self.modes.switching == "auto":
                allowed = self.safe.allowed(self.policy.candidates, self.policy.grid_shape,
                                            self.policy.is_default)
            try:
                # collaboration's pairs resolve within a tick or two: there a tie steps
                # toward what the policy wants (recommendation's runs of ML ticks would
                # try each step for a whole run)
                knobs, expected = self.policy.decide(features, current, allowed,
                                                     toward_wanted=self.mode == "collaboration")
            except PolicyRemoved as exc:
                self._remove_policy(exc.reason)
                return None
            except Exception as exc:  # a policy must never stop the tick loop
                self._remove_policy(f"failed: {type(exc).__name__}: {str(exc)[:200]}")
                return None
            if self.carry_over():
                knobs, expected = self.policy_hold(tick, knobs, expected, self.episode_ticks(),
                                            current)
            return Decision(dict(knobs), expected, "policy", None)
        return None

    def record(self, tick: int, ts: int, decision: Decision | None, objective: float,
               knobs: dict[str, KnobValue], features: dict | None) -> None:
        """After the tick ran: update the window, write feedback, maybe switch mode.

        An ML tick's feedback row waits for the next default tick, which
        completes its baseline (see efficiency.py); then it is written.
        Ticks a carry-over knob's change still settles are written but not
        counted in the efficiency.
        """
        settling = self.settling(knobs)
        if decision is None:
            self.default_ticks += 1
            if not settling:
                self.safe.default_tick(objective)
            self._write_feedback(self.window.add_default(tick, objective, settling))
            return
        self.ml_ticks += 1
        self.incumbent.ran(decision.source, objective)
        self.modes.ml_since_transition += 1
        if self.state == "started":
            self._set_state("running")
        expected = decision.expected
        row = {
            "tick": tick, "ts": ts, "model": self.name, "source": decision.source,
            "recommendation_id": decision.recommendation_id,
            "expected": expected, "observed": objective,
            "error": None if expected is None else objective - expected,
        }
        for name, value in knobs.items():
            row[knob_column(name)] = value
        if features:
            row.update(features)
        self.window.add_ml(tick, objective, row, settling)

    def _write_feedback(self, pairs: list) -> None:
        for pair in pairs:
            row = pair.payload
            if row["error"] is not None:
                self.errors_abs_sum += abs(row["error"])
                self.errors_count += 1
            row["baseline"] = pair.baseline if math.isfinite(pair.baseline) else None
            row["efficiency"] = pair.ratio if math.isfinite(pair.ratio) else None
            row["efficiency_vs_incumbent"] = self.incumbent.versus(pair.ratio)
            if pair.stable:
                self.incumbent.measured({c: row.get(c) for c in self._knob_columns},
                                        pair.baseline, pair.ratio, pair.tick, row["source"],
                                        self.mode)
            self.feedback.append(row)

    def update_mode(self, critical: str | None) -> None:
        self.modes.update(critical, self.clock() - self.last_trainer_input, self.evidence,
                          self.incumbent.standing)
