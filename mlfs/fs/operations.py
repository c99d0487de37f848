"""pyfuse3 Operations: translate FUSE requests to the node tree and the core.

Handlers are thin: reads come from the tree's read-only views, and every write
(a file's content, mkdir, rmdir) is one call into `mlfs.core.mount.control`, whose
`Refused` becomes the writer's errno.  Every handler goes through `_guard`, so
an unexpected exception is logged and answered with EIO instead of ending
`pyfuse3.main` for the whole mount (docs/fuse-notes.md: traps).  What an open file
holds (its handle, a portion's shared mapping) is in handles.py.
"""

from __future__ import annotations

import errno
import functools
import inspect
import itertools
import logging
import os
import select
import time

import pyfuse3
import trio

from mlfs.base.errors import Refused
from mlfs.core.mount.control import Control
from mlfs.core.mount.histogram import Histogram

from .handles import Handle, PortionMaps
from .nodes import (
    Attr,
    Dir,
    EventsFile,
    ModelsDir,
    Node,
    PortionFile,
    RootDir,
    SubsystemDir,
    Tree,
)
from .parking import Parking

log = logging.getLogger("mlfs.fs")

MAX_BUFFERED_WRITE = 16 << 20
REFUSAL_LOG_SECONDS = 60.0


def _guard(handler):
    """Log unexpected exceptions and answer EIO; let FUSEError through."""

    name = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return await handler(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Refused as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EINVAL) from None
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except BaseException:
            log.exception("unexpected error in %s", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            histogram = self.latency.get(name)
            if histogram is None:
                histogram = self.latency[name] = Histogram()
            histogram.observe(time.perf_counter() - started)

    return wrapper


async def _call(write, *args) -> None:
    """A node's write: the core's call, awaited when it is a coroutine."""
    result = write(*args)
    if inspect.isawaitable(result):
        await result


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, control: Control, *, version_text: str, metrics, gid: int = 0,
                 backends_text: str = "") -> None:
        super().__init__()
        #: where every write goes; the exchange is read (readers' accounts, events)
        self.control = control
        self.exchange = control.exchange
        self.gid = gid
        self.tree = Tree(control, version_text, metrics, group_writable=gid != 0,
                         backends_text=backends_text)
        self._handles: dict[int, Handle] = {}
        self._next_fh = itertools.count(1)
        self.stopping = False
        self.portion_maps = PortionMaps()
        self.parking = Parking(self.exchange.readers)
        self._refusal_logged = -REFUSAL_LOG_SECONDS
        #: how long each kind of FUSE request took to answer (mlfs_fuse_operation_seconds)
        self.latency: dict[str, Histogram] = {}

    # ---- attributes ----------------------------------------------------------
    def _node(self, inode: int) -> Node:
        node = self.tree.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = node.ino
        entry.generation = 0
        entry.entry_timeout = node.entry_timeout
        entry.attr_timeout = node.attr_timeout
        entry.st_mode = node.mode()
        entry.st_nlink = 2 if isinstance(node, Dir) else 1
        entry.st_uid = 0
        entry.st_gid = self.gid
        entry.st_rdev = 0
        entry.st_size = node.size()
        entry.st_blksize = 1 << 20
        entry.st_blocks = (entry.st_size + 511) // 512
        mtime = node.mtime_ns()
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = mtime
        return entry

    @_guard
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self._node(parent_inode)
        if not isinstance(parent, Dir):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        text = os.fsdecode(name)
        if text == ".":
            return self._attrs(parent)
        if text == "..":
            return self._attrs(parent.parent or parent)
        node = parent.lookup(text)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(node)

    @_guard
    async def getattr(self, inode, ctx=None):
        return self._attrs(self._node(inode))

    @_guard
    async def setattr(self, inode, attr, fields, fh, ctx):
        node = self._node(inode)
        if fields.update_size and isinstance(node, Attr) and node.write:
            return self._attrs(node)  # `truncate`/O_TRUNC on an attribute: ignored
        raise pyfuse3.FUSEError(errno.EPERM)

    @_guard
    async def forget(self, inode_list):
        for inode, _ in inode_list:
            self.tree.forget(inode)

    # ---- directories ---------------------------------------------------------
    @_guard
    async def opendir(self, inode, ctx):
        node = self._node(inode)
        if not isinstance(node, Dir):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    @_guard
    async def readdir(self, fh, start_id, token):
        node = self._node(fh)
        # the offset of an entry is its inode number (never reused, rising with
        # creation): an entry removed between two readdir calls of one listing
        # (rmdir, retention, discard) must not shift the others and skip them
        entries = sorted(node.children().values(), key=lambda child: child.ino)
        for child in entries:
            if child.ino <= start_id:
                continue
            if not pyfuse3.readdir_reply(token, os.fsencode(child.name), self._attrs(child),
                                         child.ino):
                break

    @_guard
    async def releasedir(self, fh):
        return None

    @_guard
    async def mkdir(self, parent_inode, name, mode, ctx):
        parent = self._node(parent_inode)
        if isinstance(parent, RootDir):
            text = os.fsdecode(name)
            await self.control.mkdir_subsystem(text, ctx.uid)
            node = parent.lookup(text)
            if node is None:  # unloaded again before this reply
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attrs(node)
        if not isinstance(parent, ModelsDir):
            raise pyfuse3.FUSEError(errno.EPERM)
        self.control.create_model(parent.runtime, os.fsdecode(name))
        return self._attrs(parent.children()[os.fsdecode(name)])

    @_guard
    async def rmdir(self, parent_inode, name, ctx):
        parent = self._node(parent_inode)
        text = os.fsdecode(name)
        if isinstance(parent, RootDir) and isinstance(parent.lookup(text), SubsystemDir):
            await self.control.rmdir_subsystem(text, ctx.uid)
            return
        if not isinstance(parent, ModelsDir):
            if isinstance(parent, Dir) and parent.lookup(text) is not None:
                raise pyfuse3.FUSEError(errno.EPERM)
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.control.destroy_model(parent.runtime, text)

    @_guard
    async def create(self, parent_inode, name, mode, flags, ctx):
        raise pyfuse3.FUSEError(errno.EACCES)

    @_guard
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise pyfuse3.FUSEError(errno.EACCES)

    @_guard
    async def unlink(self, parent_inode, name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    @_guard
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    @_guard
    async def statfs(self, ctx):
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_namemax = 255
        return data

    # ---- files ---------------------------------------------------------------
    def _new_handle(self, handle: Handle) -> int:
        fh = next(self._next_fh)
        self._handles[fh] = handle
        return fh

    def _reads_private(self, ctx) -> bool:
        """Whether the caller may read private (0440, group `self.gid`) files: root, or a
        member of the mount's group (its primary or a supplementary group)."""
        if ctx.uid == 0 or (self.gid != 0 and ctx.gid == self.gid):
            return True
        if self.gid == 0:
            return False
        try:
            with open(f"/proc/{ctx.pid}/status") as fh:
                for line in fh:
                    if line.startswith("Groups:"):
                        return str(self.gid) in line.split()[1:]
        except OSError:
            pass
        return False

    @_guard
    async def open(self, inode, flags, ctx):
        node = self._node(inode)
        access = flags & os.O_ACCMODE
        wants_write = access in (os.O_WRONLY, os.O_RDWR)
        wants_read = access in (os.O_RDONLY, os.O_RDWR)
        if isinstance(node, Dir):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if isinstance(node, PortionFile):
            if wants_write:
                raise pyfuse3.FUSEError(errno.EACCES)
            self._charge(self.exchange.readers.open_handle, ctx.uid)
            try:
                view, fd = self.portion_maps.acquire(inode, node.portion.path)
            except OSError as exc:
                self.exchange.readers.close_handle(ctx.uid)
                if isinstance(exc, FileNotFoundError):
                    raise pyfuse3.FUSEError(errno.ENOENT) from None
                log.warning("portion %s not opened: %s", node.portion.path, exc)
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            fh = self._new_handle(Handle(node, fd=fd, view=view, uid=ctx.uid, charged=True))
            return pyfuse3.FileInfo(fh=fh, direct_io=False, keep_cache=True)
        if isinstance(node, EventsFile):
            if wants_write:
                raise pyfuse3.FUSEError(errno.EACCES)
            self._charge(self.exchange.readers.open_stream, ctx.uid)
            handle = Handle(node, pid=ctx.pid, uid=ctx.uid,
                            nonblock=bool(flags & os.O_NONBLOCK))
            handle.subscriber = self.exchange.bus.subscribe(
                node.subsystem, private_ok=self._reads_private(ctx))
            fh = self._new_handle(handle)
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        assert isinstance(node, Attr)
        if (wants_write and node.write is None) or (wants_read and node.read is None):
            raise pyfuse3.FUSEError(errno.EACCES)
        self._charge(self.exchange.readers.open_handle, ctx.uid)
        handle = Handle(node, truncated=bool(flags & os.O_TRUNC), uid=ctx.uid, charged=True)
        try:
            if wants_read:
                content = node.read()
                handle.snapshot = content.encode() if isinstance(content, str) else bytes(content)
        except BaseException:
            self.exchange.readers.close_handle(ctx.uid)
            raise
        fh = self._new_handle(handle)
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    def _charge(self, open_one, uid: int) -> None:
        """Count an open against the readers' limits (`ReaderAccounts.open_handle` or
        `open_stream`); a refusal is logged (at most once a minute) and raised."""
        try:
            open_one(uid)
        except Refused as exc:
            self._log_refusal(exc)
            raise

    def _log_refusal(self, exc: Refused) -> None:
        """One warning per minute at most: a refused reader may retry in a loop."""
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_SECONDS:
            readers = self.exchange.readers
            log.warning("open or read refused: %s: %s (%d refusals so far)",
                        errno.errorcode.get(exc.errno, exc.errno), exc.reason,
                        readers.refused_opens + readers.refused_reads
                        + readers.refused_handles)
            self._refusal_logged = now

    def _notify_poller(self, handle: Handle) -> None:
        handle.poll_registered = False
        poll_handle, handle.poll_handle = handle.poll_handle, None
        if poll_handle is not None:
            try:
                poll_handle.notify()
            except Exception:
                log.exception("poll notify failed")

    @_guard
    async def read(self, fh, off, size):
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if handle.view is not None:
            # no await between here and pyfuse3's reply: the slice is used at once
            return handle.view[off:off + size]
        if handle.fd >= 0:
            return os.pread(handle.fd, size, off)
        if handle.subscriber is not None:
            return await self._read_events(handle, size)
        return handle.snapshot[off:off + size]

    async def _read_events(self, handle: Handle, size: int) -> bytes:
        sub = handle.subscriber
        if not sub.ready():
            if handle.nonblock:
                raise pyfuse3.FUSEError(errno.EAGAIN)
            try:
                await self.parking.wait(sub, handle.pid, handle.uid)
            except Refused as exc:
                if exc.errno == errno.EAGAIN:
                    self._log_refusal(exc)
                raise
        if not sub.has_data():  # closed: shutdown
            return b""
        return sub.take(size)

    @_guard
    async def poll(self, inode, fh, poll_handle, ctx):
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if handle.subscriber is None:
            return select.POLLIN | select.POLLOUT | select.POLLRDNORM
        sub = handle.subscriber
        if sub.ready():
            return select.POLLIN | select.POLLRDNORM
        if poll_handle is not None:  # polling holds no task: no limit applies
            handle.poll_handle = poll_handle
            if not handle.poll_registered:  # once, however often it is polled
                handle.poll_registered = True
                sub.wait_with(functools.partial(self._notify_poller, handle))
        return 0

    @_guard
    async def write(self, fh, off, buf):
        handle = self._handles.get(fh)
        if handle is None or not isinstance(handle.node, Attr) or handle.node.write is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        node = handle.node
        if not node.alive():  # opened before its model's rmdir: gone, as in sysfs
            raise pyfuse3.FUSEError(errno.ENODEV)
        if node.buffered:  # policy: a whole file over several writes, committed on close
            end = off + len(buf)
            if end > MAX_BUFFERED_WRITE:
                if node.refused is not None:  # an `errors` line, as for the core's refusals
                    node.refused(errno.EFBIG, f"over {MAX_BUFFERED_WRITE} bytes", bytes(buf[:200]))
                handle.buffer.clear()  # nothing of an oversized upload is committed at close
                handle.dirty = False
                raise pyfuse3.FUSEError(errno.EFBIG)
            if len(handle.buffer) < end:
                handle.buffer.extend(b"\0" * (end - len(handle.buffer)))
            handle.buffer[off:end] = buf
            handle.dirty = True
            return len(buf)
        await _call(node.write, bytes(buf), *((handle.uid,) if node.caller else ()))
        return len(buf)

    async def _commit(self, handle: Handle) -> None:
        """Commit what was written through the handle, if anything since the last commit.

        FLUSH comes at every close(2) of a descriptor of the open file, also a
        child's (exec closing an inherited O_CLOEXEC copy, a child exiting), so
        a commit can come before the opener has written everything.  Writes after
        a commit therefore make the handle dirty again and the next flush (the
        opener's close) or the release commits the whole buffer again: nothing
        written is silently dropped (a red-team upload that ran a subprocess
        mid-way got 0 from every write and from close, and no policy).
        """
        node = handle.node
        if not isinstance(node, Attr) or not node.buffered or not handle.dirty:
            return
        if not node.alive():
            raise pyfuse3.FUSEError(errno.ENODEV)
        handle.dirty = False
        handle.committed = True
        await _call(node.write, bytes(handle.buffer))

    @_guard
    async def flush(self, fh):
        handle = self._handles.get(fh)
        if handle is not None and handle.dirty:
            await self._commit(handle)

    @_guard
    async def release(self, fh):
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        if isinstance(handle.node, PortionFile):
            handle.view = None
            self.portion_maps.release(handle.node.ino)  # closes the shared fd or mapping
        if handle.charged:
            self.exchange.readers.close_handle(handle.uid)
        if handle.subscriber is not None:
            handle.subscriber.unsubscribe()
            handle.poll_handle = None
            self.exchange.readers.close_stream(handle.uid)
        node = handle.node
        if isinstance(node, Attr) and node.buffered and node.alive():
            try:
                if handle.dirty:
                    await self._commit(handle)
                elif handle.truncated and not handle.committed:
                    await _call(node.write, b"")  # `: > policy` removes it
            except Refused:
                pass  # already recorded in errors; close(2) errors are ignored anyway

    @_guard
    async def fsync(self, fh, datasync):
        return None

    @_guard
    async def access(self, inode, mode, ctx):
        return True

    def stop(self) -> None:
        """Shutdown: wake every blocked reader so it answers end of file."""
        self.stopping = True
        self.parking.stop()
        self.exchange.bus.close()
