"""The model proxy every kind of model shares: the kernel-side representative of one
user-space model.

It owns what does not depend on what the model does: the lifecycle
(initialized -> started -> running -> stopped), the mode (emergency, learning,
collaboration, recommendation; automatic or pinned) and its machine, the journal of
every input written into `recommend`, the `errors` of refused inputs, the policy it
runs (verified and checked out of process: `InstalledPolicy`), the feedback store
and the trainer-silence timer.  What an input means, how a policy is built, what
the model does on a tick and how it is measured belong to its kind
(`mlfs.core.models.kinds`: one entry and one folder per kind, e.g.
`knob/proxy.py`, `predictor/proxy.py`).  A kind subclasses `ModelProxy` and fills
in the hooks marked below; it never waits for a trainer.
"""

from __future__ import annotations

import collections
import errno
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pyarrow as pa

from mlfs.abi import KnobValue, Subsystem
from mlfs.base.clock import rfc3339
from mlfs.base.durable import set_aside
from mlfs.base.errors import Refused, busy, error_line, invalid
from mlfs.base.portion import Portion, StoreError, StoreOwner, errno_name
from mlfs.base.text import escape_input, one_word
from mlfs.core.mount.context import ModelOwner
from mlfs.core.storage.store import PortionStore

from .decision import Decision
from .efficiency import EfficiencyStats
from .installed_policy import InstalledPolicy
from .journal import Journal
from .model_files import MODES, POLICY_FILE, read_back_settings, save_settings
from .modes import ModeMachine

log = logging.getLogger("mlfs.proxy")

ERRORS_KEPT = 100
#: modes only root may pin a model to (they skip the proxy's efficiency gate)
ROOT_ONLY_PINS = frozenset({"recommendation"})


class ModelProxy:
    """What every kind of model shares; a kind subclasses it (`kinds.ModelKind.proxy`)."""

    #: the kind's name, its key in `mlfs.core.models.kinds.KINDS` (set by each kind)
    kind = ""

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
        #: the knobs this model controls (a kind that sets none keeps it empty)
        self.controlled: list[str] = self.default_controlled(runtime.subsystem)
        self.errors: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        #: the efficiency window the mode machine decides on (the kind's own measure)
        self.window = self._new_window()
        self.modes.on_switch = self.window.restart
        #: the policy it runs (`policy`), kept in policy.txt
        self.installed = InstalledPolicy(
            directory / POLICY_FILE, self._build_policy, self.errors, f"{runtime.name}/{name}",
            lambda **kw: self.bus.publish(runtime.name, "policy", model=name, **kw))
        #: seconds for trainer silence (the only wall-time rule of the modes: ModeConfig);
        #: the mount's, time.monotonic unless a test drives it in virtual time
        self.clock = runtime.mount.clock
        self.last_trainer_input = self.clock()
        self.ml_ticks = 0
        self.default_ticks = 0
        self.errors_abs_sum = 0.0  # feedback |observed - expected|, for metrics
        self.errors_count = 0
        self.incumbent = None
        self._setup()
        if self.incumbent is None:  # a kind's programming error, caught at its first mkdir
            raise TypeError(f"kind {self.kind}: _setup() must set self.incumbent")
        self._load()
        if runtime.mount.emergency_pinned:  # created (or reloaded) under the pin
            self.modes.operator_pin(quietly=True)

    # ---- what a kind fills in ----------------------------------------------------
    def _setup(self) -> None:
        """The kind's own attributes, made before the saved state is read back.

        A kind sets `self.incumbent` here: what recommendation must beat besides the
        default (docs/ABI.md "The incumbent"; `standing`, `versus`, `versus_text`,
        `file_text`, `decide`, `ran`, `measured`).  Every kind has one: a model is judged
        against the simplest thing that works, not only against the kernel's default.
        """

    @classmethod
    def default_controlled(cls, subsystem: Subsystem) -> list[str]:
        """The knobs a new model of this kind controls (none unless it sets knobs)."""
        return []

    def _feedback_schema(self, runtime: ModelOwner) -> pa.Schema:
        raise NotImplementedError

    def _new_window(self):
        """The efficiency window: `stats(since)`, `restart(tick)`, `flush()`, `max_span`."""
        raise NotImplementedError

    def _build_policy(self, text: bytes):
        """Verify and load an uploaded policy (Refused when it does not fit the kind)."""
        raise NotImplementedError

    def _parse_recommend(self, data: bytes) -> list:
        """A whole write to `recommend`, checked (Refused on the first bad line); each
        item has `line`, `expect` and `ttl`."""
        raise NotImplementedError

    def _accept(self, parsed, rec_id: int) -> None:
        """A journaled input takes effect."""
        raise NotImplementedError

    def _on_stop(self) -> None:
        """The model stops: let go of what it holds (its feedback window is flushed)."""

    def closing(self) -> None:
        """The mount closes: keep what the kind holds in memory (a knob model's pairs)."""

    # the tick, for a kind whose models set knobs (`ModelKind.sets_knobs`)
    def expire(self, tick: int) -> None:
        """Inputs whose ttl ran out end before the tick is planned."""

    def wants_ml(self) -> bool:
        return False

    def decide(self, tick: int, features: dict | None, current: dict[str, KnobValue]
               ) -> Decision | None:
        return None

    def record(self, tick: int, ts: int, decision: Decision | None, objective: float,
               knobs: dict[str, KnobValue], features: dict | None) -> None:
        """The tick's dataset row (a kind that sets knobs learns from it)."""

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
    def policy(self):
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
        self._on_stop()
        self._write_feedback(self.window.flush())
        self._set_state("stopped")
        self.runtime.subsystem.release(list(self.controlled))

    def _write_feedback(self, pairs: list) -> None:
        """Feedback the window completed (a kind whose window completes rows)."""

    def _set_state(self, new: str) -> None:
        old, self.state = self.state, new
        self._save()
        self.bus.publish(self.runtime.name, "state", model=self.name, **{"from": old, "to": new})

    def destroy(self) -> None:
        self.destroyed = True
        self.stop()
        self.journal.close()
        self.feedback.close()

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

    @property
    def journal_wal(self):
        """The write-ahead file holding the last accepted input (`sync_journal`)."""
        return self.journal.strict_path

    def sync_journal(self, wal) -> None:
        """fdatasync the journal's write-ahead file `wal` (a worker thread; OSError)."""
        self.journal.sync(wal)

    def withdraw(self, ids: list[int], reason: str) -> None:
        """Accepted rows whose write failed after all: no longer in effect."""

    def _heard_from_trainer(self, what: str) -> None:
        self.last_trainer_input = self.clock()
        self.modes.trainer_back(what)

    def check_policy(self, text: bytes):
        """Verify and check `text` out of process (any thread); changes nothing."""
        return self.installed.check(text)

    def set_policy(self, text: bytes, policy=None) -> None:
        """Install a policy from `check_policy` (trio thread); empty text removes it."""
        if self.destroyed:  # removed while its upload was being checked
            raise Refused(errno.ENODEV, "the model was removed while its policy was checked")
        self.installed.install(text, policy)
        if text:
            self._heard_from_trainer("policy")

    def _remove_policy(self, reason: str) -> None:
        self.installed.drop(reason)

    def update_mode(self, critical: str | None) -> None:
        self.modes.update(critical, self.clock() - self.last_trainer_input, self.evidence,
                          self.incumbent.standing)
