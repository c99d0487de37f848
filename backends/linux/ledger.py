"""The ledger: each original value durable before mlfs first changes a kernel file.

Promises 2 and 3 of `mlfs.backends.linux`: one JSON entry per kernel
file in STATE/ledger/, validated when read (a damaged one set aside, never
restored automatically, never lost), and crash recovery of every entry whose
owner is gone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import weakref
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from mlfs.abi import DAMAGED_SUFFIX, fsync_dir, set_aside, write_durably

from . import files as kernel
from .files import boot_id, process_start, read_text
from .knobs import read_value

log = logging.getLogger("mlfs.backends.linux")

#: the ledger's subdirectory of the state directory
LEDGER_DIR = "ledger"

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
            kernel.write_text(alt_path, alt_original)
        return
    if read_value(entry["path"], entry.get("format", "plain")) != entry["original"]:
        kernel.write_text(entry["path"], entry["original"])

#: live owners of ledger entries in this process (KnobControllers, by instance
#: id; a controller dropped without `close` vanishes, which recovery then treats
#: as a crash)
LIVE: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()


def _owner_alive(owner: Mapping) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    if pid == os.getpid():
        return owner.get("instance") in LIVE
    start = process_start(pid)
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

