"""A record store's write-ahead file: an Arrow IPC stream, appended batch by batch.

The file is what `pyarrow.ipc.open_stream` reads: a schema message, then one message per
batch, no end-of-stream marker (a later flush appends more).  Each message is the IPC
encapsulation (`0xFFFFFFFF`, an int32 metadata length, the metadata, the body).

Writing goes through pyarrow's stream writer with this module's sink under it, so each of
a batch's buffers reaches write(2) as the Arrow buffer it already is.  Serializing a batch
first (`RecordBatch.serialize`) copies it into fresh memory, and on this VM touching fresh
memory costs more than the write: 3 M sim.disks rows (328 MB of IPC) took 0.6-0.8 s to
serialize and write against 0.10-0.16 s written this way (docs/bench/records-ingest.md).

The file only ever holds whole messages: a flush that fails part-way cuts the file back
to the end of the last whole batch, and the batches not written stay queued for the next
flush, which opens the file again and leaves out the schema the file already starts with.
When the cut fails too (`TornWal`), nothing more may go into that file (a batch written
after a torn one could never be read back): the store starts a new one.
"""

from __future__ import annotations

import errno
import os
import struct
from collections import deque

import pyarrow as pa

_PREFIX = 8  # 0xFFFFFFFF and the int32 metadata length


class TornWal(OSError):
    """A flush failed part-way and the torn tail could not be cut off: the file holds its
    whole batches, then the tear; append nothing more to it."""


class _Sink:
    """The stream writer's output: the bytes straight to `fd`, counted.

    `skip_schema`: the file has its schema message already; the writer's first message
    (the schema again) is dropped.  `done`: nothing more reaches `fd` (the end-of-stream
    marker the writer adds at close, and anything after an error or after `fd` is closed).
    """

    closed = False

    def __init__(self, fd: int, skip_schema: bool) -> None:
        self.fd = fd
        self.written = 0
        self.done = False
        self.error: OSError | None = None
        self._prefix: bytearray | None = bytearray() if skip_schema else None
        self._skip = 0  # the schema's metadata bytes still to drop

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.done:
            return size
        view = self._drop_schema(view)
        try:
            while view:
                count = os.write(self.fd, view)
                self.written += count
                view = view[count:]
        except OSError as exc:
            self.error = exc
            self.done = True
            raise
        return size

    def _drop_schema(self, view: memoryview) -> memoryview:
        if self._prefix is not None:
            take = min(_PREFIX - len(self._prefix), len(view))
            self._prefix += view[:take]
            view = view[take:]
            if len(self._prefix) < _PREFIX:
                return view
            self._skip = struct.unpack_from("<i", self._prefix, 4)[0]
            self._prefix = None
        take = min(self._skip, len(view))
        self._skip -= take
        return view[take:]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.done = True

    def tell(self) -> int:
        return self.written


def write_batches(fd: int, schema: pa.Schema, batches: deque[pa.RecordBatch]) -> None:
    """Append the queued batches to the write-ahead file open as `fd` (O_APPEND), each
    leaving the queue once it is written whole.

    On an OSError the file is cut back to its last whole batch and the error is raised;
    the unwritten batches stay queued.  When the cut fails as well, TornWal (with the
    write's errno): replay keeps the whole batches before the tear (and a copy of the file
    in quarantine/ once a newer file exists).
    """
    start = os.fstat(fd).st_size
    sink = _Sink(fd, skip_schema=start > 0)
    whole = start
    try:
        writer = pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema)
        while batches:
            writer.write_batch(batches[0])
            batches.popleft()
            whole = start + sink.written
        sink.done = True
        writer.close()
    except Exception as exc:
        sink.done = True
        if whole != start + sink.written:
            try:
                os.ftruncate(fd, whole)
            except OSError as cut:
                code = getattr(sink.error or exc, "errno", None) or cut.errno or errno.EIO
                raise TornWal(code, f"write-ahead file torn ({sink.error or exc}) and not "
                              f"cut back ({cut})") from exc
        if sink.error is not None:
            raise sink.error from None
        if isinstance(exc, OSError):
            raise
        raise OSError(errno.EIO, f"write-ahead batch not written: {exc}") from exc


def read_batches(data: bytes) -> tuple[list[pa.RecordBatch], str]:
    """The batches of one write-ahead file, and why it ended early ('' when it did not)."""
    if not data:
        return [], ""
    batches: list[pa.RecordBatch] = []
    try:
        reader = pa.ipc.open_stream(data)
        for batch in reader:
            batches.append(batch)
    except (pa.ArrowInvalid, OSError) as exc:
        return batches, str(exc)[:200]
    return batches, ""
