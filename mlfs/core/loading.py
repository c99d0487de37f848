"""Run-time loading (the modprobe model): the root `load` grammar and what is remembered.

`load <backend> [key=value ...]` on MOUNT/control is a `[[subsystem]]` table
written on one line: each value is one TOML value without spaces (a bare word
that is not TOML is taken as a string), so what an operator types and what the
configuration file holds are checked by the same backend code.  This module
only parses; whether the backend exists and the settings fit is the backend's
`check` (through `mlfs.backends.check_entry`), run before anything changes.

Loaded subsystems are remembered in STATE/loaded.json (written durably, the
whole file replaced), so they come back at the next mount and after a crash.
A damaged file is set aside with a log line and counts as empty: a remembered
load must never block the mount.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .durable import set_aside, write_durably
from .errors import invalid
from .statedir import LOADED_FILE

log = logging.getLogger("mlfs.loading")

#: a setting's key, as TOML bare keys are written in the configuration
_KEY = re.compile(r"[a-z_][a-z0-9_]{0,63}")
#: a backend's name (entry-point names: dotted words)
_BACKEND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: a bare word taken as a string when it is not a TOML value (`name=sim2`)
_BARE = re.compile(r"[A-Za-z0-9_.:/+-]{1,256}")
#: bounds on one command: an operator's line, not a data upload
MAX_SETTINGS = 32
#: how deep a setting's TOML value may nest arrays and tables (no setting needs more than 2)
MAX_NESTING = 8
FILE_VERSION = 1


@dataclass(frozen=True)
class Load:
    """`load <backend> key=value ...`: a [[subsystem]] table."""

    entry: dict


@dataclass(frozen=True)
class Unload:
    name: str


def _nesting(text: str) -> int:
    """How deep `[` and `{` nest in `text` (brackets in strings count too: an upper bound)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_value(key: str, text: str) -> object:
    """One setting's value: a TOML value, else a bare word string; EINVAL otherwise.

    Nesting is bounded before tomllib sees the text: tomllib recurses per level,
    and ~700 levels in a 4 KiB command raised RecursionError (EIO, no `errors`
    line) instead of a refusal.
    """
    if _nesting(text) > MAX_NESTING:
        raise invalid(f"{key}: arrays or tables nested deeper than {MAX_NESTING} levels")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if _BARE.fullmatch(text):
            return text
        raise invalid(f"{key}: {text[:64]!r} is neither a TOML value (written without "
                      "spaces) nor a bare word") from None


def parse_command(words: list[str]) -> Load | Unload:
    """`load`/`unload` words (split on spaces) to a command; EINVAL naming the fault."""
    verb, args = words[0], words[1:]
    if verb == "unload":
        if len(args) != 1:
            raise invalid("unload takes one subsystem name: unload <name>")
        return Unload(args[0])
    if not args:
        raise invalid("load takes a backend: load <backend> [name=<name>] [key=value ...]")
    backend, settings = args[0], args[1:]
    if "=" in backend or not _BACKEND.fullmatch(backend):
        raise invalid(f"{backend[:64]!r} is not a backend name "
                      "(load <backend> [key=value ...])")
    if len(settings) > MAX_SETTINGS:
        raise invalid(f"{len(settings)} settings (at most {MAX_SETTINGS})")
    entry: dict = {"backend": backend}
    for token in settings:
        key, eq, text = token.partition("=")
        if not eq or not _KEY.fullmatch(key) or not text:
            raise invalid(f"{token[:64]!r} is not key=value (a TOML value without spaces)")
        if key in entry:
            raise invalid(f"{key} given twice" if key != "backend"
                          else "backend is the word after load, not a setting")
        entry[key] = parse_value(key, text)
    return Load(entry)


@dataclass(frozen=True)
class Remembered:
    """One subsystem loaded at run time: its name and its [[subsystem]] table."""

    name: str
    entry: dict


#: the most loads remembered and the largest record read (mount.max_subsystems is at most
#: 4096; each entry is a load command's settings, a few hundred bytes)
MAX_REMEMBERED = 4096
MAX_REMEMBERED_BYTES = 4 << 20


def read_remembered(state_dir: Path) -> list[Remembered]:
    """STATE/loaded.json's loads, in load order; a damaged file is set aside (empty)."""
    path = Path(state_dir) / LOADED_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("%s unreadable (%s): no remembered subsystem loaded", path, exc)
        return []
    try:
        if len(text) > MAX_REMEMBERED_BYTES:
            raise ValueError(f"{len(text)} bytes, over {MAX_REMEMBERED_BYTES}")
        data = json.loads(text)
        items = data["loaded"]
        if not isinstance(items, list) or len(items) > MAX_REMEMBERED:
            raise ValueError(f"loaded is not a list of at most {MAX_REMEMBERED} entries")
        out = [Remembered(str(item["name"]), dict(item["entry"])) for item in items]
        if any("backend" not in r.entry for r in out):
            raise ValueError("an entry without a backend")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        log.error("%s is damaged (%s); set aside, no remembered subsystem loaded", path, exc)
        set_aside(path, f"damaged: {exc}")
        return []
    return out


def write_remembered(state_dir: Path, loads: list[Remembered]) -> None:
    """Replace STATE/loaded.json durably (OSError when it cannot be written)."""
    data = {"version": FILE_VERSION,
            "loaded": [{"name": r.name, "entry": r.entry} for r in loads]}
    write_durably(Path(state_dir) / LOADED_FILE,
                  (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())

