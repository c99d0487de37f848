"""The KnobController: applies knob values under the safety rules, restores them.

Promises 2-5 of `mlfs.backends.linux`, for one subsystem's knobs:
record durably before the first write, restore on release/close, leave a
value someone else set alone, report a refusal once and do not hammer.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from mlfs.abi import EXTRA_FOREIGN, EXTRA_REFUSED, Knob, KnobValue

from . import files as kernel
from .files import UnavailableError, boot_id, process_start, read_text
from .knobs import KnobSpec, Rule
from .ledger import LIVE, Ledger, recover, restore_entry

log = logging.getLogger("mlfs.backends.linux")

#: seconds before a value the kernel refused is tried again (silently)
RETRY_SECONDS = 60.0


class KnobController:
    """Applies knob values to kernel files under the safety rules above.

    Thread-safe: `apply` runs in the proxy's worker thread, `release` in the
    trio thread, `close` after both have stopped.
    """

    def __init__(self, subsystem: str, specs: Mapping[str, KnobSpec],
                 rules: Mapping[str, Rule], state_dir: str | Path | None) -> None:
        self.subsystem = subsystem
        self.order = list(specs)  # the subsystem's knob order (dataset columns)
        #: in restore/apply order: lower priority first (the scheduler before nr_requests)
        self.specs = dict(sorted(specs.items(), key=lambda item: item[1].priority))
        self.rules = dict(rules)
        self.instance = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._closed = False
        self._start = process_start(os.getpid())
        self._boot = boot_id()
        if self.rules and state_dir is None:
            raise ValueError(f"{subsystem}: applying knobs needs a state directory "
                             "(the ledger of original values)")
        self.ledger = Ledger(state_dir) if state_dir is not None else None
        #: foreign reports waiting for the next sample
        self._pending_foreign: dict[str, str] = {}
        if self.ledger is not None:
            by_path = {str(s.path): n for n, s in self.specs.items()}
            for path, outcome in recover(self.ledger).items():
                if outcome.startswith("foreign") and path in by_path:
                    # someone set it while mlfs was down: theirs for this mount too
                    self._pending_foreign[by_path[path]] = "after a crash: " + outcome
        self.foreign: set[str] = set(self._pending_foreign)
        #: last value read from each knob's file
        self.current: dict[str, str] = {}
        for name, spec in self.specs.items():
            try:
                self.current[name] = spec.read()
            except OSError as exc:
                raise UnavailableError(f"{subsystem}: cannot read {spec.path}: {exc}") from None
        #: knob -> its ledger entry, for knobs mlfs has changed (directly or coupled)
        self.entries: dict[str, dict] = {}
        #: knob -> the value the file should hold given mlfs's last write
        self.expected: dict[str, str] = {}
        self._reported: dict[str, set[str]] = {n: set() for n in self.specs}
        self._refused_at: dict[str, dict[str, float]] = {n: {} for n in self.specs}
        self._unreadable: set[str] = set()
        LIVE[self.instance] = self

    # ---- what the proxy sees ----------------------------------------------------
    def allowed(self, name: str) -> bool:
        """May ticks write `name`?  Listed in `apply` and not taken over by someone."""
        return name in self.rules and name not in self.foreign

    def default_text(self, name: str) -> str:
        """The default algorithm's value: the recorded original where mlfs may
        write it back, otherwise whatever is in effect (mlfs follows, never fights)."""
        entry = self.entries.get(name)
        if entry is not None and self.allowed(name):
            return entry["original"]
        return self.current[name]

    def default_values(self) -> dict[str, KnobValue]:
        with self._lock:
            return {n: self._typed(n, self.default_text(n)) for n in self.order}

    def knob(self, name: str, choices: Iterable[str] = ()) -> Knob:
        """The Knob as `info` shows it: its range is exactly what may be written."""
        spec = self.specs[name]
        with self._lock:
            default = self._typed(name, self.default_text(name))
            rule = self.rules.get(name) if self.allowed(name) else None
        if spec.type == "choice":
            if isinstance(rule, frozenset):
                shown = tuple(c for c in choices if c in rule) or tuple(sorted(rule))
            else:
                shown = (str(default),)
            return Knob(name, "choice", default=default, choices=shown, unit=spec.unit,
                        settle_ticks=spec.settle_ticks)
        if isinstance(rule, tuple):
            return Knob(name, "int", default=default, min=rule[0], max=rule[1], unit=spec.unit,
                        settle_ticks=spec.settle_ticks)
        fixed = default if isinstance(default, int) else None
        return Knob(name, "int", default=default, min=fixed, max=fixed, unit=spec.unit,
                    settle_ticks=spec.settle_ticks)

    def _typed(self, name: str, text: str) -> KnobValue:
        if self.specs[name].type == "choice":
            return text
        try:
            return int(text)
        except ValueError:
            return text

    # ---- applying ---------------------------------------------------------------
    def apply(self, requested: Mapping[str, KnobValue]) -> dict:
        """Bring the knobs to `requested` where allowed; returns Sample.extra items."""
        refused: dict[str, str] = {}
        foreign: dict[str, str] = {}
        with self._lock:
            foreign.update(self._pending_foreign)
            self._pending_foreign.clear()
            for name, spec in self.specs.items():
                shown = self.default_text(name)  # what the proxy was offered as default
                try:
                    current = spec.read()
                except OSError as exc:
                    if name not in self._unreadable:
                        self._unreadable.add(name)
                        log.warning("%s: cannot read %s: %s", self.subsystem, spec.path, exc)
                    continue
                self._unreadable.discard(name)
                self.current[name] = current
                if name in self.entries and current != self.expected[name]:
                    foreign[name] = self._go_foreign(name, current)
                    continue
                if self._closed or name in self.foreign or name not in requested:
                    continue
                want = str(requested[name])
                if want == current:
                    continue
                if not self.allowed(name) or name not in self.entries:
                    if want == shown:
                        # The default went stale (someone else changed the value, or a
                        # coupled write did): mlfs follows, it does not fight back.
                        continue
                if not self.allowed(name):
                    self._refuse(refused, name, want, "observe-only: the configuration "
                                 f"does not allow writing {name}")
                    continue
                if not self._within(name, want):
                    self._refuse(refused, name, want,
                                 f"{want} is outside the configured {name} bounds")
                    continue
                at = self._refused_at[name].get(want)
                if at is not None and time.monotonic() - at < RETRY_SECONDS:
                    continue  # refused recently: no tight retry loop, no repeated report
                reason = self._write(name, spec, current, want)
                if reason is not None:
                    self._refuse(refused, name, want, reason)
        extra: dict = {}
        if refused:
            extra[EXTRA_REFUSED] = refused
        if foreign:
            extra[EXTRA_FOREIGN] = foreign
        return extra

    def _within(self, name: str, want: str) -> bool:
        if name in self.entries and want == self.entries[name]["original"]:
            return True  # the restore is always allowed
        rule = self.rules[name]
        if isinstance(rule, frozenset):
            return want in rule
        if not re.fullmatch(r"-?[0-9]{1,12}", want):  # plain decimal, as the kernel reads it
            return False
        return rule[0] <= int(want) <= rule[1]

    def _refuse(self, out: dict[str, str], name: str, want: str, reason: str) -> None:
        """Report a refusal once per distinct value; remember when it happened."""
        self._refused_at[name][want] = time.monotonic()
        if want not in self._reported[name]:
            self._reported[name].add(want)
            out[name] = f"{name}={want}: {reason}"
            log.warning("%s: %s=%s not applied: %s", self.subsystem, name, want, reason)

    def _record(self, name: str, entry: dict) -> None:
        """Persist `entry` (fsync) and adopt it; OSError leaves everything as it was."""
        self.ledger.put(entry)  # type: ignore[union-attr]
        self.entries[name] = entry

    def _write(self, name: str, spec: KnobSpec, current: str, want: str) -> str | None:
        """Record durably, write, read back; a reason string if it did not happen."""
        fresh = name not in self.entries
        try:
            entry = self.entries.get(name) or self._new_entry(name, spec, current)
            for other in spec.coupled:  # their originals too: this write moves them
                if other in self.specs and other not in self.entries:
                    other_entry = self._new_entry(other, self.specs[other],
                                                  self.current[other])
                    self._record(other, dict(other_entry, written=[self.current[other]]))
                    self.expected[other] = self.current[other]
            written = [v for v in (self.expected.get(name), want) if v is not None]
            self._record(name, dict(entry, written=written, time=time.time()))
        except OSError as exc:
            return (f"cannot record the original durably ({exc}); nothing is written "
                    "without it")
        entry = self.entries[name]
        failed: OSError | None = None
        try:
            kernel.write_text(spec.path, want)
        except OSError as exc:
            failed = exc
        self._after_write(name, spec, entry, fresh)
        if failed is not None:
            return f"the kernel refused it ({os.strerror(failed.errno or 0)})"
        self._refused_at[name].pop(want, None)
        return None

    def _new_entry(self, name: str, spec: KnobSpec, current: str) -> dict:
        """A ledger entry for `name` whose original is `current` (OSError if unreadable)."""
        alt_original = read_text(spec.alt_path) if spec.alt_path is not None else None
        return {
            "path": str(spec.path), "format": spec.format, "knob": name,
            "subsystem": self.subsystem, "original": current,
            "alt_path": str(spec.alt_path) if spec.alt_path else None,
            "alt_original": alt_original, "priority": spec.priority, "written": [],
            "owner": {"pid": os.getpid(), "start": self._start, "instance": self.instance},
            "boot_id": self._boot, "time": time.time(),
        }

    def _after_write(self, name: str, spec: KnobSpec, entry: dict, fresh: bool) -> None:
        """Read back what the kernel holds now and keep the ledger truthful."""
        for knob in (name, *spec.coupled):
            if knob not in self.entries:
                continue
            try:
                value = self.specs[knob].read()
            except OSError:
                continue
            self.current[knob] = self.expected[knob] = value
            self._note_written(knob, value)
        if fresh and self.current[name] == entry["original"] and not spec.coupled:
            self._forget(name)  # refused and nothing changed: no entry needed

    def _note_written(self, name: str, value: str) -> None:
        entry = self.entries[name]
        if value in entry["written"]:
            return
        try:
            self._record(name, dict(entry, written=[*entry["written"], value]))
        except OSError as exc:
            log.error("%s: ledger update for %s failed: %s", self.subsystem, name, exc)

    def _forget(self, name: str) -> dict | None:
        """Drop `name`'s entry from memory and from the ledger."""
        entry = self.entries.pop(name, None)
        self.expected.pop(name, None)
        if entry is not None:
            try:
                self.ledger.drop(entry["path"])  # type: ignore[union-attr]
            except OSError as exc:
                log.error("%s: ledger drop of %s failed: %s", self.subsystem, name, exc)
        return entry

    def _go_foreign(self, name: str, current: str) -> str:
        """Another party changed `name`: let go of it for the rest of this mount."""
        expected = self.expected.get(name)
        entry = self._forget(name) or {}
        self.foreign.add(name)
        reason = (f"changed to {current!r} behind mlfs's back (mlfs last wrote "
                  f"{expected!r}, original {entry.get('original')!r}); left as it is and "
                  "no longer touched until the mount restarts")
        log.warning("%s: %s %s", self.subsystem, name, reason)
        return reason

    # ---- restoring ----------------------------------------------------------------
    def release(self, names: Iterable[str]) -> None:
        """No model controls `names` any more: put their originals back now.

        Coupled knobs whose original mlfs recorded because of these (nr_requests
        for the scheduler) are restored with them.
        """
        with self._lock:
            wanted = set(names)
            for name in list(wanted):
                if name in self.specs:
                    wanted.update(self.specs[name].coupled)
            self._restore([n for n in self.specs if n in wanted and n in self.entries])

    def close(self) -> None:
        """Restore every knob mlfs changed; the controller writes nothing after this."""
        with self._lock:
            self._closed = True
            self._restore([n for n in self.specs if n in self.entries])
            LIVE.pop(self.instance, None)

    def _restore(self, names: list[str]) -> None:
        """Judge every knob first (ours or foreign), then restore in priority order."""
        for name in names:
            try:
                current = self.specs[name].read()
            except FileNotFoundError:
                self._forget(name)  # the device is gone, and with it the setting
                continue
            except OSError:
                continue
            if current != self.expected[name]:
                self._pending_foreign[name] = self._go_foreign(name, current)
        for name in names:
            entry = self.entries.get(name)
            if entry is None:
                continue
            try:
                restore_entry(entry)
            except OSError as exc:
                log.error("%s: restoring %s=%s failed: %s; the ledger keeps it for the "
                          "next start", self.subsystem, name, entry["original"], exc)
                try:  # a coupled restore may have moved it: keep expecting the truth
                    value = self.specs[name].read()
                except OSError:
                    continue
                self.current[name] = self.expected[name] = value
                self._note_written(name, value)
                continue
            self._forget(name)
            self._refused_at[name].clear()
            try:
                self.current[name] = self.specs[name].read()
            except OSError:
                pass
            log.info("%s: restored %s=%s", self.subsystem, name, entry["original"])

