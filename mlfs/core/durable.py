"""Durable files in the state directory, and setting damaged ones aside.

Every file the daemon keeps between runs (model settings, a saved policy,
counters, the ledger of original knob values) is replaced the same way: a
temporary file, fsync, rename over the old one, fsync of the directory.  A
crash at any point leaves either the old or the new content, never a torn
one, and a rename that the directory has not recorded cannot come back as
the old name after a power cut.

What fails validation when it is read back is never deleted and never stops
a mount: `set_aside` renames it to `<name>.damaged` (numbered when one is
already there) and logs why, so an operator can look at it later.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("mlfs.state")

DAMAGED_SUFFIX = ".damaged"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new name) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes, tmp: Path | None = None) -> None:
    """Replace `path` with `data`: tmp file, fsync, rename, fsync the directory.

    `tmp` names the temporary file (default `<name>.tmp` beside it): a shared
    store read by globbing wants a hidden one, so readers never list it.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp") if tmp is None else Path(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def set_aside(path: Path, reason: str) -> Path | None:
    """Rename a damaged state file to `<name>.damaged[.N]` and log why.

    Returns the new path, or None when the file could not be moved (it is
    then left where it is; the caller goes on without its content).
    """
    path = Path(path)
    target = path.with_name(path.name + DAMAGED_SUFFIX)
    number = 1
    while target.exists():
        target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}.{number}")
        number += 1
    try:
        os.rename(path, target)
    except OSError as exc:
        log.error("%s is damaged (%s) and could not be set aside: %s", path, reason, exc)
        return None
    log.error("%s is damaged (%s); set aside as %s", path, reason, target.name)
    return target


def fdatasync_file(path: Path) -> None:
    """fdatasync one file by name; a file already gone is fine (its rows are elsewhere)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def cut_tail(path: Path, tail: int) -> None:
    """Cut the last `tail` bytes off a file (a half-written line); logged if it cannot be."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, os.fstat(fd).st_size - tail)
        finally:
            os.close(fd)
    except OSError as exc:  # the torn line is skipped (last line) or quarantined
        log.error("%s: a half-written line could not be cut off: %s", path, exc)
