"""linux.kmsg: the kernel's log as a record dataset, and reports that write themselves.

Every record of /dev/kmsg becomes one row of MOUNT/linux.kmsg/records/ (its seq,
monotonic and wall-clock time, level, facility, continuation flag, dictionary fields,
message), with what `mlfs.kernel_log` derives from the kernel's own formats: the block
`device` it is about, its `kind` and its `signature` (a syzbot-style title).  Each
distinct signature of a crash, warning, hang or I/O error is a report
(MOUNT/linux.kmsg/reports/<kind>-<sha12>), announced by a `report` event when it is new
and, rate-limited, when it repeats.

Reading never blocks the tick loop: /dev/kmsg is opened O_NONBLOCK and drained until
EAGAIN (at most `max_records` per tick).  EPIPE means the kernel's ring overran this
reader: the next read returns the oldest record still held, and the gap in `seq` is
written as one row of kind `lost` with its count (and counted in `records_lost`).

Nothing is lost across a restart while the ring still holds it: the cursor (boot id and
the seq of the last record handed over one tick earlier, so already in the core's
write-ahead file) is kept in STATE/backends/linux.kmsg/<name>.json; a restart in the
same boot skips what the cursor covers, a new boot starts from the ring's oldest
record.  At worst one tick's records appear twice after a crash (same boot_id and seq:
deduplicate on them); none is skipped.

The kernel log is root's (dmesg_restrict): loading this backend needs the right to read
/dev/kmsg, checked at load; its records and reports are readable by root and the
mount's group only (`private`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path

import pyarrow as pa

from mlfs.abi import (
    EXTRA_RECORDS_LOST,
    EXTRA_REPORTS,
    Objective,
    Sample,
    Schema,
    SettingError,
    Subsystem,
    check_settings,
    defaults_from,
    number,
    text,
    tick_seconds,
    word,
)
from mlfs.kernel_log import Blocks, Record, Reports, classify, parse_record

USES_STATE_DIR = True
#: reading the kernel log is root's (dmesg_restrict): a group member may not load it
ROOT_ONLY = True
DEFAULT_PATH = "/dev/kmsg"
#: one read(2) of /dev/kmsg returns one record of at most this many bytes (the kernel's
#: own buffer is 8 KiB, CONSOLE_EXT_LOG_MAX)
READ_SIZE = 8192
#: reports announced per tick at most (the rest are counted, their events dropped)
MAX_REPORT_EVENTS = 32

RECORDS: dict[str, str] = {
    "boot_id": "string",
    "seq": "uint64",
    "ts_usec": "uint64",
    "ts": "timestamp",
    "level": "uint8",
    "facility": "uint8",
    "continuation": "bool",
    "subsystem": "string",
    "dict_device": "string",
    "message": "string",
    "device": "string",
    "kind": "string",
    "signature": "string",
    "block": "uint64",
    "count": "int64",
}


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _release() -> str:
    return os.uname().release


class LinuxKmsg(Subsystem):
    """/dev/kmsg as records (one per kernel log record) and reports (one per signature)."""

    backend = "linux.kmsg"
    description = "the kernel's log (/dev/kmsg): records, device errors, crash reports"
    records = RECORDS
    private = True
    publishes_reports = True

    def __init__(self, name: str = "linux.kmsg", tick_seconds: float = 1.0,
                 path: str = DEFAULT_PATH, max_records: int = 20000, start: str = "boot",
                 state_dir: str | Path | None = None, host: str | None = None) -> None:
        self.name = name
        self.tick_seconds = tick_seconds
        self.objective = Objective("records", "records", "max")
        self.knobs = {}
        self.features = {"records": "int64", "io_errors": "int64", "lost": "int64",
                         "reports": "int64"}
        self.path = path
        self.max_records = max_records
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise SettingError("path", f"cannot read {path}: {os.strerror(exc.errno or 0)}"
                               " (the kernel log is root's: dmesg_restrict)") from None
        self.boot_id = _boot_id()
        self._state = (Path(state_dir) / "backends" / "linux.kmsg" / f"{name}.json"
                       if state_dir is not None else None)
        self._skip_to = -1  # records at or below this seq are already kept
        self.reports = Reports(_release(), host or os.uname().nodename)
        self._load_state()
        if start == "now" and self._skip_to < 0:  # no cursor of this boot: new records only
            self._skip_to = self._newest_seq()
            self._save_state(self._skip_to)  # a crash before the first tick starts here too
        self._blocks = Blocks()
        self._block_rows: dict[int, list[int]] = {}
        # the cursor's seq: a first record beyond it means the ring overran while we were down
        self._last_seq: int | None = self._skip_to if self._skip_to >= 0 else None
        self._handed: int | None = None  # last seq handed over on the previous tick
        self._wall_offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        self.lost_total = 0

    # ---- the cursor and the reports, kept across restarts ------------------------
    def _load_state(self) -> None:
        if self._state is None:
            return
        try:
            saved = json.loads(self._state.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            self._state.rename(self._state.with_suffix(".damaged"))
            return
        if not isinstance(saved, dict):
            return
        seq = saved.get("seq")
        if saved.get("boot_id") == self.boot_id and isinstance(seq, int) and seq >= 0:
            self._skip_to = seq
        self.reports.load(saved.get("reports"))

    def _save_state(self, seq: int | None) -> None:
        if self._state is None:
            return
        data = {"boot_id": self.boot_id, "seq": seq if seq is not None else self._skip_to,
                "reports": self.reports.to_json()}
        tmp = self._state.with_suffix(".tmp")
        try:
            self._state.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._state)
        except OSError:
            pass  # the cursor is an optimisation of the restart, never a reason to stop

    def _newest_seq(self) -> int:
        """The seq of the newest record the ring holds now (-1 when it holds none)."""
        newest = -1
        while True:
            try:
                raw = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return newest
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EINVAL):
                    continue
                raise
            record = parse_record(raw)
            if record is not None:
                newest = record.seq

    # ---- reading -------------------------------------------------------------------
    def _read(self) -> tuple[list, int]:
        """Records available now (at most `max_records`), and how many were overrun."""
        out, lost, self._last_seq = read_records(self._fd, self.max_records, self._skip_to,
                                                 self._last_seq)
        return out, lost

    def step(self, knobs: dict) -> Sample:
        records, lost = self._read()
        n = len(records) + (1 if lost else 0)
        cols: dict[str, list] = {name: [] for name in RECORDS}
        report_events: list[dict] = []
        now = time.time()
        io_errors = 0
        if lost:
            self.lost_total += lost
            _append(cols, self.boot_id, (self._last_seq or 0), 0, now, 0, 0, False, "", "",
                    f"{lost} kernel log records lost (the ring overran the reader)", None,
                    "lost", "records lost", 0, lost)
        for record in records:
            found = classify(record.message)
            block_seq, ended = self._blocks.feed(record.seq, record.message, found)
            if ended is not None:
                self._close_block(ended, cols, report_events, now)
            wall = self._wall_offset + record.ts_usec / 1e6
            device = found.device or _dict_device(record.fields.get("DEVICE"))
            if found.kind == "io_error":
                io_errors += 1
            row = len(cols["seq"])
            _append(cols, self.boot_id, record.seq, record.ts_usec, wall, record.level,
                    record.facility, record.continuation, record.fields.get("SUBSYSTEM", ""),
                    record.fields.get("DEVICE", ""), record.message, device, found.kind,
                    found.signature, block_seq if block_seq is not None else record.seq,
                    found.suppressed)
            if block_seq is not None:
                self._block_rows.setdefault(block_seq, []).append(row)
            elif not found.block:
                self._report(found.kind, found.signature, [record.message], now,
                             report_events)
        if not records:
            ended = self._blocks.idle()
            if ended is not None:
                self._close_block(ended, cols, report_events, now)
        # blocks still open keep their provisional title in this tick's rows
        self._block_rows = {k: v for k, v in self._block_rows.items()
                            if self._blocks.open is not None and k == self._blocks.open.first_seq}
        self._save_state(self._handed)
        if records:
            self._handed = records[-1].seq
        table = pa.table({name: pa.array(values, type=_ARROW[RECORDS[name]])
                          for name, values in cols.items()}) if n else None
        features = {"records": len(records), "io_errors": io_errors, "lost": lost,
                    "reports": len(self.reports.by_id)}
        extra: dict = {}
        if lost:
            extra[EXTRA_RECORDS_LOST] = lost
        if report_events:
            extra[EXTRA_REPORTS] = report_events[:MAX_REPORT_EVENTS]
        return Sample(features=features, objective=math.nan, extra=extra, records=table)

    def _close_block(self, block, cols, events, now) -> None:
        rows = self._block_rows.pop(block.first_seq, [])
        for row in rows:  # rows of this tick get the block's completed title
            cols["signature"][row] = block.title
        self._report(block.kind, block.title, block.lines, now, events)

    def _report(self, kind, title, lines, now, events) -> None:
        report, status = self.reports.seen(kind, title, lines, now)
        if report is not None and status in ("new", "duplicate", "repeat"):
            similarity, nearest = self.reports.last_similarity
            event = {"report": report.id, "kind": kind, "title": title, "status": status,
                     "count": report.count}
            if status in ("new", "duplicate"):  # what the learned similarity decided
                event["similarity"] = round(similarity, 3)
                event["nearest"] = nearest
            events.append(event)

    def report_files(self) -> dict[str, str]:
        return {rid: report.text() for rid, report in self.reports.by_id.items()}

    def close(self) -> None:
        self._save_state(self._last_seq if self._last_seq is not None else None)
        try:
            os.close(self._fd)
        except OSError:
            pass


def _dict_device(value: str | None) -> str | None:
    """The DEVICE= dictionary field as a block device name (`+block:loop3` -> loop3)."""
    if value and value.startswith("+block:"):
        return value[len("+block:"):]
    return None


def _append(cols, boot_id, seq, ts_usec, wall, level, facility, cont, subsystem, dict_device,
            message, device, kind, signature, block, count) -> None:
    cols["boot_id"].append(boot_id)
    cols["seq"].append(seq)
    cols["ts_usec"].append(ts_usec)
    cols["ts"].append(int(wall * 1_000_000))
    cols["level"].append(level)
    cols["facility"].append(facility)
    cols["continuation"].append(cont)
    cols["subsystem"].append(subsystem)
    cols["dict_device"].append(dict_device)
    cols["message"].append(message)
    cols["device"].append(device)
    cols["kind"].append(kind)
    cols["signature"].append(signature)
    cols["block"].append(block)
    cols["count"].append(count)


_ARROW = {"string": pa.string(), "uint64": pa.uint64(), "uint8": pa.uint8(),
          "bool": pa.bool_(), "int64": pa.int64(),
          "timestamp": pa.timestamp("us", tz="UTC")}


def read_records(fd: int, limit: int, after: int, last_seq: int | None
                 ) -> tuple[list[Record], int, int | None]:
    """The records an O_NONBLOCK /dev/kmsg descriptor holds now past seq `after` (at most
    `limit`), how many the ring overran since `last_seq`, and the last seq read.

    EPIPE means the kernel's ring overran this reader: the next read returns the oldest
    record still held, and the gap in seq is the count lost.
    """
    out: list[Record] = []
    lost = 0
    while len(out) < limit:
        try:
            raw = os.read(fd, READ_SIZE)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # overrun: the next read gives the oldest kept
                lost = -1
                continue
            if exc.errno == errno.EINVAL:  # a record over READ_SIZE: skipped by the kernel
                continue
            raise
        record = parse_record(raw)
        if record is None or record.seq <= after:
            continue
        if last_seq is not None and record.seq > last_seq + 1:
            lost += record.seq - last_seq - 1
        elif lost == -1:
            lost = 0
        last_seq = record.seq
        out.append(record)
    return out, max(lost, 0), last_seq

#: `[[subsystem]] backend = "linux.kmsg"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "tick_seconds": tick_seconds(),
    "path": text(4096),
    "max_records": number(1, 1_000_000, integer=True),
    # where a first mount (no cursor of this boot) starts: the ring's oldest record
    # ("boot", dmesg) or the records that come after the mount ("now", dmesg -w -n)
    "start": word("boot", "now"),
}

DESCRIPTION = ("the kernel's log (/dev/kmsg) as records with device, kind and a syzbot-style "
               "signature; one report per signature (root's: the log is dmesg_restrict)")
defaults_from(SETTINGS, LinuxKmsg.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked constructor arguments and the one subsystem name; SettingError."""
    kwargs = check_settings(settings, SETTINGS)
    path = kwargs.get("path", DEFAULT_PATH)
    if not os.access(path, os.R_OK):  # before any daemon starts: one line, exit 2
        reason = "does not exist" if not os.path.exists(path) else "is not readable by this user"
        raise SettingError("path", f"{path} {reason} (the kernel log is root's: "
                           "dmesg_restrict)")
    return kwargs, [kwargs.get("name", "linux.kmsg")]


def factory(settings: dict) -> list[LinuxKmsg]:
    """`[[subsystem]] backend = "linux.kmsg"`: one subsystem."""
    kwargs, _ = check(settings)
    return [LinuxKmsg(**kwargs)]


__all__ = ["LinuxKmsg", "RECORDS"]
