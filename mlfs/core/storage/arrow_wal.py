"""A record store's write-ahead file: Arrow IPC messages in checksummed frames.

The on-disk format of the Arrow codec (arrow_codec.py) of the write-ahead engine (wal.py).

Layout (all integers little-endian):

    file header  FILE_MAGIC, first_seq u64, acked_end u64, acked_next u64, crc32 u32, 0 u32
    frame        FRAME_MAGIC, length u64, first_seq u64, rows u64, crc32(payload) u32,
                 crc32(the header before it) u32, then `length` bytes of payload
    payload      one Arrow IPC message: the schema (first frame, rows 0), then one per batch

Why frames: a plain IPC stream has no checksum and no way back in after a damaged
message, so one bad byte in the middle of the newest file used to cost every batch after
it (redteam3 W3).  A frame's header says how long it is and is checked on its own, its
payload is checked against its CRC, and a reader that meets a bad frame scans for the
next FRAME_MAGIC whose header checks out: every intact batch is read back.

Why the ack mark (`acked_end`, `acked_next` in the file header): a crash (SIGKILL, not a
power cut: the file is never fsynced, as the tick stores' are not) can only tear the
frames of the flush it interrupts, and those were never acknowledged: the flush had not
returned.  After every flush whose writes all returned, the writer rewrites the mark with
one pwrite(2): the end of its last frame and one past its last record_seq.  So a reader
tells the two apart: a frame that ends past the file's end and starts at or after
`acked_end` is a torn write nobody was told of, dropped quietly; anything missing or
damaged below `acked_end` (or below `acked_next` in record_seq) was acknowledged and is
damage: counted, kept aside, logged.  A file is created whole with its header (a
temporary name, then rename), so an empty or header-less file is damage too.

Writing goes through pyarrow's stream writer with this module's sink under it, so each of
a batch's buffers reaches write(2) as the Arrow buffer it already is.  Serializing a batch
first (`RecordBatch.serialize`) copies it into fresh memory, and on this VM touching fresh
memory costs more than the write: 3 M sim.disks rows (328 MB of IPC) took 0.6-0.8 s to
serialize and write against 0.10-0.16 s written this way (docs/results/records-ingest.md).
The sink holds a message's buffers until it ends, checksums them (zlib.crc32 over the
same memory, no copy), then writes the frame header and the buffers.  The checksum is
what frames cost: one flush of those 3 M rows took 0.29 s against 0.13 s unframed
(median of 5 on this VM, zlib.crc32 at about 2 GB/s), and replaying them 0.42 s against
0.50 s (a frame's message is decoded where it lies, no stream reader copying it).

The file only ever holds whole frames below its ack mark: a flush that fails part-way
cuts the file back to the end of the last whole frame, and the batches not written stay
queued for the next flush.  When the cut fails too (`TornWal`), nothing more may go into
that file (a frame written after a torn one would sit beyond a tear): the engine starts a
new one.

Files written before frames (state format 3 up to this change) are plain IPC streams
beginning with the IPC continuation marker; `read_wal` still reads them (`legacy`),
resynchronising at the next marker after a damaged message.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import zlib
from collections import deque
from dataclasses import dataclass, field

import pyarrow as pa

from .wal import TornWal

__all__ = ["FILE_HEADER", "Frame", "TornWal", "WalScan", "file_header", "read_wal",
           "wal_first_seq", "write_batches"]

FILE_MAGIC = b"MLFSRWA\x01"
FRAME_MAGIC = b"MLFSFRM\x01"
_FILE = struct.Struct("<8sQQQII")
_ACK = struct.Struct("<QQI")  # acked_end, acked_next, crc32 of the header before it
_ACK_AT = 16
_FRAME = struct.Struct("<8sQQQII")
FILE_HEADER = _FILE.size
FRAME_HEADER = _FRAME.size
_CONTINUATION = b"\xff\xff\xff\xff"
_PREFIX = 8  # an IPC message's 0xFFFFFFFF and int32 metadata length
#: an IPC message's metadata is a few hundred bytes; a larger length is damage
_MAX_METADATA = 1 << 20
#: the sink copies chunks smaller than this (padding, metadata) rather than hold them
_SMALL = 4096


def file_header(first_seq: int) -> bytes:
    """A new write-ahead file's header: nothing acknowledged yet."""
    return _header(first_seq, FILE_HEADER, first_seq)


def wal_first_seq(data: bytes) -> int:
    """The first record_seq a write-ahead file's header names (OSError: no header)."""
    if len(data) < FILE_HEADER or not data.startswith(FILE_MAGIC):
        raise OSError(errno.EIO, "write-ahead file has no header")
    return struct.unpack_from("<Q", data, 8)[0]


def _header(first_seq: int, acked_end: int, acked_next: int) -> bytes:
    body = struct.pack("<8sQQQ", FILE_MAGIC, first_seq, acked_end, acked_next)
    return body + struct.pack("<II", zlib.crc32(body), 0)


def _frame_header(payload_len: int, first_seq: int, rows: int, crc: int) -> bytes:
    head = struct.pack("<8sQQQI", FRAME_MAGIC, payload_len, first_seq, rows, crc)
    return head + struct.pack("<I", zlib.crc32(head))


class _Sink:
    """The stream writer's output, one IPC message at a time.

    The writer's first message (the schema, which the file holds already) is dropped;
    the chunks of each later message are kept until `frame()` checksums them and writes
    them to `fd` behind their frame header.  `done`: nothing more is taken (the
    end-of-stream marker the writer adds at close).
    """

    closed = False

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0
        self.done = False
        self.error: OSError | None = None
        self.chunks: list[memoryview | bytes] = []
        self._prefix: bytearray | None = bytearray()
        self._skip = 0  # the schema's metadata bytes still to drop

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.done:
            return size
        view = self._drop_schema(view)
        if view:
            self.chunks.append(bytes(view) if len(view) < _SMALL else view)
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

    def frame(self, first_seq: int, rows: int) -> None:
        """Write the message held so far as one frame."""
        chunks, self.chunks = self.chunks, []
        crc = 0
        length = 0
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)
            length += len(chunk)
        self._write(_frame_header(length, first_seq, rows, crc))
        for chunk in chunks:
            self._write(chunk)

    def _write(self, data) -> None:
        view = memoryview(data).cast("B")
        try:
            while view:
                count = os.write(self.fd, view)
                self.written += count
                view = view[count:]
        except OSError as exc:
            self.error = exc
            self.done = True
            raise

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.done = True

    def tell(self) -> int:
        return self.written


def write_batches(fd: int, schema: pa.Schema, batches: deque[pa.RecordBatch],
                  first_seq: int) -> None:
    """Append the queued batches to the write-ahead file open as `fd`, one frame each,
    each leaving the queue once it is written whole; then move the ack mark past them.

    The file must exist with its header (`file_header(first_seq)`); one holding only
    that gets the schema frame first.  `fd` may be O_APPEND: the flag is cleared here,
    because Linux's pwrite(2) on an O_APPEND descriptor appends instead of rewriting
    the mark.

    On an OSError the file is cut back to its last whole frame and the error is raised;
    the unwritten batches stay queued.  When the cut fails as well, TornWal (with the
    write's errno): the frames below the mark are whole, the tear lies beyond it.
    """
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_APPEND:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    start = os.lseek(fd, 0, os.SEEK_END)
    if start < FILE_HEADER:
        raise OSError(errno.EIO, "write-ahead file has no header")
    sink = _Sink(fd)
    whole = start
    last_next: int | None = None
    try:
        if start == FILE_HEADER:  # the schema frame, once per file
            sink.chunks.append(schema.serialize().to_pybytes())
            sink.frame(0, 0)
            whole = start + sink.written
        writer = pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema)
        while batches:
            batch = batches[0]
            writer.write_batch(batch)
            seq = int(batch.column(0)[0].as_py()) if batch.num_rows else 0
            sink.frame(seq, batch.num_rows)
            batches.popleft()
            whole = start + sink.written
            if batch.num_rows:
                last_next = seq + batch.num_rows
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
        _ack(fd, first_seq, whole, last_next)
        if sink.error is not None:
            raise sink.error from None
        if isinstance(exc, OSError):
            raise
        raise OSError(errno.EIO, f"write-ahead batch not written: {exc}") from exc
    _ack(fd, first_seq, whole, last_next)


def _ack(fd: int, first_seq: int, end: int, last_next: int | None) -> None:
    """Move the ack mark to `end` and `last_next` (nothing when no batch was written:
    the mark has them already)."""
    if last_next is not None:
        os.pwrite(fd, _header(first_seq, end, last_next)[_ACK_AT:_ACK_AT + _ACK.size],
                  _ACK_AT)


# ---- reading -----------------------------------------------------------------------
@dataclass
class Frame:
    """One batch read back whole, where it lay, and what its frame header said."""

    batch: pa.RecordBatch
    offset: int
    first_seq: int | None = None  # None in a file written before frames
    rows: int | None = None


@dataclass
class WalScan:
    """What one write-ahead file holds: its intact batches and what was wrong with it.

    `damage`: why bytes that were acknowledged (or cannot be shown not to have been)
    could not be read, one entry per damaged stretch; empty for an intact file.
    `damaged`: (first_seq, rows) of frames whose header survived but whose payload did not.
    `torn`: bytes of a last frame that was never acknowledged (a write cut by a crash).
    `acked_next`: one past the newest record_seq the writer was told was written (None
    when the file has no readable mark: a file written before frames, or damage).
    """

    frames: list[Frame] = field(default_factory=list)
    schema: pa.Schema | None = None
    damage: list[str] = field(default_factory=list)
    damaged: list[tuple[int, int]] = field(default_factory=list)
    torn: int = 0
    first_seq: int | None = None
    acked_next: int | None = None
    legacy: bool = False


def read_wal(data: bytes, schema: pa.Schema) -> WalScan:
    """Every intact batch of one write-ahead file, in file order, and its damage.

    Batches are decoded with `schema` when the file's own schema frame is lost; a batch
    that does not decode or validate under it counts as damage.
    """
    if data.startswith(_CONTINUATION):
        return _read_legacy(data, schema)
    scan = WalScan()
    acked_end = FILE_HEADER
    if len(data) < FILE_HEADER or not data.startswith(FILE_MAGIC):
        scan.damage.append("no file header" if data else "empty (a file is never "
                           "created without its header)")
        acked_end = len(data)  # nothing can be shown unacknowledged
    else:
        _, first, end, nxt, crc, _ = _FILE.unpack_from(data)
        if zlib.crc32(data[:_FILE.size - 8]) != crc:
            scan.damage.append("file header checksum mismatch")
            acked_end = len(data)
        else:
            scan.first_seq, scan.acked_next, acked_end = first, nxt, end
    view = memoryview(data)
    at = FILE_HEADER if not scan.damage else 0
    file_schema: pa.Schema | None = None
    while at < len(data):
        head = _frame_at(data, at)
        if head is None:
            found = data.find(FRAME_MAGIC, at + 1)
            while found != -1 and _frame_at(data, found) is None:
                found = data.find(FRAME_MAGIC, found + 1)
            stop = len(data) if found == -1 else found
            if found == -1 and at >= acked_end and _torn_tail(data, at):
                scan.torn = len(data) - at
            else:
                scan.damage.append(f"bytes {at}..{stop} are no frame")
            at = stop
            continue
        length, first_seq, rows, crc = head
        end = at + FRAME_HEADER + length
        if end > len(data):
            if at >= acked_end:
                scan.torn = len(data) - at
            else:
                scan.damage.append(f"the frame at {at} ends past the file's end")
                scan.damaged.append((first_seq, rows))
            break
        payload = view[at + FRAME_HEADER:end]
        batch, why = None, ""
        if zlib.crc32(payload) != crc:
            why = "checksum mismatch"
        else:
            try:
                message = pa.ipc.read_message(pa.py_buffer(payload))
                if message.type == "schema":
                    file_schema = pa.ipc.read_schema(message)
                    scan.schema = file_schema
                else:
                    batch = pa.ipc.read_record_batch(message, file_schema or schema)
                    batch.validate(full=True)
            except (pa.ArrowException, OSError, ValueError) as exc:
                batch, why = None, str(exc)[:200]
        if why:
            scan.damage.append(f"the frame at {at}: {why}")
            scan.damaged.append((first_seq, rows))
        elif batch is not None:
            scan.frames.append(Frame(batch, at, first_seq, rows))
        at = end
    return scan


def _frame_at(data: bytes, at: int) -> tuple[int, int, int, int] | None:
    """(length, first_seq, rows, crc) of a frame header at `at` that checks out, or None."""
    if len(data) - at < FRAME_HEADER or data[at:at + 8] != FRAME_MAGIC:
        return None
    _, length, first_seq, rows, crc, head_crc = _FRAME.unpack_from(data, at)
    if zlib.crc32(data[at:at + FRAME_HEADER - 4]) != head_crc:
        return None
    return length, first_seq, rows, crc


def _torn_tail(data: bytes, at: int) -> bool:
    """The bytes from `at` are the start of a frame header cut short (a torn write)."""
    rest = data[at:]
    return len(rest) < FRAME_HEADER and FRAME_MAGIC.startswith(rest[:8])


def _read_legacy(data: bytes, schema: pa.Schema) -> WalScan:
    """A file written before frames: IPC messages, no checksum, no ack mark.

    A message that does not decode is skipped to the next continuation marker that
    starts one that does.  With no mark, a message cut short at the end cannot be told
    from damage: it is reported as damage.
    """
    scan = WalScan(legacy=True)
    buffer = pa.py_buffer(data)
    at = 0
    file_schema: pa.Schema | None = None
    bad_from: int | None = None
    while at < len(data):
        size, batch, is_schema = _legacy_message(buffer, data, at, file_schema or schema)
        if size == 0:
            if bad_from is None:
                bad_from = at
            nxt = data.find(_CONTINUATION, at + 1)
            at = len(data) if nxt == -1 else nxt
            continue
        if bad_from is not None:
            scan.damage.append(f"bytes {bad_from}..{at} do not decode")
            bad_from = None
        if is_schema is not None:
            file_schema = scan.schema = is_schema
        elif batch is not None:
            scan.frames.append(Frame(batch, at))
        at += size
    if bad_from is not None:
        scan.damage.append(f"bytes {bad_from}..{len(data)} do not decode (in a file written "
                           "before frames a crash's torn last write looks the same: there "
                           "is no ack mark to tell)")
    return scan


def _legacy_message(buffer: pa.Buffer, data: bytes, at: int, schema: pa.Schema
                    ) -> tuple[int, pa.RecordBatch | None, pa.Schema | None]:
    """(bytes, batch, schema) of the IPC message at `at`; (0, None, None) if none."""
    if data[at:at + 4] != _CONTINUATION or len(data) - at < _PREFIX:
        return 0, None, None
    meta = struct.unpack_from("<i", data, at + 4)[0]
    if not 0 < meta <= _MAX_METADATA or at + _PREFIX + meta > len(data):
        return 0, None, None
    try:
        reader = pa.BufferReader(buffer.slice(at))
        message = pa.ipc.read_message(reader)
        size = reader.tell()
        if message.type == "schema":
            return size, None, pa.ipc.read_schema(message)
        batch = pa.ipc.read_record_batch(message, schema)
        batch.validate(full=True)
        return size, batch, None
    except (pa.ArrowException, OSError, ValueError):
        return 0, None, None
