"""A fleet store: an fsspec file system and its root, where every host ships its portions.

A directory store (`file://` or a plain path) writes each object whole (a tmp
name, fsync, rename); on an object store readers rely on the manifests
(mlfs/fleet/manifest.py).  Push, pull, train, report and status all reach the
store through `Store`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mlfs.core.durable import write_durably


class StoreUnavailable(Exception):
    """A write to the store failed (str() says which object and why)."""



class Store:
    """An fsspec file system and the store's root path in it."""

    def __init__(self, url: str) -> None:
        from fsspec.core import url_to_fs

        self.url = url
        self.fs, self.root = url_to_fs(url)
        self.local = "file" in _protocols(self.fs)
        #: objects appear whole (tmp name + rename); elsewhere readers need the
        #: manifests (mlfs/fleet/manifest.py)
        self.atomic = self.local

    def path(self, relative: str) -> str:
        return f"{self.root.rstrip('/')}/{relative}"

    def put(self, relative: str, data: bytes) -> None:
        """Write one object, atomically (a directory store: tmp name, fsync, rename)."""
        target = self.path(relative)
        try:
            if self.local:
                _put_local(Path(target), data)
            else:
                self.fs.pipe_file(target, data)
        except Exception as exc:  # noqa: BLE001  (fsspec back ends raise their own types)
            raise StoreUnavailable(f"{self.url}: cannot write {relative}: "
                                   f"{type(exc).__name__}: {exc}") from exc


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _put_local(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    write_durably(target, data, tmp=target.with_name(f".{target.name}.tmp"))


def store_key(url: str) -> str:
    """A file-name-safe key for one store URL (one cursor per store)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]
