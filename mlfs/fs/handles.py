"""What an open file of the mount holds: its `Handle`, and the portions' shared mappings.

Why a module of its own: the per-open state (an attribute's snapshot, a policy's write
buffer, an events subscriber, the opener's pid and uid) and the per-inode mappings of
open portions decide how much memory and how many descriptors readers can make the daemon
hold; `Operations` (operations.py) only creates, looks up and releases them.  Nothing here
calls pyfuse3.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass, field

from mlfs.core.mount.events import Subscriber

from .nodes import Node

log = logging.getLogger("mlfs.fs")


class PortionMaps:
    """Open portions, one read-only mapping (or one descriptor) per inode, shared by its handles.

    Why a mapping: pyfuse3 replies to a read from whatever buffer the handler
    returns (fuse_reply_buf: the kernel copies it into the mount's page cache).
    A slice of a mapping of the state file saves the pread copy into a fresh
    bytes object on every request; on a cold 282 MiB read that copy was 22%
    of the daemon's time (perf: _copy_to_iter under pread64) and the daemon's
    CPU per byte served fell by about a fifth without it.  Only the kernel
    touches the mapped bytes (get_user_pages while copying the reply), so a
    failing disk read ends as an error to the reader, never as SIGBUS in the
    daemon.  Portions are immutable and only ever unlinked or renamed, which
    leaves a mapping valid.

    Why one per inode, not per open: the file pages counted in the daemon's
    RSS are bounded by the size of the open portions, and the daemon's
    descriptors by their number.  A mapped portion keeps no descriptor at all
    (the mapping holds the file); one that cannot be mapped (empty) keeps one,
    shared.  Before, every open kept a descriptor: one unprivileged user's
    1,008 opens of one portion took the daemon's 1,024, and root's
    `recommend` and the store's own files got EMFILE (red-team pass 2).
    """

    def __init__(self) -> None:
        self._open: dict[int, list] = {}  # inode -> [memoryview | None, fd, open handles]

    def acquire(self, ino: int, path) -> tuple[memoryview | None, int]:
        """(mapping, -1) or (None, descriptor) of the portion; OSError if it cannot be opened."""
        entry = self._open.get(ino)
        if entry is not None:
            entry[2] += 1
            return entry[0], entry[1]
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        view = None
        try:
            if os.fstat(fd).st_size > 0:  # an empty file cannot be mapped; pread serves it
                view = memoryview(mmap.mmap(fd, 0, prot=mmap.PROT_READ))
        except (OSError, ValueError) as exc:
            log.warning("portion inode %d not mapped (%s); serving it with pread", ino, exc)
        if view is not None:
            os.close(fd)
            fd = -1
        self._open[ino] = [view, fd, 1]
        return view, fd

    def release(self, ino: int) -> None:
        entry = self._open.get(ino)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] > 0:
            return
        del self._open[ino]
        view, fd = entry[0], entry[1]
        if fd >= 0:
            os.close(fd)
        if view is not None:
            mapping = view.obj
            try:
                view.release()
                mapping.close()
            except BufferError:
                pass  # a reply still holds a slice: unmapped when the last one goes

    def __len__(self) -> int:
        return len(self._open)


@dataclass
class Handle:
    node: Node
    snapshot: bytes = b""
    fd: int = -1
    #: a slice-able read-only mapping of the portion (shared per inode), or None
    view: memoryview | None = None
    subscriber: Subscriber | None = None
    #: who opened: an events file's parked read watches `pid` and charges `uid`;
    #: the root `control` checks `uid` (pyfuse3's write() has no ctx)
    pid: int = 0
    uid: int = 0
    nonblock: bool = False
    poll_handle: object | None = None
    poll_registered: bool = False
    buffer: bytearray = field(default_factory=bytearray)
    dirty: bool = False
    truncated: bool = False
    committed: bool = False
    #: counted in the opener's `[mount] handles_per_uid` (ReaderAccounts.open_handle)
    charged: bool = False
