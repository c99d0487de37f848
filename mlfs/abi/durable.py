"""Durable files, the one safe way to write and read them, and setting damaged ones aside.

Part of the ABI: a backend keeping originals (the real-knob ledger) writes by these
rules as the daemon and the fleet do (`mlfs.base.durable` offers them to the rest).

Every file mlfs writes where someone else may also write (the state directory,
a shared fleet store, `/etc/systemd/system`, a key directory, the BPF loader
cache) is written one way, `write_durably`:

* relative to an open descriptor of its directory, so a directory renamed or
  swapped for a symbolic link after the check cannot redirect the write;
* under a temporary name nobody can predict (`.<name>.<random>.tmp`, hidden from
  globs and dataset discovery) opened `O_CREAT|O_EXCL|O_NOFOLLOW`: a link
  planted at a predictable name (red-team F11, where root overwrote /etc files
  through `.<host>.json.tmp`) is never followed and never truncated;
* its mode set with `fchmod` on the descriptor, whatever the umask (B2);
* fsync, `renameat` over the old name, fsync of the directory: a crash leaves
  the old or the new content, never a torn one, and a rename the directory has
  not recorded cannot come back as the old name after a power cut.

A symbolic link the writer did not make, at the final name or at a directory
component below the caller's anchor, is refused with `UnsafePath` (one line:
the CLI exits 2 with it, a daemon logs it and skips that write); the installer,
whose files are replaced by design, may ask for a link at the final name to be
replaced instead (U2), never written through.

Readers use `read_bounded` / `open_regular`: `O_NOFOLLOW|O_NONBLOCK`, then fstat
says it is a regular file of at most the caller's bound before a byte is read, so
a FIFO (F9), a device, a link to `/dev/zero` or a 1.5 GB card (F10) costs nothing.

What fails validation when it is read back is never deleted and never stops
a mount: `set_aside` renames it to `<name>.damaged` (numbered when one is
already there) and logs why, so an operator can look at it later.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("mlfs.state")

DAMAGED_SUFFIX = ".damaged"
#: every temporary name ends so (statedir.RESERVED_SUFFIXES, portion globs skip it)
TMP_SUFFIX = ".tmp"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafePath(OSError):
    """A write or read refused because a path component is a symbolic link (or not a
    directory) that the writer did not make; str() is one line naming it."""


class TooLarge(ValueError):
    """A file over the reader's bound (str() says which and how large)."""


class NotRegular(ValueError):
    """A FIFO, device, socket or directory where a regular file was expected."""


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new name) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_dir(anchor: Path, parts: tuple[str, ...] | list[str] = (), *, create: bool = False,
             mode: int | None = None) -> int:
    """A descriptor of `anchor/parts...`, never following a link below `anchor`.

    `anchor` is the caller's choice (an operator's store root, a state directory) and
    is opened as given; each of `parts` is opened `O_NOFOLLOW` relative to the one
    before, so a link planted inside the anchor raises UnsafePath.  `create` makes
    missing directories, with `mode` set explicitly (fchmod: the umask cannot widen
    or narrow it) or the umask's default when `mode` is None.
    """
    fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise UnsafePath(errno.EINVAL, f"{anchor}: {part!r} is not a plain name")
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o700 if mode is not None else 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened below like any other
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if mode is not None:
                    os.fchmod(child, mode)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(errno.ELOOP, f"{anchor}/{'/'.join(parts)}: {part} is a "
                                     "symbolic link or not a directory: refused") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _write_tmp(dir_fd: int, name: str, data: bytes, mode: int) -> str:
    """`data` in a new file of `dir_fd` under an unpredictable hidden name, fsynced."""
    for _ in range(16):
        tmp = f".{name[:200]}.{secrets.token_hex(8)}{TMP_SUFFIX}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:  # 16 collisions of 64 random bits: someone is filling the directory
        raise FileExistsError(errno.EEXIST, f"no free temporary name for {name}")
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    return tmp


def write_at(dir_fd: int, name: str, data: bytes, *, mode: int = 0o644,
             exclusive: bool = False, replace_link: bool = False, where: str = "") -> bool:
    """Write `name` in the open directory `dir_fd` whole (the module's rules).

    `exclusive`: only if `name` does not exist (a hard link of the finished temporary
    file, which fails on any existing entry, a link included); False when it existed.
    `replace_link`: a link at `name` is replaced by the file (the installer) rather
    than refused.  `where` names the directory in errors.
    """
    if "/" in name or name in ("", ".", ".."):
        raise UnsafePath(errno.EINVAL, f"{where}: {name!r} is not a plain name")
    if not exclusive and not replace_link and _is_link(dir_fd, name):
        raise UnsafePath(errno.ELOOP, f"{where}/{name} is a symbolic link: refused "
                         "(remove it if it is not an attack)")
    tmp = _write_tmp(dir_fd, name, data, mode)
    try:
        if exclusive:
            try:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp, dir_fd=dir_fd)
        else:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    os.fsync(dir_fd)
    return True


def write_durably(path: Path, data: bytes, *, mode: int = 0o644, anchor: Path | None = None,
                  replace_link: bool = False, make_dirs: bool = False,
                  dir_mode: int | None = None, exclusive: bool = False) -> bool:
    """Replace `path` with `data` the one safe way (the module's docstring).

    `anchor`: a directory above `path` trusted as given; the components between it
    and `path` are walked without following links (default: `path`'s own directory
    is the anchor).  `make_dirs` creates them (mode `dir_mode`, explicit, or the
    umask's).  Returns False only for `exclusive` when `path` already existed.
    """
    path = Path(path)
    anchor = path.parent if anchor is None else Path(anchor)
    parts = path.parent.relative_to(anchor).parts
    dir_fd = open_dir(anchor, parts, create=make_dirs, mode=dir_mode)
    try:
        return write_at(dir_fd, path.name, data, mode=mode, exclusive=exclusive,
                        replace_link=replace_link, where=str(path.parent))
    finally:
        os.close(dir_fd)


def open_regular_at(dir_fd: int | None, name: str | Path, limit: int | None = None) -> int:
    """A descriptor of the regular file `name` (relative to `dir_fd`, or a path), opened
    O_NOFOLLOW|O_NONBLOCK; UnsafePath for a link, NotRegular for anything else that is
    not a regular file, TooLarge past `limit` bytes."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(errno.ELOOP, f"{name} is a symbolic link: refused") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(f"{name} is not a regular file")
        if limit is not None and info.st_size > limit:
            raise TooLarge(f"{name}: {info.st_size} bytes, over {limit}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: Path | str, limit: int, *, dir_fd: int | None = None) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (checked before and,
    for a file growing meanwhile, while reading)."""
    fd = open_regular_at(dir_fd, path, limit)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{path}: over {limit} bytes")
    return data


@contextmanager
def open_regular(path: Path | str, *, dir_fd: int | None = None,
                 limit: int | None = None) -> Iterator[BinaryIO]:
    """A regular file opened for reading the safe way (`open_regular_at`)."""
    with os.fdopen(open_regular_at(dir_fd, path, limit), "rb") as fh:
        yield fh


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
