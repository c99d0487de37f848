"""linux.health: block devices' health as a record dataset, for models that predict failure.

One record per watched device per tick, from three sources:

- `/sys/block/<dev>/stat`: requests completed this tick, the kernel's own time spent per
  read and per write (ms per request), requests in flight, busy time;
- the block layer's completion status (`errors`): the requests that completed with an
  error this tick, counted from the BPF capture of `linux.bio` (every request, never
  rate-limited) when it can run here, else null;
- the kernel's log (`errors_logged`): I/O error records naming the device
  (`mlfs.kmsg.classify`, the same parsing as `linux.kmsg`), plus the records the
  kernel's rate limit suppressed ("N callbacks suppressed"), counted to the device of the
  error record they interrupted.  The log alone undercounts a burst (printk allows ten
  messages per five seconds per call site), which is why the block layer is counted too;
- with `smartctl = true`, SMART's verdict and the raw values Backblaze watches
  (5, 187, 188, 197, 198) through `smartctl --json` (a device that has no SMART, a
  loop device, gives nulls).

The target `failure`: the device's errors in one tick reach `burst_errors` (the burst
that ends a dying disk; errors from the block layer where it is counted, else from the
log), predicted up to `horizon_ticks` ticks ahead.  The default rule is "alert after the
first error": `first_error` is true from the tick of the device's first error on.  No
single precursor gives the end away: rising latency, sporadic errors and their rate are
what a model can learn (tests/failing_disk.py makes such a disk).

Reading the log and capturing requests is root's (`ROOT_ONLY`); the records name
devices, not users, and are public.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mlfs.abi import (
    Backend,
    ConformanceEnv,
    ExampleUnavailable,
    Objective,
    Sample,
    Schema,
    SettingError,
    Subsystem,
    Target,
    boolean_or,
    check_settings,
    defaults_from,
    list_of,
    number,
    text,
    tick_seconds,
    word,
)
from mlfs.kmsg import classify

from ..smart import BACKBLAZE_ATTRIBUTES, health_row, read_smartctl
from .bio import LinuxBio, device_number, unavailable
from .kmsg import read_records

ROOT_ONLY = True

RECORDS = {
    "dev": "int64", "device": "string",
    "reads": "int64", "writes": "int64",
    "read_ms_per_op": "float64", "write_ms_per_op": "float64",
    "in_flight": "int64", "busy_ms": "int64",
    "errors": "int64", "errors_logged": "int64", "errors_total": "int64",
    "smart_failed": "bool",
    **{column: "int64" for column in BACKBLAZE_ATTRIBUTES.values()},
    "failure": "bool", "first_error": "bool",
}
#: fields of /sys/block/<dev>/stat (Documentation/block/stat.rst): reads completed,
#: reads merged, sectors read, ms reading, writes completed, ..., ms writing, in flight,
#: ms busy
_READS, _READ_MS, _WRITES, _WRITE_MS, _IN_FLIGHT, _BUSY_MS = 0, 3, 4, 7, 8, 9
#: the log's records read per tick at most (a storm of other messages is cut here)
MAX_LOG_RECORDS = 10_000


def _stat(device: str) -> list[int]:
    return [int(x) for x in Path(f"/sys/block/{device}/stat").read_text().split()]


class LinuxHealth(Subsystem):
    """Watched block devices, one health record each per tick."""

    backend = "linux.health"
    description = "block devices' health (latency, errors, SMART) for failure predictors"
    records = RECORDS

    def __init__(self, name: str = "linux.health", devices: list | None = None,
                 tick_seconds: float = 1.0, burst_errors: int = 20, horizon_ticks: int = 60,
                 capture: str = "auto", smartctl: bool = False,
                 state_dir: str | None = None) -> None:
        self.name = name
        self.tick_seconds = tick_seconds
        self.devices = list(devices or [])
        self.dev = {d: device_number(d) for d in self.devices}
        self.burst_errors = burst_errors
        self.smartctl = smartctl
        self.targets = {"failure": Target(
            "failure", key="dev", event="failure", rule="first_error",
            horizon_ticks=horizon_ticks, miss_cost=100.0, false_alarm_cost=1.0,
            argument="device",
            description=f"the device's errors in one tick reach {burst_errors} within "
                        "horizon_ticks ticks; rule: alert after its first error")}
        self.objective = Objective("errors", "errors", "min")
        self.knobs = {}
        self.features = {"devices": "int64", "errors": "int64", "failing": "int64"}
        self._last = {d: _stat(d) for d in self.devices}
        self._totals = dict.fromkeys(self.devices, 0)
        self._last_logged_device: str | None = None
        self.bio: LinuxBio | None = None
        why = unavailable()
        if capture == "on" and why:
            raise SettingError("capture", f"the block layer cannot be captured here: {why}")
        if capture != "off" and not why:
            only = self.devices[0] if len(self.devices) == 1 else ""
            self.bio = LinuxBio(name=f"{name}.bio", tick_seconds=tick_seconds, device=only)
        self._fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.lseek(self._fd, 0, os.SEEK_END)  # errors from now on
        self._seq: int | None = None

    def _logged_errors(self) -> dict[str, int]:
        """I/O errors the log names per watched device since the last tick."""
        records, _, self._seq = read_records(self._fd, MAX_LOG_RECORDS, -1, self._seq)
        counts = dict.fromkeys(self.devices, 0)
        for record in records:
            found = classify(record.message)
            if found.suppressed and self._last_logged_device in counts:
                counts[self._last_logged_device] += found.suppressed
            if found.kind != "io_error" or found.device is None:
                continue
            device = next((d for d in self.devices if found.device == d
                           or (found.device.startswith(d) and found.device[len(d):].lstrip(
                               "p").isdigit())), None)
            if device is not None:
                counts[device] += 1
                self._last_logged_device = device
        return counts

    def _block_errors(self) -> dict[str, int] | None:
        """Requests completed with an error per watched device (None: not captured)."""
        if self.bio is None:
            return None
        requests = self.bio.step({}).records
        counts = dict.fromkeys(self.devices, 0)
        if requests is None or requests.num_rows == 0:
            return counts
        dev = (np.asarray(requests.column("dev_major")).astype(np.int64) << 20) \
            | np.asarray(requests.column("dev_minor")).astype(np.int64)
        # null: completed, its status unseen (linux.bio records it at its struct's next
        # issue): not an error
        failed = np.asarray(pc.fill_null(pc.not_equal(requests.column("error"), 0), False))
        for device, number_ in self.dev.items():
            counts[device] = int((failed & (dev == number_)).sum())
        return counts

    def step(self, knobs: dict) -> Sample:
        logged = self._logged_errors()
        block = self._block_errors()
        columns: dict[str, list] = {name: [] for name in RECORDS}
        for device in self.devices:
            now = _stat(device)
            last, self._last[device] = self._last[device], now
            reads = now[_READS] - last[_READS]
            writes = now[_WRITES] - last[_WRITES]
            errors = block[device] if block is not None else logged[device]
            self._totals[device] += errors
            smart = self._smart(device)
            row = {
                "dev": self.dev[device], "device": device, "reads": reads, "writes": writes,
                "read_ms_per_op": (now[_READ_MS] - last[_READ_MS]) / reads if reads
                else math.nan,
                "write_ms_per_op": (now[_WRITE_MS] - last[_WRITE_MS]) / writes if writes
                else math.nan,
                "in_flight": now[_IN_FLIGHT], "busy_ms": now[_BUSY_MS] - last[_BUSY_MS],
                "errors": block[device] if block is not None else None,
                "errors_logged": logged[device], "errors_total": self._totals[device],
                "smart_failed": smart.get("threshold_tripped"),
                **{column: smart.get(column) for column in BACKBLAZE_ATTRIBUTES.values()},
                "failure": errors >= self.burst_errors,
                "first_error": self._totals[device] > 0,
            }
            for name in RECORDS:
                columns[name].append(row[name])
        table = pa.table({name: pa.array(values, type=_ARROW[RECORDS[name]])
                          for name, values in columns.items()})
        tick_errors = sum(block.values()) if block is not None else sum(logged.values())
        return Sample(features={"devices": len(self.devices), "errors": tick_errors,
                                "failing": sum(columns["failure"])},
                      objective=float(tick_errors), records=table)

    def _smart(self, device: str) -> dict:
        if not self.smartctl:
            return {}
        try:
            return health_row(read_smartctl(f"/dev/{device}"))
        except (OSError, ValueError):
            return {}  # no SMART here (a loop device), or smartctl missing: nulls

    def close(self) -> None:
        if self.bio is not None:
            self.bio.close()
        os.close(self._fd)


_ARROW = {"int64": pa.int64(), "string": pa.string(), "float64": pa.float64(),
          "bool": pa.bool_()}

#: `[[subsystem]] backend = "linux.health"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "devices": list_of(text(32), max_len=64, unique=True),
    "tick_seconds": tick_seconds(),
    "burst_errors": number(1, 1_000_000, integer=True),
    "horizon_ticks": number(1, 100_000, integer=True),
    # the block layer's errors through linux.bio's BPF capture: "auto" uses it where it
    # runs, "on" requires it, "off" counts the log's records alone
    "capture": word("auto", "on", "off"),
    "smartctl": boolean_or(),
}

DESCRIPTION = ("block devices' health, one record per device and tick: latency, in-flight "
               "requests, errors from the block layer and the kernel's log, SMART; target "
               "`failure` (root's)")
defaults_from(SETTINGS, LinuxHealth.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked constructor arguments and the one subsystem name; SettingError."""
    kwargs = check_settings(settings, SETTINGS)
    devices = kwargs.get("devices") or []
    if not devices:
        raise SettingError("devices", "name one or more block devices (e.g. [\"sda\"])")
    for device in devices:
        device_number(device)
    return kwargs, [kwargs.get("name", "linux.health")]


def factory(settings: dict) -> list[LinuxHealth]:
    """`[[subsystem]] backend = "linux.health"`: one subsystem."""
    kwargs, _ = check(settings)
    return [LinuxHealth(**kwargs)]


def _example(env: ConformanceEnv) -> dict:
    """The conformance suite's instance: the suite's loop device, without smartctl."""
    if env.device is None:
        raise ExampleUnavailable("no block device to watch (a loop device needs root)")
    return {"devices": [env.device], "tick_seconds": 0.1, "smartctl": False}


BACKEND = Backend(name="linux.health", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, root_only=ROOT_ONLY, kinds=("predictor",),
                  example=_example)
