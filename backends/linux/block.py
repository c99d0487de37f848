"""linux.block.<dev>: one block device's request queue as an mlfs subsystem.

Features (per tick, from /sys/block/<dev>/stat over the window right after the
knobs were applied; see the kernel's Documentation/block/stat.rst):
``reads_per_s``, ``writes_per_s``, ``read_merges_per_s``,
``write_merges_per_s``, ``flushes_per_s`` (I/Os completed), ``read_mb_per_s``,
``write_mb_per_s`` (sectors are 512 bytes; MB = 10^6 bytes), ``read_req_kb``,
``write_req_kb`` (mean request size, KiB), ``read_await_ms``,
``write_await_ms`` (time per completed request, ms), ``in_flight`` (requests
in flight at the end of the window), ``util`` (io_ticks: share of the window
the device was busy, 0-1) and ``queue_depth`` (time_in_queue / window: mean
requests in the queue).

With ``tracepoints = true`` (or ``"auto"``: when the kernel and the machine
allow it) the device's read requests are also traced (backends/blktrace.py:
every completed request from linux.bio's BPF ring capture), adding ``trace_reads_per_s``,
``trace_read_kb``, ``trace_seq_share`` (requests starting where the previous
read ended), ``trace_near_share`` (within 1 MiB of it), ``trace_run_kb`` (mean
length of a contiguous run of requests), ``trace_readahead_share``
(REQ_RAHEAD), ``trace_await_us`` and ``trace_slow_share`` (over 1 ms).  These
tell a sequential stream from random faults whatever read_ahead_kb is, which
the stat counters cannot.  The backend's own default is off; the embedded
configuration (mlfs/default.toml) sets ``"auto"``.  Cost: one small libbpf loader
per device (the BPF program is built once per kernel and cached).  ``true`` refuses to
start without the capture; ``"auto"`` goes on without it (logged); when the loader dies
later the trace_* features are NaN (missing) and a warning is logged once.

Knobs (in /sys/block/<dev>/queue/): ``read_ahead_kb`` (0-65536),
``nr_requests`` (4-2048: BLKDEV_MIN_RQ to MAX_SCHED_RQ; a device may accept
less, which the kernel refuses with EINVAL and mlfs reports), ``scheduler``
(a choice among the names the kernel lists, e.g. ``[mq-deadline] none``).
Switching the scheduler resets nr_requests: mlfs records nr_requests' original
too before a scheduler write and restores the scheduler first.

Objective: ``read_mb_per_s``, goal ``max`` (readahead and queue depth are
read-side tunables); any feature can be chosen (``objective``, ``goal``).
Device MB/s counts wasted readahead as throughput: to tune readahead, let the
application write its own figure to the subsystem's ``objective`` each tick.

Measured (tests/bench/readahead_win.py): Linux copies ``read_ahead_kb`` into
a file's readahead state when the file is *opened* (a mapping keeps the
state of the open it was made from), so a change reaches only files opened
afterwards — an application holding its files open is not tuned by this
knob at all; and the stat counters' request-size features depend on the
knob itself (at read_ahead_kb 0 a scan and random page faults both issue
4 KiB requests), which the trace features (``trace_run_kb``) do not.  With
them, a trained policy read a phased workload 1.48x faster than the default
128 KiB and 1.50x faster than the best static value.

Devices: ``devices = ["sda", "loop7"]`` serves those (whole disks listed in
/sys/block, else a configuration error); ``devices = "auto"`` (the default)
serves every whole disk in /sys/block that is not a loop, ram, zram or
device-mapper device and has a non-zero size (an empty CD drive or an
unconfigured nbd has nothing to observe).  Each device is its own subsystem,
named ``linux.block.<dev>``; one table's settings apply to all its devices.

Configuration::

    [[subsystem]]
    backend = "linux.block"
    devices = ["loop7"]            # default "auto"
    tick_seconds = 1.0             # default
    measure_seconds = 0.8          # default 0.8 * tick_seconds; 0 = since last tick
    objective = "read_mb_per_s"
    goal = "max"
    apply = {read_ahead_kb = [16, 4096], scheduler = ["none", "mq-deadline"]}
    tracepoints = false            # default; true / "auto": trace_* features

Without ``apply`` the device is observe-only.  See backends/linux/__init__.py
for what `apply` permits and the ledger that restores every original value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from mlfs.abi import (
    MAX_TICK_SECONDS,
    Backend,
    ConformanceEnv,
    ExampleUnavailable,
    Schema,
    SettingError,
    boolean_or,
    check_settings,
    defaults_from,
    described,
    list_of,
    number,
    table,
    text,
    tick_seconds,
    word,
)

from .. import blktrace
from .files import DEVICE_NAME, UnavailableError, parse_bracketed, read_text
from .knobs import KnobSpec, check_measure, parse_apply
from .subsystem import LinuxSubsystem, rate

__all__ = ["BACKEND", "FEATURES", "LinuxBlock", "SYS_BLOCK", "auto_devices", "specs_for"]

log = logging.getLogger("mlfs.backends.linux")

SYS_BLOCK = Path("/sys/block")
SECTOR_BYTES = 512
#: device-name prefixes never served automatically
AUTO_EXCLUDE = ("loop", "ram", "zram", "dm-")

# /sys/block/<dev>/stat fields, in order (Documentation/block/stat.rst)
_STAT_FIELDS = ("read_ios", "read_merges", "read_sectors", "read_ticks",
                "write_ios", "write_merges", "write_sectors", "write_ticks",
                "in_flight", "io_ticks", "time_in_queue",
                "discard_ios", "discard_merges", "discard_sectors", "discard_ticks",
                "flush_ios", "flush_ticks")

FEATURES: dict[str, str] = {
    name: "float64" for name in (
        "reads_per_s", "writes_per_s", "read_merges_per_s", "write_merges_per_s",
        "flushes_per_s", "read_mb_per_s", "write_mb_per_s", "read_req_kb", "write_req_kb",
        "read_await_ms", "write_await_ms", "in_flight", "util", "queue_depth",
    )
}

#: `[[subsystem]] backend = "linux.block"`: every setting and its range
SETTINGS: Schema = {
    "devices": lambda value: value if value == "auto" else _DEVICES(value),
    "tick_seconds": tick_seconds(),
    "measure_seconds": number(0.0, MAX_TICK_SECONDS),  # and <= tick_seconds
    "objective": word(*FEATURES, *blktrace.TRACE_FEATURES),
    "goal": word("max", "min"),
    "apply": table(),
    "tracepoints": boolean_or("auto"),
}
_DEVICES = list_of(text(64), 1, 4096, unique=True)


def specs_for(device: str) -> dict[str, KnobSpec]:
    queue = SYS_BLOCK / device / "queue"
    return {
        # settle_ticks: a file keeps the value it was opened with (carry-over until reopened)
        "read_ahead_kb": KnobSpec("read_ahead_kb", queue / "read_ahead_kb", lo=0, hi=65536,
                                  unit="KiB", settle_ticks=1),
        "nr_requests": KnobSpec("nr_requests", queue / "nr_requests", lo=4, hi=2048),
        "scheduler": KnobSpec("scheduler", queue / "scheduler", type="choice", priority=0,
                              coupled=("nr_requests",)),
    }


def auto_devices() -> list[str]:
    """Whole disks worth observing: not loop/ram/zram/dm, with a non-zero size."""
    out = []
    try:
        entries = sorted(p.name for p in SYS_BLOCK.iterdir())
    except OSError:
        return []
    for dev in entries:
        if dev.startswith(AUTO_EXCLUDE) or not DEVICE_NAME.fullmatch(dev):
            continue
        try:
            if int(read_text(SYS_BLOCK / dev / "size")) == 0:
                continue
        except (OSError, ValueError):
            continue
        if (SYS_BLOCK / dev / "queue" / "scheduler").exists():
            out.append(dev)
    return out


class LinuxBlock(LinuxSubsystem):
    """One whole disk's queue: read_ahead_kb, nr_requests, scheduler."""

    backend = "linux.block"
    UNITS = {
        "reads_per_s": "1/s", "writes_per_s": "1/s", "read_merges_per_s": "1/s",
        "write_merges_per_s": "1/s", "flushes_per_s": "1/s", "read_mb_per_s": "MB/s",
        "write_mb_per_s": "MB/s", "read_req_kb": "KiB", "write_req_kb": "KiB",
        "read_await_ms": "ms", "write_await_ms": "ms", "util": "1", **blktrace.UNITS,
    }

    def __init__(self, device: str, tick_seconds: float = 1.0,
                 measure_seconds: float | None = None, objective: str = "read_mb_per_s",
                 goal: str = "max", apply: Mapping | None = None,
                 state_dir: str | Path | None = None,
                 tracepoints: bool | str = False) -> None:
        if not DEVICE_NAME.fullmatch(device) or not (SYS_BLOCK / device / "stat").exists():
            raise UnavailableError(f"linux.block: {device!r} is not a whole disk in "
                                   f"{SYS_BLOCK}")
        if not (isinstance(tracepoints, bool) or tracepoints == "auto"):
            raise ValueError('linux.block: tracepoints must be true, false or "auto"')
        self.device = device
        self.tracer: blktrace.RequestTracer | None = None
        self.stat_path = SYS_BLOCK / device / "stat"
        name = f"linux.block.{device}"
        specs = specs_for(device)
        try:
            choices = {"scheduler": specs["scheduler"].kernel_choices()}
        except OSError as exc:
            raise UnavailableError(f"{name}: cannot read the scheduler list: {exc}") from None
        rules = parse_apply(apply, specs, name, choices)  # configuration errors first
        self.tracer = self._start_tracer(device, tracepoints)
        features = dict(FEATURES)
        if self.tracer is not None:
            features.update(dict.fromkeys(blktrace.TRACE_FEATURES, "float64"))
        try:
            self._setup(name=name, specs=specs, rules=rules, state_dir=state_dir,
                        tick_seconds=tick_seconds, measure_seconds=measure_seconds,
                        objective=objective, goal=goal, features=features, choices=choices)
        except BaseException:
            self._close_tracer()
            raise
        traced = "; read requests traced (block tracepoints)" if self.tracer else ""
        self.description = (f"Linux block device {device} (/sys/block/{device}/queue); "
                            f"features from /sys/block/{device}/stat{traced}; {self.safety}")

    @staticmethod
    def _start_tracer(device: str, tracepoints: bool | str) -> blktrace.RequestTracer | None:
        if tracepoints is False:
            return None
        why = blktrace.tracer_unavailable()
        tracer = None
        if why is None:
            try:
                tracer = blktrace.RequestTracer(device)
            except (SettingError, OSError) as exc:  # the loader did not build or attach
                why = str(exc)
        if why is None:
            return tracer
        if tracepoints is True:
            raise UnavailableError(f"linux.block.{device}: tracepoints = true, but {why}")
        log.warning("linux.block.%s: going on without block tracepoints: %s", device, why)
        return None

    def _close_tracer(self) -> None:
        if self.tracer is not None:
            self.tracer.close()

    def snapshot(self) -> dict | None:
        try:
            values = [int(v) for v in read_text(self.stat_path).split()]
        except (OSError, ValueError):
            return None
        values += [0] * (len(_STAT_FIELDS) - len(values))  # older kernels: fewer fields
        out: dict = dict(zip(_STAT_FIELDS, values, strict=False))
        if self.tracer is not None:
            out["trace"] = self.tracer.totals()
        return out

    def derive(self, before: dict, after: dict, seconds: float) -> dict[str, float]:
        def delta(key: str) -> float:
            return float(max(0, after[key] - before[key]))

        ms = seconds * 1000.0
        reads, writes = delta("read_ios"), delta("write_ios")
        read_bytes = delta("read_sectors") * SECTOR_BYTES
        write_bytes = delta("write_sectors") * SECTOR_BYTES
        out = {
            "reads_per_s": reads / seconds,
            "writes_per_s": writes / seconds,
            "read_merges_per_s": rate(before, after, "read_merges", seconds),
            "write_merges_per_s": rate(before, after, "write_merges", seconds),
            "flushes_per_s": rate(before, after, "flush_ios", seconds),
            "read_mb_per_s": read_bytes / 1e6 / seconds,
            "write_mb_per_s": write_bytes / 1e6 / seconds,
            "read_req_kb": read_bytes / 1024 / reads if reads else 0.0,
            "write_req_kb": write_bytes / 1024 / writes if writes else 0.0,
            "read_await_ms": delta("read_ticks") / reads if reads else 0.0,
            "write_await_ms": delta("write_ticks") / writes if writes else 0.0,
            "in_flight": float(after["in_flight"]),
            "util": min(1.0, delta("io_ticks") / ms),
            "queue_depth": delta("time_in_queue") / ms,
        }
        if self.tracer is not None:
            out.update(blktrace.derive_trace(before.get("trace"), after.get("trace"), seconds))
        return {name: float(out[name]) for name in self.features}

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._close_tracer()


def current_scheduler(device: str) -> str:
    """The device's scheduler now (for tests and tools)."""
    return parse_bracketed(read_text(SYS_BLOCK / device / "queue" / "scheduler"))[0]


DESCRIPTION = ("Linux block devices, one subsystem per disk: read_ahead_kb, nr_requests, "
               "scheduler; features from /sys/block/<dev>/stat")
defaults_from(SETTINGS, LinuxBlock.__init__)
described(SETTINGS["devices"], "\"auto\" or list of device names", default="auto")
#: the factory wants the state directory (the ledger of original knob values)
USES_STATE_DIR = True


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked settings and the subsystem names they make; SettingError.

    A named device must be a whole disk now; `apply` is checked against each
    device's hard bounds and the schedulers its kernel offers.  With
    `devices = "auto"` the names are those of today's disks.
    """
    kwargs = check_settings(settings, SETTINGS)
    check_measure(kwargs)
    devices = kwargs.get("devices", "auto")
    named = devices != "auto"
    for device in devices if named else auto_devices():
        if named and (not DEVICE_NAME.fullmatch(device)
                      or not (SYS_BLOCK / device / "stat").exists()):
            raise SettingError("devices", f"{device!r} is not a whole disk in {SYS_BLOCK}")
        specs = specs_for(device)
        try:
            choices = {"scheduler": specs["scheduler"].kernel_choices()}
        except OSError:
            continue  # not servable: the factory says so (named) or skips it (auto)
        name = f"linux.block.{device}"
        try:
            parse_apply(kwargs.get("apply"), specs, name, choices)
        except ValueError as exc:
            raise SettingError("apply", str(exc), str(exc).removeprefix(f"{name}: ")) from None
    names = [f"linux.block.{d}" for d in (devices if named else auto_devices())]
    return kwargs, names


def writes_kernel(settings: dict) -> bool:
    """Whether these settings are root's to load (and to unload): an `apply` table writes
    the queue's files, and `tracepoints` (true or "auto") has the daemon start its BPF
    loader as root, attaching programs to the block layer (red team B4: a member of the
    mount's group started root's loader this way)."""
    return bool(settings.get("apply") or settings.get("knobs")
                or settings.get("tracepoints", False) is not False)


def settings_for_name(name: str) -> dict | None:
    """`mkdir MOUNT/linux.block.<dev>`: the settings serving that one disk."""
    device = name.removeprefix("linux.block.")
    if device == name or not DEVICE_NAME.fullmatch(device):
        return None
    return {"devices": [device]}


def factory(settings: dict) -> list[LinuxBlock]:
    """`[[subsystem]] backend = "linux.block"`: one subsystem per device."""
    kwargs, _ = check(settings)
    devices = kwargs.pop("devices", "auto")
    if devices == "auto":
        # What the user did not name must not stop the mount: a disk that cannot
        # be served (an odd driver without nr_requests, a vanished device) is skipped.
        out = []
        for device in auto_devices():
            try:
                out.append(LinuxBlock(device, **kwargs))
            except UnavailableError as exc:  # configuration errors still stop the mount
                log.warning("linux.block: skipping %s: %s", device, exc)
        return out
    return [LinuxBlock(device, **kwargs) for device in devices]


def _example(env: ConformanceEnv) -> dict:
    """The conformance suite's instance: the suite's loop device, its readahead allowed."""
    if env.device is None:
        raise ExampleUnavailable("no block device to tune (a loop device needs root)")
    return {"devices": [env.device], "tick_seconds": 0.1, "measure_seconds": 0.0,
            "apply": {"read_ahead_kb": [16, 4096]}}


BACKEND = Backend(name="linux.block", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, uses_state_dir=USES_STATE_DIR,
                  kinds=("knob",), settings_for_name=settings_for_name,
                  writes_kernel=writes_kernel, example=_example)
