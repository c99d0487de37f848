"""What the real Linux backends share: kernel file I/O, the apply rules and the ledger.

The part users trust is here.  A real backend changes settings of the running
kernel (vm.* sysctls, block-queue attributes), so mlfs promises:

1. **Observe-only unless configured.**  A knob is written only if the
   subsystem's ``apply`` table lists it, and only within the configured
   bounds, which must themselves lie inside mlfs's hard bounds (`KnobSpec.lo`
   / `hi`, never wider than what the kernel accepts).  The one value always
   writable outside the bounds is the knob's original value (that is the
   restore).  The knob range a subsystem shows in ``info`` *is* the allowed
   range: ``[lo, hi]`` (or the allowed scheduler names) for an applied knob,
   and just the current value (``min == max``, one choice) for an observed
   one, so the proxy rejects a recommendation mlfs would not apply with
   EINVAL instead of recording a value in the dataset that never took effect.
2. **The original is durable before the first change.**  Before mlfs first
   writes a kernel file it records the file's current value in a *ledger*
   entry in the state directory (``STATE/ledger/<quoted path>.json``: written
   to a temporary file, fsynced, renamed, directory fsynced).  Each later
   write first adds the value about to be written to the entry's ``written``
   list the same way, so after a crash mlfs knows every value it may have
   left behind.
3. **Restored on stop, on unmount and after a crash.**  `KnobController.release`
   (a model stopped or removed) and `KnobController.close` (unmount, SIGTERM)
   write the original back and delete the entry.  A new controller first
   recovers every entry whose owner is gone (a different process that is no
   longer running, or a controller of this process that was dropped without
   `close`, which is how the tests simulate SIGKILL): if the file still holds
   the original or a value mlfs wrote, the original is written back; the
   entry is deleted.  Entries from before a reboot are dropped unrestored
   (the reboot reset the kernel).  A restore that fails (EINVAL, EBUSY) keeps
   its entry for the next start; a file that no longer exists (a detached
   device) drops it.
   An entry is validated when read (a kernel path under /sys or /proc/sys,
   string values, ...); a damaged one is set aside (`.damaged`, with a log
   line naming the original it still holds), never restored automatically,
   and never lost: `mlfs restore` (`restore_state_dir`) reads it.
4. **Someone else's change wins.**  When the value read back differs from the
   one mlfs last wrote, another party changed it: mlfs drops the ledger
   entry without restoring (the other party owns the setting now), never
   touches that knob again until the mount restarts, and reports
   ``Sample.extra["foreign"] = {knob: reason}`` once.  The same goes for a
   crash recovery that finds a value mlfs never wrote.
5. **A refusal is reported, not hammered.**  A write the kernel refuses
   (OSError) is reported in ``Sample.extra["refused"] = {knob: reason}`` once
   per distinct value; that value is not tried again for `RETRY_SECONDS`, and
   a repeated refusal is not reported again.  A value the configuration does
   not allow is reported the same way and never written.

Coupled kernel files are handled where the kernel couples them: writing
``vm.dirty_ratio`` zeroes ``vm.dirty_bytes`` (and the background pair alike),
so the ledger records both and restores the bytes form when that was the one
in use; switching the I/O scheduler resets ``nr_requests``, so the scheduler
is restored first and a scheduler write updates the expected ``nr_requests``.

Apply configuration (one table per subsystem)::

    apply = {read_ahead_kb = [16, 4096], scheduler = ["none", "mq-deadline"]}

Integer knobs take ``[lo, hi]`` (inclusive, inside the knob's hard bounds);
choice knobs take the list of names that may be written (each one the kernel
offers).  An empty or absent table means observe-only.  Applying needs a
state directory (for the ledger); a subsystem refuses to start without one.
"""

from __future__ import annotations

import abc
import errno
import json
import logging
import math
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from mlfs.abi import EXTRA_FOREIGN, EXTRA_REFUSED, Knob, KnobValue, Objective, Sample, Subsystem
from mlfs.core.durable import DAMAGED_SUFFIX, fsync_dir, set_aside, write_durably

from .settings import SettingError

log = logging.getLogger("mlfs.backends.linux")

#: seconds before a value the kernel refused is tried again (silently)
RETRY_SECONDS = 60.0
#: the ledger's subdirectory of the state directory
LEDGER_DIR = "ledger"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

Rule = tuple[int, int] | frozenset[str]


class UnavailableError(ValueError):
    """A kernel file a subsystem needs cannot be read (no such device, no PSI...)."""


# ---- kernel files ------------------------------------------------------------------
def read_text(path: str | Path) -> str:
    """The stripped contents of a proc/sys file; raises OSError."""
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read().strip()


def write_text(path: str | Path, value: str) -> None:
    """Write one value with a single write(2), the way `echo v > file` does.

    sysfs and procfs report a refusal from write(2) itself (EINVAL, EBUSY...),
    so a plain os.write surfaces it as OSError with the kernel's errno.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        data = value.encode("ascii") + b"\n"
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.EIO, f"short write to {path}")
    finally:
        os.close(fd)


def parse_bracketed(text: str) -> tuple[str, tuple[str, ...]]:
    """`none [mq-deadline] kyber` -> ("mq-deadline", ("none", "mq-deadline", "kyber"))."""
    current = ""
    choices: list[str] = []
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            word = word[1:-1]
            current = word
        choices.append(word)
    if not current and len(choices) == 1:  # e.g. a device offering only "none"
        current = choices[0]
    return current, tuple(choices)


def read_key_values(path: str | Path) -> dict[str, int]:
    """`key value` (/proc/vmstat) or `Key: value kB` (/proc/meminfo) lines as ints."""
    out: dict[str, int] = {}
    with open(path, encoding="ascii", errors="replace") as fh:
        for line in fh:
            parts = line.replace(":", " ").split()
            if len(parts) >= 2:
                try:
                    out[parts[0]] = int(parts[1])
                except ValueError:
                    continue
    return out


_PSI_KEYS = ("avg10", "avg60", "avg300", "total")


def read_psi(resource: str) -> dict[str, float]:
    """/proc/pressure/<resource> as {some_avg10, some_total, full_avg10, full_total, ...}.

    Missing file (kernel without PSI) or line (cpu `full` before 5.13) -> zeros.
    """
    try:
        return read_psi_file(f"/proc/pressure/{resource}")
    except OSError:
        return {f"{kind}_{key}": 0.0 for kind in ("some", "full") for key in _PSI_KEYS}


def read_psi_file(path: str | Path) -> dict[str, float]:
    """A PSI file (/proc/pressure/<r>, a cgroup v2 <r>.pressure) as {some_avg10, ...}.

    A missing line reads zeros; an unreadable file raises OSError.
    """
    out = {f"{kind}_{key}": 0.0 for kind in ("some", "full") for key in _PSI_KEYS}
    for line in read_text(path).splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        for item in parts[1:]:
            key, _, value = item.partition("=")
            if key in _PSI_KEYS:
                try:
                    out[f"{parts[0]}_{key}"] = float(value)
                except ValueError:
                    pass
    return out


def boot_id() -> str:
    try:
        return read_text(_BOOT_ID)
    except OSError:
        return ""


def _process_start(pid: int) -> str | None:
    """The start time (clock ticks since boot) of `pid`, or None if it is gone."""
    try:
        stat = read_text(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = stat.rsplit(") ", 1)[-1].split()
    if not fields or fields[0] == "Z":
        return None
    return fields[19] if len(fields) > 19 else None


# ---- knobs -------------------------------------------------------------------------
@dataclass(frozen=True)
class KnobSpec:
    """A kernel file behind a knob, with mlfs's hard bounds for it.

    `lo`/`hi` are never wider than what the kernel accepts (they may be
    narrower where the kernel's range includes nonsense, e.g. dirty_ratio 0).
    `alt_path` is a kernel-coupled twin (dirty_bytes for dirty_ratio) whose
    original is recorded too.  `priority` orders restores (lower first).
    `coupled` names knobs of the same subsystem whose value a write of this
    one changes (the scheduler resets nr_requests).  `settle_ticks`: for how
    many ticks a change still shows in the objective (mlfs/core/efficiency.py).
    """

    name: str
    path: Path
    type: Literal["int", "choice"] = "int"
    lo: int | None = None
    hi: int | None = None
    unit: str = ""
    alt_path: Path | None = None
    priority: int = 1
    coupled: tuple[str, ...] = ()
    #: the knob's carry-over in ticks (`mlfs.abi.Knob.settle_ticks`)
    settle_ticks: int = 0

    @property
    def format(self) -> str:
        return "bracketed" if self.type == "choice" else "plain"

    def read(self) -> str:
        return read_value(self.path, self.format)

    def kernel_choices(self) -> tuple[str, ...]:
        """For a choice knob: what the kernel offers now (bracketed listing)."""
        return parse_bracketed(read_text(self.path))[1]


def read_value(path: str | Path, fmt: str) -> str:
    text = read_text(path)
    return parse_bracketed(text)[0] if fmt == "bracketed" else text


def parse_apply(apply: object, specs: Mapping[str, KnobSpec], where: str,
                choices: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, Rule]:
    """Check an `apply` table against the knobs' hard bounds; ValueError if wrong.

    Integer knob: `[lo, hi]` with spec.lo <= lo <= hi <= spec.hi.  Choice knob:
    a non-empty list of names, each offered by the kernel (`choices`).
    """
    if apply is None:
        return {}
    if not isinstance(apply, Mapping):
        raise ValueError(f"{where}: apply must be a table like "
                         "{read_ahead_kb = [16, 4096]}")
    rules: dict[str, Rule] = {}
    for name, value in apply.items():
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"{where}: apply: unknown knob {name!r} "
                             f"(known: {', '.join(specs)})")
        if spec.type == "int":
            if (not isinstance(value, list | tuple) or len(value) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
                raise ValueError(f"{where}: apply.{name} must be [lo, hi] (integers)")
            lo, hi = int(value[0]), int(value[1])
            hard_lo = spec.lo if spec.lo is not None else lo
            hard_hi = spec.hi if spec.hi is not None else hi
            if not hard_lo <= lo <= hi <= hard_hi:
                raise ValueError(f"{where}: apply.{name} = [{lo}, {hi}] must satisfy "
                                 f"{hard_lo} <= lo <= hi <= {hard_hi}")
            rules[name] = (lo, hi)
        else:
            if (not isinstance(value, list | tuple) or not value
                    or not all(isinstance(v, str) for v in value)):
                raise ValueError(f"{where}: apply.{name} must be a list of names")
            offered = (choices or {}).get(name, ())
            unknown = [v for v in value if v not in offered]
            if unknown:
                raise ValueError(f"{where}: apply.{name}: {', '.join(unknown)} not offered by "
                                 f"the kernel ({' '.join(offered) or 'nothing'})")
            rules[name] = frozenset(value)
    return rules


def describe_rules(rules: Mapping[str, Rule]) -> str:
    """`read_ahead_kb in [16, 4096]; scheduler in {none, mq-deadline}` or observe-only."""
    if not rules:
        return "observe-only (no knob is ever written)"
    parts = []
    for name, rule in rules.items():
        if isinstance(rule, tuple):
            parts.append(f"{name} in [{rule[0]}, {rule[1]}]")
        else:
            parts.append(f"{name} in {{{', '.join(sorted(rule))}}}")
    return "applies " + "; ".join(parts) + " (others observe-only)"


def check_measure(kwargs: Mapping[str, object], default_tick: float = 1.0) -> None:
    """`measure_seconds` fits inside the tick (both already range-checked)."""
    tick = kwargs.get("tick_seconds", default_tick)
    measure = kwargs.get("measure_seconds")
    if measure is not None and measure > tick:  # type: ignore[operator]
        raise SettingError("measure_seconds", f"{measure:g} is longer than the tick "
                           f"(tick_seconds {tick:g})")


# ---- the ledger ----------------------------------------------------------------------
#: the only places a ledger entry may name: kernel settings (docs/ABI.md, the root).  An entry
#: naming anything else is damage (or an attack on the state directory): mlfs,
#: running as root, would otherwise write its "original" into any file.
KERNEL_ROOTS = ("/sys/", "/proc/sys/")
_FORMATS = ("plain", "bracketed")
_STRING_FIELD = r'"{}"\s*:\s*("(?:[^"\\]|\\.)*")'


def _kernel_path(value: object) -> bool:
    return (isinstance(value, str) and value.startswith(KERNEL_ROOTS)
            and ".." not in Path(value).parts)


def entry_problem(entry: object) -> str | None:
    """Why `entry` is not a usable ledger entry, or None when it is."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    if not _kernel_path(entry.get("path")):
        return f"path {entry.get('path')!r} is not a file under {' or '.join(KERNEL_ROOTS)}"
    if not isinstance(entry.get("original"), str):
        return "no original value (a string)"
    if entry.get("format", "plain") not in _FORMATS:
        return f"format {entry.get('format')!r} is not one of {', '.join(_FORMATS)}"
    written = entry.get("written", [])
    if not isinstance(written, list) or not all(isinstance(w, str) for w in written):
        return "written is not a list of strings"
    if entry.get("alt_path") is not None and not _kernel_path(entry["alt_path"]):
        return f"alt_path {entry['alt_path']!r} is not a kernel file"
    if not isinstance(entry.get("alt_original"), str | None):
        return "alt_original is not a string"
    if not isinstance(entry.get("owner", {}), dict):
        return "owner is not an object"
    if not isinstance(entry.get("boot_id", ""), str):
        return "boot_id is not a string"
    priority = entry.get("priority", 1)
    if isinstance(priority, bool) or not isinstance(priority, int):
        return "priority is not a whole number"
    return None


def salvage(text: str) -> dict:
    """What a damaged entry still says: `path`, `original`, ... found one by one.

    Enough to name the knob in a log line, and for `mlfs restore` to put the
    original back when both a kernel path and an original survive.
    """
    out: dict = {}
    for key in ("path", "original", "format", "knob", "subsystem", "alt_path",
                "alt_original"):
        match = re.search(_STRING_FIELD.format(key), text)
        if match:
            try:
                out[key] = json.loads(match.group(1))
            except ValueError:
                continue
    return out


def describe_salvage(found: dict) -> str:
    """`read_ahead_kb=128 (/sys/block/loop3/queue/read_ahead_kb)`, or what is missing."""
    if "path" in found and "original" in found:
        return f"{found.get('knob', '?')}={found['original']} ({found['path']})"
    if "path" in found:
        return f"{found.get('knob', '?')} ({found['path']}) without its original"
    return "nothing readable"


class Ledger:
    """Durable original values, one JSON file per kernel file, in STATE/ledger/."""

    def __init__(self, state_dir: str | Path, create: bool = True) -> None:
        state = Path(state_dir)
        self.directory = state / LEDGER_DIR
        if create and not self.directory.is_dir():
            state.mkdir(parents=True, exist_ok=True)
            self.directory.mkdir(exist_ok=True)
            fsync_dir(state)

    def file(self, path: str | Path) -> Path:
        return self.directory / (quote(str(path), safe="") + ".json")

    def entries(self) -> list[dict]:
        """Every usable entry; a damaged one is set aside, with what it still says.

        A damaged entry is never restored automatically (without its owner and
        the values mlfs wrote it cannot be judged ours or someone else's), but
        its original is not lost either: the log line names it, and
        `mlfs restore` reads set-aside entries (`damaged`).
        """
        out = []
        for file in sorted(self.directory.glob("*.json")):
            try:
                text = file.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                log.error("ledger: cannot read %s: %s; kept for the next start", file, exc)
                continue
            try:
                entry = json.loads(text)
                problem = entry_problem(entry)
            except ValueError as exc:
                entry, problem = None, f"not JSON: {exc}"
            if problem is None and file != self.file(entry["path"]):
                problem = f"its path {entry['path']!r} does not match the file name"
            if problem is not None:
                found = salvage(text)
                hint = (" (`mlfs restore` puts it back)"
                        if "path" in found and "original" in found else "")
                log.error("ledger: %s is damaged (%s); original still readable: %s%s",
                          file.name, problem, describe_salvage(found), hint)
                set_aside(file, problem)
                continue
            out.append(entry)
        return out

    def damaged(self) -> list[tuple[Path, dict]]:
        """Set-aside entries and what each still says (`salvage`)."""
        out = []
        for file in sorted(self.directory.glob("*.json" + DAMAGED_SUFFIX + "*")):
            try:
                out.append((file, salvage(file.read_text(encoding="utf-8", errors="replace"))))
            except OSError:
                out.append((file, {}))
        return out

    def put(self, entry: dict) -> None:
        """Write `entry` durably (tmp file, fsync, rename, fsync directory)."""
        write_durably(self.file(entry["path"]),
                      (json.dumps(entry, sort_keys=True) + "\n").encode())

    def drop(self, path: str | Path) -> None:
        try:
            self.file(path).unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)


def restore_entry(entry: dict) -> None:
    """Write an entry's original back (the bytes twin when that was in use)."""
    alt_path, alt_original = entry.get("alt_path"), entry.get("alt_original")
    if alt_path and alt_original not in (None, "", "0"):
        if read_text(alt_path) != alt_original:
            write_text(alt_path, alt_original)
        return
    if read_value(entry["path"], entry.get("format", "plain")) != entry["original"]:
        write_text(entry["path"], entry["original"])


#: live controllers of this process, by instance id (dropped ones vanish)
_LIVE: weakref.WeakValueDictionary[str, KnobController] = weakref.WeakValueDictionary()


def _owner_alive(owner: Mapping) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    if pid == os.getpid():
        return owner.get("instance") in _LIVE
    start = _process_start(pid)
    return start is not None and start == owner.get("start")


def recover(ledger: Ledger) -> dict[str, str]:
    """Restore every entry whose owner is gone; returns {path: what happened}.

    All entries are judged (ours or foreign) before any is restored, because
    restoring one file may change another (the scheduler resets nr_requests).
    """
    outcomes: dict[str, str] = {}
    this_boot = boot_id()
    plan: list[dict] = []
    for entry in ledger.entries():
        path = entry["path"]
        if _owner_alive(entry.get("owner") or {}):
            continue
        if entry.get("boot_id") and this_boot and entry["boot_id"] != this_boot:
            ledger.drop(path)
            outcomes[path] = "dropped: written before a reboot, which reset it"
            continue
        try:
            current = read_value(path, entry.get("format", "plain"))
        except FileNotFoundError:
            ledger.drop(path)
            outcomes[path] = "dropped: the file is gone"
            continue
        except OSError as exc:
            outcomes[path] = f"kept: unreadable ({os.strerror(exc.errno or 0)})"
            continue
        if current == entry["original"] or current in entry.get("written", []):
            plan.append(entry)
        else:
            ledger.drop(path)
            outcomes[path] = (f"foreign: found {current!r}, which mlfs never wrote "
                              f"(original {entry['original']!r}); left as it is")
    for entry in sorted(plan, key=lambda e: (e.get("priority", 1), e["path"])):
        try:
            restore_entry(entry)
        except OSError as exc:
            outcomes[entry["path"]] = ("kept: restore refused "
                                       f"({os.strerror(exc.errno or 0)}); retried next start")
            continue
        ledger.drop(entry["path"])
        outcomes[entry["path"]] = f"restored {entry['original']!r}"
    for path, outcome in outcomes.items():
        log.warning("ledger recovery: %s: %s", path, outcome)
    return outcomes


def restore_state_dir(state_dir: str | Path) -> list[tuple[str, str, bool]]:
    """Put back every original recorded in `state_dir`'s ledger, without a mount.

    For an operator whose daemon is gone for good (`mlfs restore`).  Usable
    entries follow the crash-recovery rules (`recover`: a value someone else
    set since is left alone, a reboot already reset the kernel); set-aside
    (damaged) entries are restored from what they still say, and renamed
    `.restored` once done.  Returns (path, outcome, ok) per entry.
    """
    ledger = Ledger(state_dir, create=False)
    if not ledger.directory.is_dir():
        return []
    out = [(path, outcome, not outcome.startswith("kept"))
           for path, outcome in recover(ledger).items()]
    for file, found in ledger.damaged():
        path, original = found.get("path"), found.get("original")
        if not _kernel_path(path) or not isinstance(original, str):
            out.append((str(file), "damaged: no kernel path with its original left in it; "
                        f"read it yourself ({describe_salvage(found)})", False))
            continue
        entry = {"path": path, "original": original,
                 "format": found.get("format") if found.get("format") in _FORMATS else "plain"}
        if _kernel_path(found.get("alt_path")) and isinstance(found.get("alt_original"), str):
            entry.update(alt_path=found["alt_path"], alt_original=found["alt_original"])
        try:
            restore_entry(entry)
        except FileNotFoundError:
            out.append((path, f"dropped: the file is gone (from the set-aside {file.name})",
                        True))
        except OSError as exc:
            out.append((path, f"kept: restore refused ({os.strerror(exc.errno or 0)}; "
                        f"from the set-aside {file.name})", False))
            continue
        else:
            out.append((path, f"restored {original!r} (from the set-aside {file.name})", True))
        try:
            os.rename(file, file.with_name(file.name + ".restored"))
        except OSError:
            pass
    return out


# ---- the controller --------------------------------------------------------------------
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
        self._start = _process_start(os.getpid())
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
        _LIVE[self.instance] = self

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
            write_text(spec.path, want)
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
            _LIVE.pop(self.instance, None)

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


# ---- the shared subsystem skeleton ---------------------------------------------------------
class LinuxSubsystem(Subsystem):
    """A real subsystem: knobs through a `KnobController`, features from counters.

    `step(knobs)` applies the knobs first and then measures a window of
    `measure_seconds` *after* applying them, so a dataset row's features and
    objective describe the knob values written in the same row (measuring the
    period since the previous call would credit each row with the previous
    tick's knobs).  With `measure_seconds = 0` it measures the period since the
    previous call instead (for tests and callers that pace themselves).  The
    step sleeps through its window, so `blocking = True`: the proxy runs it in
    a worker thread.
    """

    blocking = True
    #: feature -> unit, for the objective's unit
    UNITS: dict[str, str] = {}

    def _setup(self, *, name: str, specs: Mapping[str, KnobSpec], rules: Mapping[str, Rule],
               state_dir: str | Path | None, tick_seconds: float,
               measure_seconds: float | None, objective: str, goal: str,
               features: dict[str, str], choices: Mapping[str, tuple[str, ...]]) -> None:
        if not tick_seconds > 0:
            raise ValueError(f"{name}: tick_seconds must be > 0")
        if measure_seconds is None:
            measure_seconds = 0.8 * tick_seconds  # room for the proxy's own work
        if not 0 <= measure_seconds <= tick_seconds:
            raise ValueError(f"{name}: measure_seconds must be in [0, tick_seconds]")
        if objective not in features:
            raise ValueError(f"{name}: objective {objective!r} is not a feature "
                             f"({', '.join(features)})")
        if goal not in ("max", "min"):
            raise ValueError(f"{name}: goal must be 'max' or 'min'")
        self.name = name
        self.tick_seconds = float(tick_seconds)
        self.measure_seconds = float(measure_seconds)
        self.features = dict(features)
        self.objective = Objective(objective, self.UNITS.get(objective, ""), goal)  # type: ignore[arg-type]
        self.objective_feature = objective
        self._choices = dict(choices)
        self.controller = KnobController(name, specs, rules, state_dir)
        self.knobs = {n: self._knob(n) for n in specs}
        self.safety = describe_rules(rules)
        self._last = self.snapshot()
        self._last_time = time.monotonic()

    # ---- what a backend provides ---------------------------------------------------
    @abc.abstractmethod
    def snapshot(self) -> dict | None:
        """Read the counters (None if they cannot be read right now)."""

    @abc.abstractmethod
    def derive(self, before: dict, after: dict, seconds: float) -> dict[str, float]:
        """Features of the window between two snapshots."""

    def critical_state(self, features: dict[str, float]) -> str | None:
        return None

    def _knob(self, name: str) -> Knob:
        """The knob as `info` shows it now (its range is what may be written)."""
        return self.controller.knob(name, self._choices.get(name, ()))

    # ---- the Subsystem interface -----------------------------------------------------
    def default_knobs(self, last: Sample | None) -> dict[str, KnobValue]:
        """The default algorithm: the original values (mlfs follows others' changes)."""
        return self.controller.default_values()

    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        extra = self.controller.apply(knobs)
        for name in self.knobs:  # an observed knob's one allowed value follows the kernel
            knob = self._knob(name)
            if knob != self.knobs[name]:
                self.knobs[name] = knob
        if self.measure_seconds > 0:
            before, started = self.snapshot(), time.monotonic()
            time.sleep(self.measure_seconds)
        else:
            before, started = self._last, self._last_time
        after, ended = self.snapshot(), time.monotonic()
        self._last, self._last_time = after, ended
        seconds = ended - started
        if before is None or after is None or seconds <= 0:
            features = {n: 0.0 for n in self.features}
            extra["unavailable"] = "counters could not be read"
            return Sample(features=features, objective=math.nan, extra=extra)
        features = self.derive(before, after, seconds)
        return Sample(features=features, objective=float(features[self.objective_feature]),
                      critical=self.critical_state(features), extra=extra)

    def release(self, knobs: list[str]) -> None:
        self.controller.release(knobs)

    def close(self) -> None:
        self.controller.close()


def rate(before: Mapping[str, float], after: Mapping[str, float], key: str,
         seconds: float) -> float:
    """Per-second increase of a counter (0 when missing or when it went backwards)."""
    delta = after.get(key, 0) - before.get(key, 0)
    return float(delta) / seconds if delta > 0 else 0.0
