"""The state directory's layout: its format version, its upgrade, safe names.

The state directory outlives any one mlfs: an operator upgrades the package
and mounts again over the same rows, models and ledger.  So the directory says
which layout it has (the file `format`, one integer), and a newer mlfs brings
an older directory up to date in place, one small step per version, before
anything else reads it.  A directory written by a *newer* mlfs than this one
is refused: guessing at a layout this code has never seen could lose rows.

Versions:

1. The layout of mlfs up to commit f0369e4 (no `format` file): one directory
   per subsystem holding `dataset/`, `models/<m>/` and `tick_reserved`;
   `ledger/` of original knob values; `mlfs.log`, `mlfs.pid`.
2. The same layout, with the `format` file.  Nothing moves; the version
   file exists so that later layouts can be told apart from this one.

A subsystem's directory is always `<state dir>/<name>`, with a name that
matches the model-name pattern, is not one of the mount's or the state
directory's own entries (`RESERVED`), and resolves inside the state directory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from mlfs.abi import NAME, NAME_RULE
from mlfs.base.durable import (
    NotRegular,
    TooLarge,
    UnsafePath,
    read_bounded,
    set_aside,
    write_durably,
)

log = logging.getLogger("mlfs.state")

FORMAT_FILE = "format"
#: the subsystems loaded at run time (`load` on MOUNT/control), re-created at mount
LOADED_FILE = "loaded.json"
#: the layout this mlfs writes
FORMAT_VERSION = 4

#: the operator's mount-wide emergency pin (MOUNT/control `emergency`), kept across mounts
EMERGENCY_PIN_FILE = "emergency_pinned"
#: every entry the state directory holds beside the subsystems' directories, by its owner:
#: this module (format, loaded.json, the pid file, the emergency pin), the daemon's log,
#: mlfs.base.hostid (host), the real-knob backends' ledger, the fleet cursors
#: (mlfs.base.shipped), and backends' own state (backends/, e.g. the kernel log's cursor)
STATE_ENTRIES = frozenset({FORMAT_FILE, LOADED_FILE, "mlfs.pid", "mlfs.log",
                           EMERGENCY_PIN_FILE, "host", "ledger", "fleet", "backends"})
#: the files of the mount's root (docs/ABI.md, the root), which a subsystem would shadow
MOUNT_ROOT_FILES = frozenset({"version", "events", "metrics", "control", "errors",
                              "backends", "host"})
#: names a subsystem cannot take: either table above
RESERVED = STATE_ENTRIES | MOUNT_ROOT_FILES
#: ...nor names ending so: what is set aside (`durable.set_aside`) or half written
RESERVED_SUFFIXES = (".damaged", ".tmp")
#: the most a one-word state file (format, host, pid, pin) may hold: a FIFO, a device or
#: a huge file planted in its place is refused before a byte is read
SMALL_FILE_BYTES = 4096


class FormatError(Exception):
    """The state directory cannot be used by this mlfs (str() is one line)."""


def subsystem_name_problem(name: object) -> str | None:
    """Why `name` cannot name a subsystem, or None when it can."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return f"{name!r} is not a subsystem name ({NAME_RULE})"
    if name in RESERVED:
        return f"{name!r} is reserved ({', '.join(sorted(RESERVED))})"
    if name.endswith(RESERVED_SUFFIXES):
        return (f"{name!r} is reserved (names ending in {' or '.join(RESERVED_SUFFIXES)} are "
                "the state directory's set-aside and temporary files)")
    return None


def subsystem_dir(state_dir: Path, name: str) -> Path:
    """`<state dir>/<name>`, checked: never anywhere else (ValueError)."""
    problem = subsystem_name_problem(name)
    if problem:
        raise ValueError(problem)
    root = Path(state_dir).resolve()
    directory = (root / name).resolve()
    if directory.parent != root:
        raise ValueError(f"{name!r} resolves to {directory}, outside {root}")
    return directory


def read_word(path: Path) -> tuple[str | None, str]:
    """A small state file's stripped ASCII text, or (None, why it cannot be read).

    (None, "") when the file does not exist.
    """
    try:
        return read_bounded(path, SMALL_FILE_BYTES).decode("ascii").strip(), ""
    except FileNotFoundError:
        return None, ""
    except UnsafePath:
        return None, "a symbolic link (not followed)"
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    except (NotRegular, TooLarge) as exc:
        return None, str(exc)
    except ValueError:
        return None, "not ASCII text"


# ---- the format version ----------------------------------------------------------
def _is_empty(state_dir: Path) -> bool:
    """A state directory nothing has been kept in yet (a log alone keeps nothing)."""
    try:
        return all(p.name in ("mlfs.log", "mlfs.pid") for p in state_dir.iterdir())
    except FileNotFoundError:
        return True


def read_version(state_dir: Path) -> int:
    """The directory's format: the `format` file, 1 without it, current when new.

    A `format` file that is not one whole number is set aside (with a log
    line) and the directory is treated as version 1: every upgrade step is
    safe to run again on a directory that already has its result.
    """
    state_dir = Path(state_dir)
    path = state_dir / FORMAT_FILE
    text, why = read_word(path)
    if text is None and not why:
        return FORMAT_VERSION if _is_empty(state_dir) else 1
    if text is not None and text.isdigit() and 1 <= int(text) < 1 << 31:
        return int(text)
    set_aside(path, why or f"not a format version: {text[:40]!r}")
    return 1


def check(state_dir: Path) -> int:
    """The directory's format version; FormatError when it is newer than known.

    Reads only: `mlfs mount` calls it before forking, to refuse in one line.
    """
    text, _ = read_word(Path(state_dir) / FORMAT_FILE)
    version = int(text) if text is not None and text.isdigit() else 1
    if version > FORMAT_VERSION:
        raise _too_new(state_dir, version)
    return version


def _too_new(state_dir: Path, version: int) -> FormatError:
    return FormatError(f"{state_dir}: state directory format {version} is newer than this "
                       f"mlfs knows ({FORMAT_VERSION}); mount it with a newer mlfs")


def _v1_to_v2(state_dir: Path) -> str:
    """Version 2 is version 1 plus the `format` file: nothing moves."""
    return "the layout is unchanged; the format file records the version from now on"


def _v2_to_v3(state_dir: Path) -> str:
    """Version 3 adds record datasets, whose write-ahead files are Arrow IPC streams
    (`<subsystem>/records/wal.N.arrows`).  A version-2 directory has none, and its
    tick stores keep their JSON-lines write-ahead files, which replay as before, so
    nothing is converted; the version is raised so that an older mlfs, which would
    not replay `.arrows` files and so lose pending records, refuses the directory."""
    return ("record datasets (Arrow IPC write-ahead files) may appear from now on; the JSON "
            "write-ahead files of tick stores replay unchanged")


def _v3_to_v4(state_dir: Path) -> str:
    """Version 4 writes record write-ahead files as checksummed frames with an
    acknowledgement mark (`mlfs.core.storage.arrow_wal`).  Unframed version-3 files still
    replay, so nothing is converted; the version is raised so that an older mlfs, which
    would read a framed file as damaged and drop its pending records, refuses the
    directory."""
    return ("record write-ahead files are checksummed frames from now on; older unframed "
            "files still replay")


#: (from version, step): step(state_dir) upgrades from -> from + 1, returns what it did
STEPS: list[tuple[int, Callable[[Path], str]]] = [
    (1, _v1_to_v2),
    (2, _v2_to_v3),
    (3, _v3_to_v4),
]


def upgrade(state_dir: Path) -> int:
    """Bring `state_dir` to FORMAT_VERSION in place; returns the version it had.

    Each step runs, then the new version is written durably, so a crash
    between steps resumes at the step that did not finish (steps are written
    to be safe to run twice).  FormatError for a newer-than-known directory.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    found = read_version(state_dir)
    if found > FORMAT_VERSION:
        raise _too_new(state_dir, found)
    version = found
    for start, step in STEPS:
        if start != version:
            continue
        done = step(state_dir)
        version = start + 1
        write_durably(state_dir / FORMAT_FILE, f"{version}\n".encode())
        log.warning("%s: state directory upgraded from format %d to %d: %s",
                    state_dir, start, version, done)
    if version != FORMAT_VERSION:
        raise FormatError(f"{state_dir}: no upgrade from format {version} "
                          f"to {FORMAT_VERSION}")
    if not (state_dir / FORMAT_FILE).exists():  # a new directory: record its format
        write_durably(state_dir / FORMAT_FILE, f"{FORMAT_VERSION}\n".encode())
    return found


# ---- the pid file -------------------------------------------------------------------
PID_FILE = "mlfs.pid"


def _mlfs_mount_process(pid: int) -> bool:
    """`pid` runs `mlfs mount` (not merely a process that reused the number)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(") ", 1)[-1].startswith("Z"):
        return False
    args = [a.decode(errors="replace") for a in argv if a]
    return any("mlfs" in a for a in args[:3]) and "mount" in args


def live_daemon(state_dir: Path, repair: bool = True) -> int | None:
    """The pid of a running mlfs daemon serving `state_dir` (its `mlfs.pid`), or None.

    A pid file that is not one whole number says nothing and must not stop a
    mount: with `repair` (the daemon, which logs to mlfs.log) it is set aside
    with a log line; without (a command's read-only look) it is ignored.
    """
    path = Path(state_dir) / PID_FILE
    text, why = read_word(path)
    if text is None and not why:
        return None
    if text is None or not (text.isdigit() and 0 < int(text) < 1 << 22):
        if repair:
            set_aside(path, why or f"not a process id: {text[:40]!r}")
        return None
    pid = int(text)
    if pid == os.getpid():
        return None
    return pid if _mlfs_mount_process(pid) else None


def write_pid(state_dir: Path) -> None:
    """Record this daemon's pid (durably: `mlfs restore` trusts it)."""
    path = Path(state_dir) / PID_FILE
    if path.is_dir() or (path.exists() and not path.is_file()):
        set_aside(path, "not a regular file")
    write_durably(path, f"{os.getpid()}\n".encode())
