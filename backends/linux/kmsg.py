"""linux.kmsg: the kernel's log as a record dataset, and reports that write themselves.

Every record of /dev/kmsg becomes one row of MOUNT/linux.kmsg/records/ (its seq,
monotonic and wall-clock time, level, facility, continuation flag, dictionary fields,
message), with what `mlfs.kmsg` derives from the kernel's own formats: the block
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
import logging
import math
import os
import time
from pathlib import Path

import pyarrow as pa

from mlfs.abi import (
    EXTRA_RECORDS_LOST,
    EXTRA_REPORTS,
    Backend,
    ExampleUnavailable,
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
from mlfs.kmsg import (
    FACILITY_KERNEL,
    Blocks,
    Record,
    Reports,
    classify,
    parse_record,
    printable,
)

log = logging.getLogger(__name__)

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
    #: a tick's classification and similarity run in a worker thread: a storm of 20,000
    #: records in one tick must not hold the trio thread, which answers the kill switch
    #: (red team K11).  `report_files` is then read while `step` runs: it takes a
    #: snapshot of the reports (`list()` of a dict is one step under the GIL)
    blocking = True

    def __init__(self, name: str = "linux.kmsg", tick_seconds: float = 1.0,
                 path: str = DEFAULT_PATH, max_records: int = 20000, start: str = "boot",
                 state_dir: str | Path | None = None, host: str | None = None,
                 block_quiet_seconds: float = Blocks.QUIET_SECONDS) -> None:
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
        self.block_quiet_seconds = block_quiet_seconds
        self._clock = time.monotonic  # what the quiet interval of a block is measured on
        # the cursor's seq: a first record beyond it means the ring overran while we were down
        self._last_seq: int | None = self._skip_to if self._skip_to >= 0 else None
        self._handed: int | None = None  # last seq handed over on the previous tick
        self._wall_offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        self.lost_total = 0

    # ---- the cursor and the reports, kept across restarts ------------------------
    def _load_state(self) -> None:
        """The cursor and reports of an earlier run.  A cursor of this boot beyond the
        newest record the ring holds cannot be ours (a damaged or forged file: with
        `seq: 10**30` every record of the boot was skipped, silently, red team K15): the
        file is set aside as `.damaged`, logged, and reading starts as on a first mount;
        its reports are kept (each is checked against its own hash on load)."""
        if self._state is None:
            return
        try:
            saved = json.loads(self._state.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            self._set_aside("not JSON")
            return
        if not isinstance(saved, dict):
            self._set_aside("not a JSON object")
            return
        seq = saved.get("seq")
        if saved.get("boot_id") == self.boot_id:
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < -1:
                self._set_aside(f"seq {seq!r} is not a record number")
            else:
                newest = self._ring_newest_seq()
                if seq > newest:
                    self._set_aside(f"seq {seq} is past the newest record of this boot "
                                    f"({newest})")
                else:
                    self._skip_to = seq
        self.reports.load(saved.get("reports"))
        evicted = saved.get("evicted")
        if isinstance(evicted, dict):
            for budget, count in evicted.items():
                if budget in self.reports.evicted and isinstance(count, int) and count >= 0:
                    self.reports.evicted[budget] += count  # and those the load evicted

    def _set_aside(self, why: str) -> None:
        assert self._state is not None
        log.warning("%s: cursor %s set aside (%s); reading starts as on a first mount",
                    self.name, self._state, why)
        try:
            os.replace(self._state, self._state.with_suffix(".damaged"))
        except OSError:
            pass

    def _save_state(self, seq: int | None) -> None:
        if self._state is None:
            return
        data = {"boot_id": self.boot_id, "seq": seq if seq is not None else self._skip_to,
                "reports": self.reports.to_json(), "evicted": dict(self.reports.evicted)}
        tmp = self._state.with_suffix(".tmp")
        try:
            self._state.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._state)
        except OSError:
            pass  # the cursor is an optimisation of the restart, never a reason to stop

    def _newest_seq(self, fd: int | None = None) -> int:
        """The seq of the newest record the ring holds now (-1 when it holds none),
        read through `fd` (this reader's own by default: it then starts after it)."""
        fd = self._fd if fd is None else fd
        newest = -1
        while True:
            try:
                raw = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return newest
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EINVAL):
                    continue
                raise
            if not raw:
                return newest
            record = parse_record(raw)
            if record is not None:
                newest = record.seq

    def _ring_newest_seq(self) -> int:
        """The newest seq the ring holds, through a descriptor of its own (this reader's
        position does not move)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return -1
        try:
            return self._newest_seq(fd)
        finally:
            os.close(fd)

    # ---- reading -------------------------------------------------------------------
    def _read(self) -> tuple[list, int]:
        """Records available now (at most `max_records`), and how many were overrun."""
        out, lost, self._last_seq = read_records(self._fd, self.max_records, self._skip_to,
                                                 self._last_seq)
        return out, lost

    def step(self, knobs: dict) -> Sample:
        records, lost = self._read()
        now = time.time()
        try:
            cols, report_events, io_errors = self._rows(records, lost, now)
        except Exception:  # noqa: BLE001 - the records are read: they must go out
            log.exception("%s: records not classified; kept as plain rows", self.name)
            self._blocks.open = None
            cols, report_events, io_errors = self._plain_rows(records, lost, now), [], 0
        self._save_state(self._handed)
        if records:
            self._handed = records[-1].seq
        n = len(cols["seq"])
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

    def _rows(self, records: list[Record], lost: int, now: float
              ) -> tuple[dict[str, list], list[dict], int]:
        """This tick's rows, report events and I/O error count.

        A block's rows are labelled in the tick they are written in: rows of earlier
        ticks keep the provisional title they were written with (their portion may be
        sealed already), rows of this tick get the completed one.  Row numbers are
        therefore only ever kept for this tick's `cols` (red team K7: indices of an
        earlier tick used on this tick's columns raised IndexError and lost the tick).
        """
        cols: dict[str, list] = {name: [] for name in RECORDS}
        block_rows: dict[int, list[int]] = {}  # block's first seq -> rows of this tick
        report_events: list[dict] = []
        io_errors = 0
        if lost:
            self._append_lost(cols, lost, now)
        for record in records:
            found = classify(record.message)
            wall = self._wall_offset + record.ts_usec / 1e6
            origin = "kernel" if record.facility == FACILITY_KERNEL else "user"
            block_seq, ended = self._blocks.feed(record.seq, record.message, found, wall,
                                                 self._clock(), origin)
            if ended is not None and ended.first_seq != block_seq:  # ended before this one
                self._close_block(ended, cols, block_rows, report_events)
            device = found.device or _dict_device(record.fields.get("DEVICE"))
            if found.kind == "io_error":
                io_errors += 1
            row = len(cols["seq"])
            _append(cols, self.boot_id, record.seq, record.ts_usec, wall, record.level,
                    record.facility, record.continuation, record.fields.get("SUBSYSTEM", ""),
                    record.fields.get("DEVICE", ""), record.message, device, found.kind,
                    printable(found.signature),
                    block_seq if block_seq is not None else record.seq, found.suppressed)
            if block_seq is not None:
                block_rows.setdefault(block_seq, []).append(row)
                if ended is not None and ended.first_seq == block_seq:  # its end marker
                    self._close_block(ended, cols, block_rows, report_events)
            elif not found.block:
                self._report(found.kind, found.signature, [record.message], wall,
                             report_events, origin)
        ended = self._blocks.quiet(self._clock(), self.block_quiet_seconds)
        if ended is not None:
            self._close_block(ended, cols, block_rows, report_events)
        return cols, report_events, io_errors

    def _plain_rows(self, records: list[Record], lost: int, now: float) -> dict[str, list]:
        """The rows of records that could not be classified: as the kernel wrote them, of
        kind `other`; if even that fails, one `lost` row counting them."""
        cols: dict[str, list] = {name: [] for name in RECORDS}
        try:
            if lost:
                self._append_lost(cols, lost, now)
            for record in records:
                _append(cols, self.boot_id, record.seq, record.ts_usec,
                        self._wall_offset + record.ts_usec / 1e6, record.level,
                        record.facility, record.continuation,
                        str(record.fields.get("SUBSYSTEM", "")),
                        str(record.fields.get("DEVICE", "")), str(record.message), None,
                        "other", "", record.seq, 0)
            pa.table({name: pa.array(values, type=_ARROW[RECORDS[name]])
                      for name, values in cols.items()})
        except Exception:  # noqa: BLE001 - counted below, never dropped silently
            log.exception("%s: records not kept; counted as lost", self.name)
            cols = {name: [] for name in RECORDS}
            self._append_lost(cols, lost + len(records), now)
        return cols

    def _append_lost(self, cols: dict[str, list], lost: int, now: float) -> None:
        self.lost_total += lost
        _append(cols, self.boot_id, (self._last_seq or 0), 0, now, 0, 0, False, "", "",
                f"{lost} kernel log records lost (the ring overran the reader)", None,
                "lost", "records lost", 0, lost)

    def _close_block(self, block, cols, block_rows, events) -> None:
        for row in block_rows.pop(block.first_seq, []):  # this tick's rows of the block
            cols["signature"][row] = printable(block.title)
        self._report(block.kind, block.title, block.lines, block.first_seen, events,
                     block.origin)

    def _report(self, kind, title, lines, when, events, origin="kernel") -> None:
        report, status = self.reports.seen(kind, title, lines, when, origin)
        if report is not None and status in ("new", "duplicate", "repeat"):
            similarity, nearest = self.reports.last_similarity
            event = {"report": report.id, "kind": kind, "title": report.title,
                     "status": status, "count": report.count}
            if status in ("new", "duplicate"):  # what the learned similarity decided
                event["similarity"] = round(similarity, 3)
                event["nearest"] = nearest
            events.append(event)

    def report_files(self) -> dict[str, str]:
        return {report.id: report.text() for report in list(self.reports.by_id.values())}

    def close(self) -> None:
        ended = self._blocks.idle()  # a block still open is as complete as it will get
        if ended is not None:
            try:
                self._report(ended.kind, ended.title, ended.lines, ended.first_seen, [],
                             ended.origin)
            except Exception:  # noqa: BLE001 - closing must not fail on a report
                log.exception("%s: the last open report not kept", self.name)
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
    record still held.  What was lost is what the sequence numbers skip: every gap of
    the read counts, whole (red team K10: a reset at each EPIPE forgot all gaps but the
    last and counted each one short by one).
    """
    out: list[Record] = []
    lost = 0
    while len(out) < limit:
        try:
            raw = os.read(fd, READ_SIZE)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EINVAL):
                # EPIPE: overrun, the next read gives the oldest kept; EINVAL: a record
                # over READ_SIZE, skipped by the kernel.  Either way the gap in seq says it
                continue
            raise
        if not raw:
            break  # not a kmsg device (end of file)
        record = parse_record(raw)
        if record is None or record.seq <= after:
            continue
        if last_seq is not None and record.seq > last_seq + 1:
            lost += record.seq - last_seq - 1
        last_seq = record.seq
        out.append(record)
    return out, lost, last_seq


#: `[[subsystem]] backend = "linux.kmsg"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "tick_seconds": tick_seconds(),
    "path": text(4096),
    "max_records": number(1, 1_000_000, integer=True),
    # where a first mount (no cursor of this boot) starts: the ring's oldest record
    # ("boot", dmesg) or the records that come after the mount ("now", dmesg -w -n)
    "start": word("boot", "now"),
    # a crash report with no end marker (hung task, RCU stall, lockup) is complete when
    # nothing was added to it for this long
    "block_quiet_seconds": number(0.05, 600),
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


def _example(env: object) -> dict:
    """The conformance suite's instance: the log from now on (the boot's backlog is long)."""
    if not os.access(DEFAULT_PATH, os.R_OK):
        raise ExampleUnavailable(f"{DEFAULT_PATH} is not readable by this user")
    return {"tick_seconds": 0.1, "start": "now"}


BACKEND = Backend(name="linux.kmsg", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, root_only=ROOT_ONLY,
                  uses_state_dir=USES_STATE_DIR, kinds=("predictor",), example=_example)
__all__ = ["BACKEND", "LinuxKmsg", "RECORDS"]
