"""linux.vm: the kernel's memory management as an mlfs subsystem.

Features (per tick, measured over the window right after the knobs were
applied; rates are per second):

- /proc/vmstat rates: ``pgfault_per_s``, ``pgmajfault_per_s``,
  ``pswpin_per_s``, ``pswpout_per_s``, ``pgscan_kswapd_per_s``,
  ``pgscan_direct_per_s``, ``pgsteal_per_s``, ``allocstall_per_s``,
  ``refault_anon_per_s``, ``refault_file_per_s`` (workingset refaults: pages
  evicted too early, what swappiness and vfs_cache_pressure trade),
  ``dirtied_mb_per_s`` and ``written_mb_per_s`` (nr_dirtied / nr_written:
  pages dirtied in, and written back from, the page cache),
  ``block_read_mb_per_s`` and ``block_write_mb_per_s`` (pgpgin / pgpgout:
  what all block devices read and wrote, O_DIRECT included, so a phase of
  uncached reads is told apart from one of writes whatever the dirty
  settings);
- from /proc/<pid>/io (wchar, syscw) summed over the processes:
  ``write_kb_per_call`` (KiB per write(2) call, 0 with no calls),
  ``bulk_write_kb_per_call`` (the byte-weighted median of each process's
  KiB per call: the call size of the writers that carry the bytes, which
  other processes' small calls do not dilute; a window in which all
  processes together wrote under ``BULK_MIN_MB_PER_S`` keeps the previous
  window's value, the first window reads its own) and ``write_calls_per_s``.
  The size of an application's writes is its own choice, which no vm knob
  changes, while every kernel-side rate above moves with the dirty limits
  (a writer throttled by them dirties, writes back and stalls differently);
  so it tells a phase of 1 MiB checkpoint writes from one of 64 KiB scratch
  writes under any setting, and a checkpoint writer waiting in fdatasync
  (seconds in which only other processes' few KiB are written) stays the
  checkpoint phase.  A process that ends within a window is not counted; an
  unprivileged daemon sees its user's processes only;
- gauges: ``dirty_mb``, ``writeback_mb`` (/proc/meminfo Dirty, Writeback),
  ``dirty_threshold_mb`` (vmstat nr_dirty_threshold: what dirty_ratio
  means in bytes right now), ``mem_available_frac`` (MemAvailable /
  MemTotal), ``page_cache_frac`` (Cached / MemTotal), ``swap_used_frac``;
- PSI, for cpu, memory and io: ``psi_<r>_some_avg10``, ``psi_<r>_full_avg10``
  (the kernel's 10 s averages, %) and ``psi_<r>_some_stall_us_per_s``,
  ``psi_<r>_full_stall_us_per_s`` (the increase of ``total`` over the window:
  microseconds of stall per second, exact for the window, unlike avg10).

MB are 10^6 bytes.  A counter missing on this kernel reads 0.

Knobs (the vm.* sysctls): ``swappiness`` (0-200), ``dirty_ratio`` (1-100),
``dirty_background_ratio`` (1-100), ``vfs_cache_pressure`` (1-1000),
``dirty_expire_centisecs`` (10-360000: how old dirty data must be before the
flusher writes it) and ``dirty_writeback_centisecs`` (10-360000: how often the
flusher wakes; the kernel's 0, "never", is outside mlfs's bounds).  Writing
a ratio makes the kernel zero its ``*_bytes`` twin; if the system was using
the bytes form, the original recorded and restored is the bytes form.

Objective: by default ``psi_memory_some_stall_us_per_s`` with goal ``min``:
the time, per second, that at least one task was stalled waiting for memory
(reclaim, refaults, swap-in, throttling on dirty pages).  It is the kernel's
own account of what the vm knobs are there to reduce, it is measured exactly
over each tick's window, and it does not depend on how much work the
applications happen to do (a throughput would).  Any feature can be chosen
instead (``objective = "..."``, ``goal = "max" | "min"``), for instance
``psi_io_some_stall_us_per_s`` for a writeback-heavy machine.  Ticks with no
stall at all give 0 on both sides, which tells nothing: the efficiency is
only meaningful under memory pressure, which is when tuning matters.

Critical state: PSI memory or io ``full avg10`` above ``critical_full_avg10``
(default 20.0 %: a fifth of the time *all* non-idle tasks were stalled); the
proxy then runs the default algorithm (the original values) on every tick.
Set it to 100 to disable.

Configuration::

    [[subsystem]]
    backend = "linux.vm"
    name = "linux.vm"               # default
    tick_seconds = 1.0              # default
    measure_seconds = 0.8           # default 0.8 * tick_seconds; 0 = since last tick
    objective = "psi_memory_some_stall_us_per_s"
    goal = "min"
    critical_full_avg10 = 20.0
    apply = {swappiness = [10, 100], dirty_ratio = [5, 40]}   # default: observe-only

See backends/linux/__init__.py for what `apply` permits and the ledger that
restores every original value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mlfs.abi import (
    MAX_TICK_SECONDS,
    Backend,
    ConformanceEnv,
    Schema,
    SettingError,
    check_settings,
    defaults_from,
    number,
    table,
    text,
    tick_seconds,
    word,
)

from .files import (
    bulk_write_kb_per_call,
    read_key_values,
    read_psi,
    read_write_calls,
    write_calls_by_process,
)
from .knobs import KnobSpec, check_measure, parse_apply
from .subsystem import LinuxSubsystem, rate

__all__ = ["BACKEND", "FEATURES", "LinuxVM", "SPECS"]

SYSCTL = Path("/proc/sys/vm")
PAGE_BYTES = 4096
PSI_RESOURCES = ("cpu", "memory", "io")
#: below this, a window has no bulk writer: ``bulk_write_kb_per_call`` keeps its last
#: value.  Seconds of a checkpoint writer waiting in fdatasync wrote 0-0.3 MB/s (a
#: daemon's log, a metrics agent; at most 3.8 MB/s in 134 such windows), the fio phases
#: themselves 3.7-2,600 MB/s (docs/results/dirty-ratios.md, "Windows without the writer")
BULK_MIN_MB_PER_S = 1.0

SPECS: dict[str, KnobSpec] = {
    "swappiness": KnobSpec("swappiness", SYSCTL / "swappiness", lo=0, hi=200),
    # settle_ticks: dirty pages let in under one value are written back over the next
    # flusher periods (dirty_writeback_centisecs 5 s): 5 ticks at the default 1 s tick
    "dirty_ratio": KnobSpec("dirty_ratio", SYSCTL / "dirty_ratio", lo=1, hi=100, unit="%",
                            alt_path=SYSCTL / "dirty_bytes", settle_ticks=5),
    "dirty_background_ratio": KnobSpec("dirty_background_ratio",
                                       SYSCTL / "dirty_background_ratio", lo=1, hi=100,
                                       unit="%", alt_path=SYSCTL / "dirty_background_bytes",
                                       settle_ticks=5),
    "vfs_cache_pressure": KnobSpec("vfs_cache_pressure", SYSCTL / "vfs_cache_pressure",
                                   lo=1, hi=1000),
    # 0 would mean "never" for the flusher's wake-up: the bounds keep writeback running
    "dirty_expire_centisecs": KnobSpec("dirty_expire_centisecs",
                                       SYSCTL / "dirty_expire_centisecs", lo=10, hi=360000,
                                       unit="cs"),
    "dirty_writeback_centisecs": KnobSpec("dirty_writeback_centisecs",
                                          SYSCTL / "dirty_writeback_centisecs", lo=10,
                                          hi=360000, unit="cs"),
}

#: feature <- vmstat counter(s), as per-second rates
_VMSTAT_RATES: dict[str, tuple[str, ...]] = {
    "pgfault_per_s": ("pgfault",),
    "pgmajfault_per_s": ("pgmajfault",),
    "pswpin_per_s": ("pswpin",),
    "pswpout_per_s": ("pswpout",),
    "pgscan_kswapd_per_s": ("pgscan_kswapd",),
    "pgscan_direct_per_s": ("pgscan_direct",),
    "pgsteal_per_s": ("pgsteal_kswapd", "pgsteal_direct", "pgsteal_khugepaged",
                      "pgsteal_proactive"),
    "allocstall_per_s": ("allocstall_dma", "allocstall_dma32", "allocstall_normal",
                         "allocstall_movable", "allocstall_device"),
    "refault_anon_per_s": ("workingset_refault_anon",),
    "refault_file_per_s": ("workingset_refault_file",),
}

FEATURES: dict[str, str] = {
    **{name: "float64" for name in _VMSTAT_RATES},
    "dirtied_mb_per_s": "float64",
    "written_mb_per_s": "float64",
    "block_read_mb_per_s": "float64",
    "block_write_mb_per_s": "float64",
    "write_kb_per_call": "float64",
    "bulk_write_kb_per_call": "float64",
    "write_calls_per_s": "float64",
    "dirty_mb": "float64",
    "writeback_mb": "float64",
    "dirty_threshold_mb": "float64",
    "mem_available_frac": "float64",
    "page_cache_frac": "float64",
    "swap_used_frac": "float64",
    **{f"psi_{r}_{kind}_avg10": "float64" for r in PSI_RESOURCES for kind in ("some", "full")},
    **{f"psi_{r}_{kind}_stall_us_per_s": "float64"
       for r in PSI_RESOURCES for kind in ("some", "full")},
}

#: `[[subsystem]] backend = "linux.vm"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "tick_seconds": tick_seconds(),
    "measure_seconds": number(0.0, MAX_TICK_SECONDS),  # and <= tick_seconds
    "objective": word(*FEATURES),
    "goal": word("max", "min"),
    "critical_full_avg10": number(0.0, 100.0),  # PSI avg10 is a percentage
    "apply": table(),
}


class LinuxVM(LinuxSubsystem):
    """vm.* sysctls with features from vmstat, meminfo and PSI."""

    backend = "linux.vm"
    UNITS = {
        **{name: "1/s" for name in _VMSTAT_RATES},
        "dirtied_mb_per_s": "MB/s", "written_mb_per_s": "MB/s", "dirty_mb": "MB",
        "block_read_mb_per_s": "MB/s", "block_write_mb_per_s": "MB/s",
        "write_kb_per_call": "KiB", "bulk_write_kb_per_call": "KiB",
        "write_calls_per_s": "1/s",
        "writeback_mb": "MB", "dirty_threshold_mb": "MB",
        **{f"psi_{r}_{k}_avg10": "%" for r in PSI_RESOURCES for k in ("some", "full")},
        **{f"psi_{r}_{k}_stall_us_per_s": "us/s" for r in PSI_RESOURCES
           for k in ("some", "full")},
    }

    def __init__(self, name: str = "linux.vm", tick_seconds: float = 1.0,
                 measure_seconds: float | None = None,
                 objective: str = "psi_memory_some_stall_us_per_s", goal: str = "min",
                 critical_full_avg10: float = 20.0, apply: Mapping | None = None,
                 state_dir: str | Path | None = None) -> None:
        rules = parse_apply(apply, SPECS, name)
        self.critical_full_avg10 = float(critical_full_avg10)
        self._setup(name=name, specs=SPECS, rules=rules, state_dir=state_dir,
                    tick_seconds=tick_seconds, measure_seconds=measure_seconds,
                    objective=objective, goal=goal, features=FEATURES, choices={})
        #: the last window's bulk writer's call size, held over windows without one
        self._bulk_kb: float | None = None
        self.description = (
            "Linux memory management (vm.* sysctls); features from /proc/vmstat, "
            f"/proc/meminfo and /proc/pressure; {self.safety}"
        )

    def snapshot(self) -> dict | None:
        try:
            vmstat = read_key_values("/proc/vmstat")
            meminfo = read_key_values("/proc/meminfo")
        except OSError:
            return None
        psi = {r: read_psi(r) for r in PSI_RESOURCES}
        return {"vmstat": vmstat, "meminfo": meminfo, "psi": psi,
                "writes": read_write_calls()}

    def derive(self, before: dict, after: dict, seconds: float) -> dict[str, float]:
        v0, v1, mem = before["vmstat"], after["vmstat"], after["meminfo"]
        out: dict[str, float] = {}
        for feature, counters in _VMSTAT_RATES.items():
            out[feature] = sum(rate(v0, v1, c, seconds) for c in counters)
        mb = PAGE_BYTES / 1e6
        out["dirtied_mb_per_s"] = rate(v0, v1, "nr_dirtied", seconds) * mb
        out["written_mb_per_s"] = rate(v0, v1, "nr_written", seconds) * mb
        # pgpgin/pgpgout count KiB of bios submitted (every block device)
        out["block_read_mb_per_s"] = rate(v0, v1, "pgpgin", seconds) * 1024 / 1e6
        out["block_write_mb_per_s"] = rate(v0, v1, "pgpgout", seconds) * 1024 / 1e6
        writes = write_calls_by_process(before["writes"], after["writes"])
        nbytes = sum(written for written, _ in writes)
        ncalls = sum(calls for _, calls in writes)
        out["write_kb_per_call"] = nbytes / ncalls / 1024 if ncalls else 0.0
        if self._bulk_kb is None or nbytes >= BULK_MIN_MB_PER_S * 1e6 * seconds:
            self._bulk_kb = bulk_write_kb_per_call(writes)
        out["bulk_write_kb_per_call"] = self._bulk_kb
        out["write_calls_per_s"] = ncalls / seconds
        out["dirty_mb"] = mem.get("Dirty", 0) * 1024 / 1e6
        out["writeback_mb"] = mem.get("Writeback", 0) * 1024 / 1e6
        out["dirty_threshold_mb"] = v1.get("nr_dirty_threshold", 0) * mb
        total = mem.get("MemTotal", 0)
        out["mem_available_frac"] = mem.get("MemAvailable", 0) / total if total else 0.0
        out["page_cache_frac"] = mem.get("Cached", 0) / total if total else 0.0
        swap = mem.get("SwapTotal", 0)
        out["swap_used_frac"] = (swap - mem.get("SwapFree", 0)) / swap if swap else 0.0
        for r in PSI_RESOURCES:
            p0, p1 = before["psi"][r], after["psi"][r]
            for kind in ("some", "full"):
                out[f"psi_{r}_{kind}_avg10"] = float(p1[f"{kind}_avg10"])
                out[f"psi_{r}_{kind}_stall_us_per_s"] = rate(p0, p1, f"{kind}_total",
                                                             seconds)
        return {name: float(out[name]) for name in FEATURES}

    def critical_state(self, features: dict[str, float]) -> str | None:
        level = self.critical_full_avg10
        for r in ("memory", "io"):
            value = features[f"psi_{r}_full_avg10"]
            if value > level:
                return f"PSI {r} full avg10 {value:.2f} > {level:.2f}"
        return None


DESCRIPTION = ("Linux memory management: vm.* sysctls, features from /proc/vmstat, "
               "/proc/meminfo and /proc/pressure")
defaults_from(SETTINGS, LinuxVM.__init__)
#: the factory wants the state directory (the ledger of original knob values)
USES_STATE_DIR = True


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked constructor arguments and the one subsystem name; SettingError."""
    kwargs = check_settings(settings, SETTINGS)
    name = kwargs.get("name", "linux.vm")
    check_measure(kwargs)
    try:
        parse_apply(kwargs.get("apply"), SPECS, name)
    except ValueError as exc:
        raise SettingError("apply", str(exc), str(exc).removeprefix(f"{name}: ")) from None
    return kwargs, [name]


def factory(settings: dict) -> list[LinuxVM]:
    """`[[subsystem]] backend = "linux.vm"`: one subsystem."""
    kwargs, _ = check(settings)
    return [LinuxVM(**kwargs)]


def _example(env: ConformanceEnv) -> dict:
    """The conformance suite's instance: one sysctl to write (and put back)."""
    return {"tick_seconds": 0.1, "measure_seconds": 0.0, "apply": {"swappiness": [0, 200]}}


BACKEND = Backend(name="linux.vm", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, uses_state_dir=USES_STATE_DIR,
                  kinds=("knob",), example=_example)
