"""The fleet store as a contract: where every host ships its portions and finds policies.

`Store` is the whole surface push, pull, train, report and status use: keys are
relative, `/`-separated paths (mlfs/fleet/layout.py names them) and no caller
ever holds a file system object.  Three implementations, chosen by the URL's
scheme in `STORES` (a plain path is a directory):

* `DirectoryStore` (`file://` or a path): a shared or local directory.  Writes
  go through `mlfs.base.durable.write_durably` (an unpredictable temporary name,
  `O_EXCL|O_NOFOLLOW`, rename, fsync, every component below the root walked
  without following links), so a store writer can never make a pusher or a
  trainer (root) write outside the store (red-team F11).  Objects appear whole,
  so `atomic` is True; `put_if_absent` is a hard link of the finished file,
  which fails on any existing name.
* `S3Store` (`s3://`, s3fs): a PUT is whole by itself but a listing may show
  objects a killed pusher never finished naming in its manifest, so `atomic`
  is False (readers go by manifests, mlfs/fleet/manifest.py); `put_if_absent` is
  S3's conditional write (`If-None-Match: *`).
* `FsspecStore` (any other fsspec URL: `gcs://`, `ssh://`, ...): whole writes
  are not promised and no conditional write is known, so `put_if_absent` is
  refused with `Unsupported`, and with it the host claim (host.py).
  `MemoryStore` (`memory://`, one process's) adds a lock and so a conditional
  write.

Readers are bounded: `get` checks the object's size and that it is a regular
file before a byte is read (F9: a FIFO; F10: a 1.5 GB card), and `list` refuses
a listing past `MAX_LIST` keys instead of growing without end.

tests/unit/test_store_contract.py is the conformance suite every registered
store passes (S3 against a moto server); a new store is one class here, one
entry in `STORES` and a parameter there.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import posixpath
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO, ClassVar
from urllib.parse import urlsplit

from mlfs.base.durable import (
    NotRegular,
    TooLarge,
    UnsafePath,
    open_dir,
    open_regular_at,
    write_at,
)

log = logging.getLogger("mlfs.fleet")

#: the largest object `get` reads unless the caller bounds it tighter (a portion is a few
#: MiB; a policy is bounded by the verifier's 16 MiB)
MAX_GET = 64 << 20
#: the most keys one `list` returns: a store holding more under one prefix is refused
#: (a reader that wants them all is reading the wrong prefix)
MAX_LIST = 1_000_000


class StoreUnavailable(Exception):
    """A store operation failed (str() says which object and why, on one line)."""


class Unsupported(StoreUnavailable):
    """The store cannot do what was asked (a conditional write on a generic fsspec store)."""


def _key(key: str) -> str:
    """`key` checked: relative, no empty, `.` or `..` component (UnsafePath otherwise)."""
    parts = key.split("/")
    if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(errno.EINVAL, f"{key!r} is not a store key")
    return key


def _prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    return _key(prefix) if prefix else ""


class Store(ABC):
    """A fleet store (the module's docstring).  `Store(url)` returns the implementation
    `STORES` maps the URL's scheme to, as `pathlib.Path()` returns a PosixPath."""

    #: objects appear whole at their final key, so a listing is the truth
    atomic: ClassVar[bool] = False
    #: `put_if_absent` is one atomic operation here
    conditional: ClassVar[bool] = False

    def __new__(cls, url: str):
        if cls is Store:
            cls = store_class(url)
        return super().__new__(cls)

    def __init__(self, url: str) -> None:
        self.url = url

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write one object whole, replacing any; StoreUnavailable if it cannot be."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write one object only if no object has `key`: True if written, False if one
        was there.  Unsupported where the store cannot do it atomically."""

    @abstractmethod
    def get(self, key: str, limit: int = MAX_GET) -> bytes:
        """The object's bytes.  FileNotFoundError when absent; TooLarge past `limit`
        and NotRegular for a non-object (a FIFO, a directory) before reading."""

    @abstractmethod
    def open(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A context manager giving the object as a seekable binary file (Parquet's
        footer is read first), checked as `get` checks."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every object's key under `prefix` (a directory-like prefix), sorted; hidden
        names (a writer's temporary ones) are never listed.  TooLarge past MAX_LIST."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """An object has `key`."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove one object; FileNotFoundError when absent."""

    def _failed(self, what: str, key: str, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"{self.url}: cannot {what} {key}: {type(exc).__name__}: "
                                f"{str(exc)[:200]}")


def _visible(key: str) -> bool:
    return not any(part.startswith(".") for part in key.split("/"))


# ---- a directory -----------------------------------------------------------------------
class DirectoryStore(Store):
    """A directory (local or a shared file system): the module's docstring."""

    atomic = True
    conditional = True

    def __init__(self, url: str) -> None:
        super().__init__(url)
        path = url[len("file://"):] if url.startswith("file://") else url
        #: the operator's choice, trusted as given; nothing below it is followed
        self.root = Path(path)

    def _where(self, key: str) -> str:
        return posixpath.join(str(self.root), posixpath.dirname(key))

    @contextmanager
    def _dir(self, key: str, create: bool = False) -> Iterator[tuple[int, str]]:
        parts = _key(key).split("/")
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = open_dir(self.root, parts[:-1], create=create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        try:
            with self._dir(key, create=True) as (fd, name):
                write_at(fd, name, data, where=self._where(key))
        except OSError as exc:
            raise self._failed("write", key, exc) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            with self._dir(key, create=True) as (fd, name):
                return write_at(fd, name, data, exclusive=True,
                                where=self._where(key))
        except OSError as exc:
            raise self._failed("write", key, exc) from exc

    def get(self, key: str, limit: int = MAX_GET) -> bytes:
        with self.open(key, limit) as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise TooLarge(f"{key}: over {limit} bytes")
        return data

    @contextmanager
    def open(self, key: str, limit: int | None = None) -> Iterator[BinaryIO]:
        with self._dir(key) as (fd, name):
            handle = os.fdopen(open_regular_at(fd, name, limit), "rb")
        with handle:
            yield handle

    def list(self, prefix: str = "") -> list[str]:
        prefix = _prefix(prefix)
        try:
            top = open_dir(self.root, prefix.split("/") if prefix else [])
        except (FileNotFoundError, NotADirectoryError):
            return []
        except UnsafePath as exc:  # a link planted for a directory: it holds nothing
            log.error("%s: %s", self.url, exc)
            return []
        out: list[str] = []
        try:
            # fwalk never follows a link: a link planted in the store lists nothing past it
            for where, dirs, files, _ in os.fwalk(".", dir_fd=top):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                base = posixpath.normpath(posixpath.join(prefix, where)) if prefix else \
                    posixpath.normpath(where)
                for name in files:
                    if not name.startswith("."):
                        out.append(name if base == "." else f"{base}/{name}")
                if len(out) > MAX_LIST:
                    raise TooLarge(f"{self.url}/{prefix}: over {MAX_LIST} objects")
        finally:
            os.close(top)
        return sorted(out)

    def exists(self, key: str) -> bool:
        try:
            with self._dir(key) as (fd, name):
                os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError, UnsafePath):
            return False
        return True

    def delete(self, key: str) -> None:
        with self._dir(key) as (fd, name):
            os.unlink(name, dir_fd=fd)
            os.fsync(fd)


# ---- fsspec ----------------------------------------------------------------------------
class FsspecStore(Store):
    """Any fsspec file system (the module's docstring): no whole-write promise, no
    conditional write."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        from fsspec.core import url_to_fs

        try:
            # a fresh file system object per store: fsspec's instance cache would hand a
            # later store the client an earlier one made, with the endpoint and
            # credentials of then (a test's second S3 endpoint reached the first, gone)
            self._fs, root = url_to_fs(url, skip_instance_cache=True)
        except ImportError as exc:  # fsspec names the package to install
            raise StoreUnavailable(f"{url}: {exc}") from None
        self._root = root.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self._root}/{_key(key)}" if self._root else _key(key)

    def put(self, key: str, data: bytes) -> None:
        try:
            self._fs.pipe_file(self._path(key), data)
        except Exception as exc:  # noqa: BLE001  (fsspec back ends raise their own types)
            raise self._failed("write", key, exc) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        raise Unsupported(f"{self.url}: this store has no conditional write (put if "
                          "absent); use a directory or an s3:// store")

    def _checked(self, key: str, limit: int | None) -> str:
        path = self._path(key)
        info = self._fs.info(path)  # FileNotFoundError when absent
        if info.get("type") != "file":
            raise NotRegular(f"{key} is not an object")
        if limit is not None and (info.get("size") or 0) > limit:
            raise TooLarge(f"{key}: {info.get('size')} bytes, over {limit}")
        return path

    def get(self, key: str, limit: int = MAX_GET) -> bytes:
        data = self._fs.cat_file(self._checked(key, limit))
        if len(data) > limit:  # grew after info
            raise TooLarge(f"{key}: over {limit} bytes")
        return data

    @contextmanager
    def open(self, key: str, limit: int | None = None) -> Iterator[BinaryIO]:
        with self._fs.open(self._checked(key, limit), "rb") as handle:
            yield handle

    def list(self, prefix: str = "") -> list[str]:
        prefix = _prefix(prefix)
        where = self._path(prefix) if prefix else self._root
        try:
            found = self._fs.find(where, withdirs=False)
        except FileNotFoundError:
            return []
        if len(found) > MAX_LIST:
            raise TooLarge(f"{self.url}/{prefix}: over {MAX_LIST} objects")
        keys = (_relative(p, self._root) for p in found)
        return sorted(k for k in keys if k and _visible(k))

    def exists(self, key: str) -> bool:
        try:
            return self._fs.isfile(self._path(key))
        except FileNotFoundError:
            return False

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not self._fs.isfile(path):
            raise FileNotFoundError(errno.ENOENT, f"{key}: no such object")
        self._fs.rm_file(path)


def _relative(path: str, root: str) -> str:
    path, root = path.lstrip("/"), root.strip("/")
    if not root:
        return path
    return path[len(root) + 1:] if path.startswith(root + "/") else ""


class S3Store(FsspecStore):
    """S3 through s3fs: `put_if_absent` is a conditional PUT (`If-None-Match: *`), which
    S3 (since 2024), MinIO and moto's server honour; a store that answers it with
    anything but 412 makes the claim fail loudly, never silently overwrite."""

    conditional = True

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self._fs.pipe_file(self._path(key), data, mode="create")
        except FileExistsError:
            return False
        except OSError as exc:
            if "PreconditionFailed" in str(exc) or "412" in str(exc):
                return False
            raise self._failed("write", key, exc) from exc
        except Exception as exc:  # noqa: BLE001  (botocore's own types)
            raise self._failed("write", key, exc) from exc
        return True


class MemoryStore(FsspecStore):
    """fsspec's `memory://`, one process's dict: a lock makes `put_if_absent` atomic
    there, which no lock can do for a store other processes write too (tests, demos)."""

    conditional = True
    _lock = threading.Lock()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self._lock:
            if self._fs.exists(self._path(key)):
                return False
            self.put(key, data)
        return True


#: the implementation per URL scheme; every other scheme fsspec knows is a FsspecStore
STORES: dict[str, type[Store]] = {
    "": DirectoryStore,
    "file": DirectoryStore,
    "s3": S3Store,
    "s3a": S3Store,
    "memory": MemoryStore,
}


def store_class(url: str) -> type[Store]:
    """The class `STORES` maps `url`'s scheme to (FsspecStore for the others)."""
    scheme = urlsplit(url).scheme if "://" in url else ""
    return STORES.get(scheme, FsspecStore)


def store_key(url: str) -> str:
    """A file-name-safe key for one store URL (one cursor per store)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]
