"""`mlfs bench`: what the exchange costs a user, as ratios to same-run references.

The machine this runs on is shared and noisy, so no figure is reported alone:
every throughput or latency is paired with a reference measured in the same
run, interleaved with it (reference, then mount, rep after rep), repeated, and
reported as median with min-max (and quartiles in the JSON).  Ratios are
always "speed through mlfs / speed of the reference" (1.0 = as fast as the
reference, higher is better), computed per interleaved pair, so drift on the
machine cancels out instead of landing on one side.

What is measured, and against what (the issue's table):

- dataset read, first and repeated: a >= 256 MiB portion (64 MiB with
  --quick) written into the state directory before mounting (the store
  recovers it) and read through the mount, against the same file read from
  the state directory, warm.  Each "first" repetition is a new mount: a new
  FUSE superblock has an empty page cache, while the state file stays warm.
- Polars and DuckDB queries over `dataset/*.parquet`, against the same query
  on the state directory's files.
- control write round trip: open/write/close of a recommendation, p50/p99,
  against the same on a tmpfs file; and once more with the state directory
  on tmpfs (a diagnostic row: the same FUSE path without a disk fsync).
- event wake-up: a recommendation write to a separate poll()ing process's
  line, p50/p99 (both sides stamp CLOCK_MONOTONIC, which is system-wide),
  against the same poller woken through a FIFO (this machine's wake-up cost,
  now).
- ingest: `SubsystemRuntime.tick()` + sealing in-process, against pyarrow
  writing the same rows to files in the same batches.
- footprint: daemon CPU and RSS from /proc/<pid> with three subsystems at one
  tick per second.
- concurrency: 32 dataset readers, 8 event readers and 1 recommendation writer
  at once; no error, no lost event, no wedge.

Every mount the bench starts is ended by its pid and unmounted; the temporary
directory is removed, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .client import EventStream, MountProcess, write_line

MB = 1_000_000
MiB = 1 << 20
SUBSYSTEMS = ("sim.readahead", "sim.readahead-2", "sim.readahead-3")
BIG = SUBSYSTEMS[0]  # holds the big portion; nothing else touches its dataset
STEER = SUBSYSTEMS[1]  # control writes, events and the concurrency writer go here
PORTION = "0000000001.parquet"
MODEL = "bench"
SENTINEL_MODEL = "bench-end"
RA_VALUES = (0, 16, 64, 128, 256, 512, 1024, 2048, 4096)


# ---- plan ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How much one run does: the full run, or --quick for CI (under a minute)."""

    quick: bool
    file_mib: int
    cold_reps: int
    warm_per_mount: int
    query_reps: int
    control_rounds: int
    control_writes: int
    event_rounds: int
    event_writes: int
    concurrency_seconds: float
    ingest_reps: int
    ingest_ticks: int
    footprint_warmup: float
    footprint_windows: int
    footprint_window_seconds: float


#: the footprint mount seals every 10 s (the default); its warm-up runs past the first
#: seal, whose one-off imports are start-up cost, not the steady state measured
FOOTPRINT_SEAL_SECONDS = 10.0
FULL = Plan(quick=False, file_mib=256, cold_reps=5, warm_per_mount=2, query_reps=7,
            control_rounds=5, control_writes=1000, event_rounds=5, event_writes=200,
            concurrency_seconds=30.0, ingest_reps=5, ingest_ticks=20_000,
            footprint_warmup=12.0, footprint_windows=6, footprint_window_seconds=10.0)
QUICK = Plan(quick=True, file_mib=64, cold_reps=3, warm_per_mount=2, query_reps=3,
             control_rounds=3, control_writes=200, event_rounds=3, event_writes=50,
             concurrency_seconds=5.0, ingest_reps=3, ingest_ticks=4_000,
             footprint_warmup=12.0, footprint_windows=3, footprint_window_seconds=3.0)


# ---- statistics ------------------------------------------------------------------------
def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of a non-empty list."""
    vals = sorted(values)
    if len(vals) == 1:
        return vals[0]
    k = (len(vals) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def summarize(values: list[float]) -> dict[str, Any]:
    """Median, min-max and quartiles of repetitions: the spread is the point."""
    if not values:
        raise ValueError("no repetitions to summarize")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "q1": percentile(values, 25),
        "q3": percentile(values, 75),
        "n": len(values),
        "values": [round(v, 6) for v in values],
    }


@dataclass
class Row:
    """One line of the report: measured figures, the same-run reference, the ratio."""

    key: str
    what: str
    measured: dict[str, dict[str, Any]]
    reference: dict[str, dict[str, Any]] | None
    ratio: dict[str, Any] | None
    target: str
    met: bool | None
    note: str = ""
    skipped: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ---- progress and small helpers --------------------------------------------------------
_T0 = time.monotonic()


def progress(message: str) -> None:
    """One line per step on stderr, so a long run is visibly alive."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def fuse_unavailable() -> str | None:
    """Why a mount cannot be started here (None when it can), as tests/conftest.py."""
    if os.geteuid() != 0:
        return "mlfs bench mounts with allow_other and needs root"
    if not os.path.exists("/dev/fuse"):
        return "mlfs bench needs /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "mlfs bench needs fusermount3 (Debian package fuse3)"
    return None


def read_whole(path: Path, buf: bytearray) -> tuple[int, float]:
    """Bytes and seconds to read `path` with 1 MiB read(2)s into one buffer (dd bs=1M)."""
    total = 0
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            total += n
    return total, time.perf_counter() - started


def echo(path: str, data: bytes) -> None:
    """What `echo x > path` does: open(O_WRONLY|O_CREAT|O_TRUNC), one write, close."""
    write_line(path, data, create=True)


def recommendation(rng: random.Random) -> bytes:
    return f"read_ahead_kb={rng.choice(RA_VALUES)}\n".encode()


def tmpfs_dir() -> Path | None:
    """/dev/shm when it is a writable tmpfs (the tmpfs references), else None."""
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "tmpfs" and parts[1] == "/dev/shm":
                    if os.access(parts[1], os.W_OK):
                        return Path(parts[1])
    except OSError:
        pass
    return None


# ---- mounts ----------------------------------------------------------------------------
def mount_config(seal_seconds: float) -> str:
    """Three sim.readahead subsystems at one tick per second (the footprint case)."""
    text = f"""
[mount]
allow_other = true
max_tasks = 512

[store]
seal_seconds = {float(seal_seconds)!r}
retention_bytes = {1 << 40}
retention_count = 100000

[modes]
silence_seconds = 3600.0
"""
    for seed, name in enumerate(SUBSYSTEMS):
        text += f"""
[[subsystem]]
backend = "sim.readahead"
name = "{name}"
seed = {seed}
tick_seconds = 1.0
"""
    return text


class BenchMount(MountProcess):
    """One daemon started with `mlfs mount` (as a user would) and ended by its pid;
    its CPU and memory from /proc, and the mount's bdi read-ahead."""

    def __init__(self, root: Path, name: str, config: str, state_dir: Path) -> None:
        (root / name).mkdir(exist_ok=True)
        (root / f"{name}.toml").write_text(config)
        super().__init__(root / name, state_dir, root / f"{name}.toml")
        self.read_ahead_kb: int | None = None

    def start(self) -> BenchMount:
        super().start()
        dev = os.stat(self.mountpoint).st_dev
        with contextlib.suppress(OSError, ValueError):
            bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
            self.read_ahead_kb = int(bdi.read_text())
        return self

    def cpu_seconds(self) -> float:
        """utime + stime of the daemon, dead threads included (/proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_kb(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(value.split()[0])
        return out


class Session:
    """The temporary root and every mount in it, so cleanup cannot miss one."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mlfs-bench-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.mounts: list[BenchMount] = []
        self.scratch_dirs: list[Path] = []

    def scratch(self, parent: Path | None) -> Path:
        """A temporary directory under `parent` (e.g. tmpfs), removed with the session."""
        if parent is None:
            path = Path(tempfile.mkdtemp(prefix="scratch-", dir=self.root))
        else:
            path = Path(tempfile.mkdtemp(prefix="mlfs-bench-", dir=parent))
        self.scratch_dirs.append(path)
        return path

    def mount(self, name: str, config: str, state_dir: Path) -> BenchMount:
        m = BenchMount(self.root, name, config, state_dir)
        self.mounts.append(m)
        return m.start()

    def close(self) -> None:
        for m in self.mounts:
            try:
                m.stop()
            except Exception as exc:  # cleanup goes on for the others
                progress(f"cleanup: {m.mountpoint}: {exc}")
        for path in self.scratch_dirs:
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)


# ---- the big portion -------------------------------------------------------------------
def dataset_schema():
    """The dataset schema exactly as the proxy builds it for sim.readahead."""
    from mlfs.backends.sim_readahead import SimReadahead

    from .config import load_config
    from .core.exchange import Exchange

    with tempfile.TemporaryDirectory(prefix="mlfs-bench-schema-") as scratch:
        exchange = Exchange(load_config(None), Path(scratch), [SimReadahead()])
        try:
            return exchange.runtimes["sim.readahead"].dataset_schema()
        finally:
            exchange.close()


def write_portion(path: Path, target_bytes: int, seed: int = 0) -> int:
    """A portion of random, poorly compressible rows with the dataset schema.

    Numbers are uniform random (zstd cannot shrink them), so the file on disk
    is as big as the data and every byte has to cross FUSE.  Row groups of
    128 Ki rows, as a long-running subsystem's readers would meet after
    compaction.  Written to a tmp name, fsynced, renamed: a complete file
    before its name exists, like the store's own portions.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = dataset_schema()
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    group = 131_072
    tick = 0
    modes = ["learning", "collaboration", "recommendation", "emergency", "default"]
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        while tick == 0 or tmp.stat().st_size < target_bytes:
            ticks = np.arange(tick, tick + group, dtype=np.int64)
            columns = []
            for f in schema:
                if f.name == "ts":
                    values = pa.array(1_700_000_000_000_000 + ticks * 1_000_000, type=f.type)
                elif f.name == "tick":
                    values = pa.array(ticks, type=f.type)
                elif f.name == "controller":
                    values = pa.array(rng.choice(["default", "ml"], group))
                elif f.name == "model":
                    values = pa.array(rng.choice(["lgbm", "bench"], group))
                elif f.name == "mode":
                    values = pa.array(rng.choice(modes, group))
                elif pa.types.is_integer(f.type):
                    values = pa.array(rng.integers(0, 1 << 40, group), type=f.type)
                else:
                    values = pa.array(rng.random(group), type=f.type)
                columns.append(values)
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
            tick += group
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return tick


def same_bytes(a: Path, b: Path, size: int) -> bool:
    """Spot-check that the mount serves the state file's bytes (start, middle, end)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for off in (0, size // 2, max(0, size - MiB)):
            fa.seek(off)
            fb.seek(off)
            if fa.read(MiB) != fb.read(MiB):
                return False
    return True


# ---- dataset reads ---------------------------------------------------------------------
def bench_reads(session: Session, plan: Plan, state_dir: Path, config: str,
                extra: dict[str, Any]) -> tuple[list[Row], BenchMount]:
    """First and repeated reads through new mounts, each paired with a warm state read."""
    state_file = state_dir / BIG / "dataset" / PORTION
    size = state_file.stat().st_size
    buf = bytearray(MiB)
    for _ in range(2):  # the reference is the state file *warm* in the page cache
        read_whole(state_file, buf)
    # a second, diagnostic reference: the same bytes on tmpfs (4 KiB pages, like the
    # mount's page cache, where the state directory's filesystem may use large folios)
    shm = tmpfs_dir()
    shm_copy = session.scratch(shm) / PORTION if shm else None
    if shm_copy is not None:
        try:
            shutil.copyfile(state_file, shm_copy)
            read_whole(shm_copy, buf)
            read_whole(shm_copy, buf)
        except OSError as exc:  # e.g. a small /dev/shm: the diagnostic is optional
            progress(f"reads: no tmpfs copy ({exc})")
            shm_copy.unlink(missing_ok=True)
            shm_copy = None
    first, first_ref, first_ratio = [], [], []
    again, again_ref, again_ratio = [], [], []
    again_shm, again_shm_ratio = [], []
    starts, read_ahead = [], set()
    mount: BenchMount | None = None
    for rep in range(plan.cold_reps):
        if mount is not None:
            mount.stop()
        mount = session.mount("mnt", config, state_dir)
        starts.append(mount.start_seconds)
        read_ahead.add(mount.read_ahead_kb)
        mounted = mount.mountpoint / BIG / "dataset" / PORTION
        if os.stat(mounted).st_size != size:
            raise RuntimeError(f"{mounted}: size differs from the state file")
        n, ref_s = read_whole(state_file, buf)
        m, cold_s = read_whole(mounted, buf)
        if m != n:
            raise RuntimeError(f"{mounted}: read {m} bytes, the state file has {n}")
        first_ref.append(n / ref_s / MB)
        first.append(m / cold_s / MB)
        first_ratio.append(first[-1] / first_ref[-1])
        # one untimed pass, as the reference had: a page's second access moves it to
        # the active LRU list, work the reference already did in its warm-up
        read_whole(mounted, buf)
        for _ in range(plan.warm_per_mount):
            n, ref_s = read_whole(state_file, buf)
            m, warm_s = read_whole(mounted, buf)
            again_ref.append(n / ref_s / MB)
            again.append(m / warm_s / MB)
            again_ratio.append(again[-1] / again_ref[-1])
            if shm_copy is not None:
                k, shm_s = read_whole(shm_copy, buf)
                again_shm.append(k / shm_s / MB)
                again_shm_ratio.append(again[-1] / again_shm[-1])
        progress(f"reads: mount {rep + 1}/{plan.cold_reps}: first {first[-1]:.0f} MB/s, "
                 f"repeated {again[-1]:.0f} MB/s, state file {first_ref[-1]:.0f} MB/s")
    assert mount is not None
    if shm_copy is not None:
        shm_copy.unlink()
    if not same_bytes(state_file, mount.mountpoint / BIG / "dataset" / PORTION, size):
        raise RuntimeError("the mount served different bytes than the state file holds")
    extra["portion_bytes"] = size
    extra["mount_start_seconds"] = summarize(starts)
    extra["mount_read_ahead_kb"] = sorted(v for v in read_ahead if v is not None)
    note = (f"{size / MiB:.0f} MiB portion, 1 MiB read(2)s; each 'first' is a new mount; "
            f"mount bdi read_ahead_kb={'/'.join(map(str, extra['mount_read_ahead_kb']))}")
    repeat_reference = {"MB/s": summarize(again_ref)}
    repeat_note = (f"{plan.warm_per_mount} timed passes per mount after one untimed pass (as "
                   "the reference had); reference: the state file, warm")
    if again_shm:
        repeat_reference["tmpfs copy MB/s"] = summarize(again_shm)
        repeat_note += (f"; against a tmpfs copy (diagnostic): "
                        f"{statistics.median(again_shm_ratio):.3g}× "
                        f"[{min(again_shm_ratio):.3g}–{max(again_shm_ratio):.3g}]")
        extra["read_repeat_vs_tmpfs"] = summarize(again_shm_ratio)
    rows = [
        Row("read_first", "dataset read, first through the mount",
            {"MB/s": summarize(first)}, {"MB/s": summarize(first_ref)},
            summarize(first_ratio), "≥ 0.5×", statistics.median(first_ratio) >= 0.5,
            note + "; reference: the state file, warm"),
        Row("read_repeat", "dataset read, repeated (mount's page cache warm)",
            {"MB/s": summarize(again)}, repeat_reference,
            summarize(again_ratio), "≥ 0.9×", statistics.median(again_ratio) >= 0.9,
            repeat_note),
    ]
    return rows, mount


# ---- queries ---------------------------------------------------------------------------
QUERY_COLUMNS = ("requests", "offset_mean_abs_delta", "offset_log_variance", "sequential_ratio",
                 "major_faults", "cache_hit_ratio", "mem_pressure", "current_ra_kb",
                 "knob_read_ahead_kb", "objective")


def polars_query(directory: Path) -> tuple[float, int]:
    """Seconds for a per-controller aggregate over every feature column (a trainer's scan)."""
    import polars as pl

    started = time.perf_counter()
    frame = (pl.scan_parquet(str(directory / "*.parquet"))
             .group_by("controller")
             .agg([pl.len().alias("rows")] + [pl.col(c).mean() for c in QUERY_COLUMNS])
             .collect())
    return time.perf_counter() - started, int(frame["rows"].sum())


def duckdb_query(directory: Path) -> tuple[float, int]:
    """The same aggregate in DuckDB (its own Parquet reader, its own I/O pattern)."""
    import duckdb

    averages = ", ".join(f"avg({c})" for c in QUERY_COLUMNS)
    sql = (f"SELECT controller, count(*) AS n, {averages} "
           f"FROM read_parquet('{directory}/*.parquet') GROUP BY controller")
    con = duckdb.connect()
    try:
        started = time.perf_counter()
        result = con.execute(sql).fetchall()
        seconds = time.perf_counter() - started
    finally:
        con.close()
    return seconds, sum(int(r[1]) for r in result)


def bench_query(name: str, fn: Callable[[Path], tuple[float, int]], mounted: Path,
                state: Path, reps: int) -> Row:
    """Interleaved repetitions after one warm-up each: a trainer re-reading its data."""
    key = f"query_{name.lower()}"
    what = f"{name} query over dataset/*.parquet"
    try:
        fn(state)
        fn(mounted)
    except ImportError as exc:
        return Row(key, what, {}, None, None, "≥ 0.8×", None, skipped=f"not installed: {exc}")
    through, direct, ratios = [], [], []
    for _ in range(reps):
        ref_s, ref_rows = fn(state)
        mnt_s, mnt_rows = fn(mounted)
        if ref_rows != mnt_rows:
            raise RuntimeError(f"{name}: {mnt_rows} rows through the mount, {ref_rows} direct")
        direct.append(ref_s)
        through.append(mnt_s)
        ratios.append(ref_s / mnt_s)
    progress(f"{name}: {statistics.median(through):.3f} s through the mount, "
             f"{statistics.median(direct):.3f} s on the state directory")
    return Row(key, what, {"seconds": summarize(through)}, {"seconds": summarize(direct)},
               summarize(ratios), "≥ 0.8×", statistics.median(ratios) >= 0.8,
               f"{ref_rows} rows, all feature columns; warm; reference: the state directory's "
               "files; ratio = reference time / mount time")


# ---- control writes and event wake-up --------------------------------------------------
def setup_model(mountpoint: Path) -> Path:
    """mkdir models/bench && echo start > control: a model that accepts recommendations."""
    model = mountpoint / STEER / "models" / MODEL
    if not model.exists():
        os.mkdir(model)
    echo(str(model / "control"), b"start\n")
    return model


def latency_summary(rounds: list[list[float]]) -> dict[str, dict[str, Any]]:
    """Per-round p50 and p99 (ms): the rounds are the repetitions."""
    return {
        "p50 ms": summarize([percentile(r, 50) * 1e3 for r in rounds]),
        "p99 ms": summarize([percentile(r, 99) * 1e3 for r in rounds]),
    }


def bench_control(session: Session, model: Path, plan: Plan, key: str = "control_write",
                  what: str = "control write round trip (open/write/close of recommend)",
                  judged: bool = True) -> Row:
    """echo-like writes to `recommend` vs the same on a tmpfs file, round by round."""
    rng = random.Random(1)
    recommend = str(model / "recommend")
    shm = tmpfs_dir()
    reference_path = str(session.scratch(shm) / "recommend")
    for _ in range(20):  # warm-up: dentries, the journal file, both paths
        echo(recommend, recommendation(rng))
        echo(reference_path, recommendation(rng))
    mount_rounds: list[list[float]] = []
    ref_rounds: list[list[float]] = []
    sync_rounds: list[list[float]] = []
    # what one durable append costs on the state directory's filesystem right now: the
    # journal does this (fdatasync) before an accepted recommendation's write returns
    journal = os.open(session.scratch(None) / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for index in range(plan.control_rounds):
            for target, out in ((reference_path, ref_rounds), (recommend, mount_rounds)):
                samples = []
                for _ in range(plan.control_writes):
                    data = recommendation(rng)
                    started = time.perf_counter()
                    echo(target, data)
                    samples.append(time.perf_counter() - started)
                out.append(samples)
            if judged:
                samples = []
                for _ in range(max(50, plan.control_writes // 5)):
                    started = time.perf_counter()
                    os.write(journal, b'{"seq":1,"line":"read_ahead_kb=256"}\n')
                    os.fdatasync(journal)
                    samples.append(time.perf_counter() - started)
                sync_rounds.append(samples)
            progress(f"{key}: round {index + 1}/{plan.control_rounds}: "
                     f"p50 {percentile(mount_rounds[-1], 50) * 1e6:.0f} us, "
                     f"p99 {percentile(mount_rounds[-1], 99) * 1e6:.0f} us "
                     f"(tmpfs p50 {percentile(ref_rounds[-1], 50) * 1e6:.0f} us)")
    finally:
        os.close(journal)
    measured = latency_summary(mount_rounds)
    reference = latency_summary(ref_rounds)
    if sync_rounds:
        fsync = latency_summary(sync_rounds)
        reference["state-dir fdatasync p50 ms"] = fsync["p50 ms"]
        reference["state-dir fdatasync p99 ms"] = fsync["p99 ms"]
    ratios = [percentile(r, 50) / percentile(m, 50) for r, m in zip(ref_rounds, mount_rounds,
                                                                     strict=True)]
    pooled = [s for r in mount_rounds for s in r]
    return Row(key, what, measured, reference, summarize(ratios),
               "report; p99 ≤ 1 ms" if judged else "report (diagnostic)",
               measured["p99 ms"]["median"] <= 1.0 if judged else None,
               f"{plan.control_rounds} rounds x {plan.control_writes} writes; reference: "
               f"{'a tmpfs file' if shm else 'a file in the bench directory (no tmpfs)'}; "
               "ratio = tmpfs p50 / mount p50; " + (
                   "an accepted write fdatasyncs the journal on disk before it returns (twice "
                   "when it supersedes the previous recommendation)" if judged
                   else "the journal's fsync goes to tmpfs and costs ~nothing"),
               extra={"pooled_p50_ms": percentile(pooled, 50) * 1e3,
                      "pooled_p99_ms": percentile(pooled, 99) * 1e3,
                      "pooled_max_ms": max(pooled) * 1e3})


_POLLER = r"""
import os, select, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
poller = select.poll()
poller.register(fd, select.POLLIN)
sys.stdout.write("ready\n")
sys.stdout.flush()
rest = b""
while True:
    poller.poll()
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        continue
    now, wall = time.monotonic_ns(), time.time_ns()
    if not data:
        break
    rest += data
    *lines, rest = rest.split(b"\n")
    sys.stdout.write("".join(f"{now} {wall} {line.decode()}\n" for line in lines))
    sys.stdout.flush()
"""


class LineReader:
    """Lines from a child's stdout with a timeout (select on the pipe)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def _rfc3339_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch_us(rfc3339: str) -> int:
    stamp = _dt.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC)
    return (stamp - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)) // _dt.timedelta(microseconds=1)


class Poller:
    """A separate process poll()ing one file and stamping each line it reads."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _POLLER, str(path)],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.reader = LineReader(self.proc)
        if self.reader.line(30) != "ready":
            self.close()
            raise RuntimeError(f"the poller of {path} did not start")

    def wait_accepted(self, sent_ns: int) -> tuple[float, float] | None:
        """(write start -> line, event ts -> line) in seconds for the next accepted line."""
        while True:
            line = self.reader.line(5.0)
            if line is None:
                return None
            mono, wall, text = line.split(" ", 2)
            event = json.loads(text)
            if event.get("event") == "recommendation" and event.get("status") == "accepted" \
                    and event.get("model") == MODEL:
                return ((int(mono) - sent_ns) / 1e9,
                        (int(wall) // 1000 - _epoch_us(event["ts"])) / 1e6)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def bench_events(session: Session, mountpoint: Path, model: Path, plan: Plan) -> Row:
    """A recommendation write to the line in a separate poll()ing process.

    Two clocks: write start -> line (CLOCK_MONOTONIC on both sides), what a
    trainer waits, including the write's journal fsync; and the event's own
    `ts` -> line (CLOCK_REALTIME), the wake-up path alone (poll notify, the
    reader's poll() returning, its read()).  The same-run reference is the same
    poller woken through a FIFO: what waking another process costs on this
    machine right now, which on a loaded two-CPU host is most of the tail.
    """
    rng = random.Random(2)
    fifo = session.scratch(None) / "events.fifo"
    os.mkfifo(fifo)
    fifo_fd = os.open(fifo, os.O_RDWR)  # a writer always exists: poll() blocks until data

    def via_fifo() -> None:
        event = {"seq": 0, "ts": _rfc3339_now(), "event": "recommendation",
                 "status": "accepted", "model": MODEL}
        os.write(fifo_fd, (json.dumps(event) + "\n").encode())

    def via_mount() -> None:
        echo(str(model / "recommend"), recommendation(rng))

    pollers: list[Poller] = []
    results: dict[str, tuple[list[list[float]], list[list[float]]]] = {
        "fifo": ([], []), "mount": ([], [])}
    missed = 0
    try:
        pollers = [Poller(fifo), Poller(mountpoint / STEER / "events")]
        time.sleep(0.2)
        for index in range(plan.event_rounds):
            for name, poller, trigger in (("fifo", pollers[0], via_fifo),
                                          ("mount", pollers[1], via_mount)):
                samples, wake = [], []
                for _ in range(plan.event_writes):
                    time.sleep(rng.uniform(0.002, 0.006))  # the reader is idle in poll()
                    sent = time.monotonic_ns()
                    trigger()
                    got = poller.wait_accepted(sent)
                    if got is None:
                        missed += 1
                        continue
                    samples.append(got[0])
                    wake.append(got[1])
                results[name][0].append(samples)
                results[name][1].append(wake)
            mount = results["mount"][0][-1]
            progress(f"event wake-up: round {index + 1}/{plan.event_rounds}: "
                     f"p50 {percentile(mount, 50) * 1e6:.0f} us, "
                     f"p99 {percentile(mount, 99) * 1e6:.0f} us (FIFO p99 "
                     f"{percentile(results['fifo'][0][-1], 99) * 1e6:.0f} us)")
    finally:
        for poller in pollers:
            poller.close()
        os.close(fifo_fd)
    measured = latency_summary(results["mount"][0])
    wakeup = latency_summary(results["mount"][1])
    measured["publish->line p50 ms"] = wakeup["p50 ms"]
    measured["publish->line p99 ms"] = wakeup["p99 ms"]
    reference = latency_summary(results["fifo"][0])
    ratios = [percentile(f, 50) / percentile(m, 50)
              for f, m in zip(results["fifo"][0], results["mount"][0], strict=True)]
    return Row("event_wakeup", "event wake-up (recommendation write -> poll()ing reader's line)",
               measured, reference, summarize(ratios), "p99 ≤ 5 ms",
               measured["p99 ms"]["median"] <= 5.0 and missed == 0,
               f"{plan.event_rounds} rounds x {plan.event_writes}, reader in its own process; "
               "p50/p99 from the write's start (the event is sent after the journal fsync); "
               "publish->line from the event's ts; reference: the same poller woken through a "
               f"FIFO; ratio = FIFO p50 / mount p50; events missed: {missed}",
               extra={"missed": missed})


# ---- ingest ----------------------------------------------------------------------------
def ingest_run(ticks: int, seed: int, directory: Path) -> tuple[float, list[dict], Any]:
    """Rows/s of tick() + sealing at full speed, and the rows it produced."""
    import pyarrow as pa

    from mlfs.backends.sim_readahead import SimReadahead

    from .config import load_config
    from .core.exchange import Exchange

    exchange = Exchange(load_config(None), directory, [SimReadahead(seed=seed)])
    try:
        runtime = exchange.runtimes["sim.readahead"]
        store = runtime.dataset
        seal_rows = store.policy.seal_rows
        started = time.perf_counter()
        for _ in range(ticks):
            runtime.tick()
            if store.pending >= seal_rows:
                store.seal_now()
        store.seal_now()
        rate = ticks / (time.perf_counter() - started)
        table = store.read_all()
        table = table.set_column(0, "ts", table.column("ts").cast(pa.int64()))
        return rate, table.to_pylist(), store.schema
    finally:
        exchange.close()


def write_reference(rows: list[dict], schema: Any, directory: Path, batch: int) -> float:
    """Rows/s of pyarrow writing the same rows, same batches, zstd, fsync per file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for index in range(0, len(rows), batch):
        table = pa.Table.from_pylist(rows[index:index + batch], schema=schema)
        path = directory / f"{index:010d}.parquet"
        pq.write_table(table, path, compression="zstd")
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(rows) / (time.perf_counter() - started)


def backend_only(ticks: int, seed: int) -> float:
    """Rows/s of the simulated backend's step() alone: the floor under tick()."""
    from mlfs.backends.sim_readahead import SimReadahead

    sim = SimReadahead(seed=seed)
    knobs = sim.default_knobs(None)
    started = time.perf_counter()
    for _ in range(ticks):
        sim.step(knobs)
    return ticks / (time.perf_counter() - started)


def bench_ingest(root: Path, plan: Plan) -> Row:
    proxy, reference, ratios, backend = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ingest-", dir=root) as scratch:
        warm = Path(scratch) / "warm"  # first-seal imports (pyarrow's pandas shim) untimed
        _, rows, schema = ingest_run(5000, 99, warm)
        write_reference(rows, schema, warm / "ref", 4096)
        for rep in range(plan.ingest_reps):
            base = Path(scratch) / f"rep{rep}"
            rate, rows, schema = ingest_run(plan.ingest_ticks, rep, base / "state")
            ref = write_reference(rows, schema, base / "ref", 4096)
            proxy.append(rate)
            reference.append(ref)
            ratios.append(rate / ref)
            backend.append(backend_only(min(plan.ingest_ticks, 5000), rep))
            shutil.rmtree(base, ignore_errors=True)
            progress(f"ingest: rep {rep + 1}/{plan.ingest_reps}: {rate:.0f} rows/s "
                     f"(pyarrow {ref:.0f} rows/s, backend alone {backend[-1]:.0f})")
    return Row("ingest", "ingest: tick() + seal, sim.readahead at full speed, no mount",
               {"rows/s": summarize(proxy)}, {"rows/s": summarize(reference)},
               summarize(ratios), "≥ 0.5×", statistics.median(ratios) >= 0.5,
               f"{plan.ingest_ticks} ticks per rep, sealed every 4096 rows; reference: "
               "pa.Table.from_pylist + write_table(zstd) + fsync of the same rows, same "
               f"batches; the simulated backend alone: "
               f"{statistics.median(backend):.0f} rows/s",
               extra={"backend_step_rows_per_s": summarize(backend)})


# ---- footprint -------------------------------------------------------------------------
def bench_footprint(session: Session, plan: Plan) -> list[Row]:
    """An idle mount, three subsystems at 1 tick/s, default sealing: what it costs to keep."""
    state = session.root / "footprint-state"
    mount = session.mount("footprint", mount_config(FOOTPRINT_SEAL_SECONDS), state)
    try:
        progress(f"footprint: warming up {plan.footprint_warmup:g} s")
        time.sleep(plan.footprint_warmup)
        cpu, rss, anon = [], [], []
        for index in range(plan.footprint_windows):
            c0, t0 = mount.cpu_seconds(), time.monotonic()
            end = t0 + plan.footprint_window_seconds
            while time.monotonic() < end:
                memory = mount.memory_kb()
                rss.append(memory["VmRSS"] / 1024)
                anon.append(memory.get("RssAnon", 0) / 1024)
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            cpu.append(100 * (mount.cpu_seconds() - c0) / (time.monotonic() - t0))
            progress(f"footprint: window {index + 1}/{plan.footprint_windows}: "
                     f"CPU {cpu[-1]:.2f}%, RSS {rss[-1]:.0f} MB")
        peak = mount.memory_kb().get("VmHWM", 0) / 1024
    finally:
        mount.stop()
    window = f"{plan.footprint_windows} windows of {plan.footprint_window_seconds:g} s"
    return [
        Row("footprint_cpu", "footprint: daemon CPU, 3 subsystems at 1 tick/s",
            {"% of one core": summarize(cpu)}, None, None, "≤ 1%",
            statistics.median(cpu) <= 1.0,
            f"{window} after {plan.footprint_warmup:g} s of warm-up (past the first seal), "
            "utime+stime from /proc/<pid>/stat (resolution "
            f"{100 / os.sysconf('SC_CLK_TCK') / plan.footprint_window_seconds:.2f}%)"),
        Row("footprint_rss", "footprint: daemon RSS, 3 subsystems at 1 tick/s",
            {"MB": summarize(rss)}, None, None, "≤ 150 MB", max(rss) <= 150.0,
            f"VmRSS sampled each second over the {window} (MB = MiB); peak VmHWM "
            f"{peak:.0f} MB; anonymous part median {statistics.median(anon):.0f} MB",
            extra={"rss_anon_mb": summarize(anon), "vm_hwm_mb": peak}),
    ]


# ---- concurrency -----------------------------------------------------------------------
class Load:
    """Counters and signals shared with the worker processes of the concurrency run.

    Workers are separate processes (dataset readers as threads inside four of
    them), so the load on the daemon is not throttled by one GIL in the bench:
    with 41 threads in one process the writer managed ~50 writes/s while the
    daemon sat at a third of a core.  Each counter slot has one writer.
    """

    def __init__(self, ctx: Any, readers: int, event_readers: int) -> None:
        self.go = ctx.Event()
        self.stop = ctx.Event()
        self.bytes_read = ctx.Array("q", readers, lock=False)
        self.files_read = ctx.Array("q", readers, lock=False)
        self.events_seen = ctx.Array("q", event_readers, lock=False)
        self.writes_ok = ctx.Value("q", 0, lock=False)
        self.errors = ctx.Queue()
        self.results = ctx.Queue()


def _dataset_reader(load: Load, index: int, mountpoint: Path, cold: bool) -> None:
    """List every subsystem's dataset and read each portion whole, again and again."""
    buf = bytearray(MiB)
    try:
        while not load.stop.is_set():
            paths = sorted(p for s in SUBSYSTEMS for p in (mountpoint / s / "dataset").iterdir())
            for path in paths:
                if load.stop.is_set():
                    return
                with open(path, "rb", buffering=0) as fh:
                    if cold:  # push reads down to the daemon, not just the page cache
                        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                    while n := fh.readinto(buf):
                        load.bytes_read[index] += n
                load.files_read[index] += 1
    except OSError as exc:
        load.errors.put(f"dataset reader {index}: {exc!r}")


def _reader_process(load: Load, mountpoint: str, first: int, count: int, cold: int) -> None:
    """One process of `count` dataset reader threads, the first `cold` dropping the cache."""
    threads = [threading.Thread(target=_dataset_reader,
                                args=(load, first + j, Path(mountpoint), j < cold))
               for j in range(count)]
    load.results.put(("ready", first, None))
    load.go.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _event_reader(load: Load, index: int, path: str, use_poll: bool, global_stream: bool) -> None:
    """Read an events file until the sentinel; every line checked, gaps and overflows counted.

    On the global stream `seq` must be gapless; a subsystem's stream may skip
    other subsystems' events, so there only order and the counts are checked.
    """
    seqs: list[int] = []
    accepted = overflow = 0
    done = False
    try:
        stream = EventStream(path, blocking=not use_poll)
        try:
            load.results.put(("ready", index, None))
            while not done and not stream.ended:
                events = stream.read(1.0)  # blocking: one read(2); else poll() up to 1 s
                if stream.bad_lines:
                    raise ValueError(f"{stream.bad_lines} lines that are not JSON events")
                for event in events:
                    seqs.append(int(event["seq"]))
                    load.events_seen[index] += 1
                    kind = event.get("event")
                    if kind == "overflow":
                        overflow += int(event.get("lost", 0))
                    elif kind == "recommendation" and event.get("status") == "accepted" \
                            and event.get("model") == MODEL:
                        accepted += 1
                    elif kind == "state" and event.get("model") == SENTINEL_MODEL:
                        done = True
        finally:
            stream.close()
    except (OSError, ValueError) as exc:
        load.errors.put(f"event reader {index}: {exc!r}")
    gaps = sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b != a + 1)
    load.results.put(("result", index, {
        "path": path, "poll": use_poll, "global_stream": global_stream, "lines": len(seqs),
        "accepted": accepted, "overflow": overflow, "gaps": gaps, "sentinel": done,
        "ordered": all(b > a for a, b in zip(seqs, seqs[1:], strict=False)),
    }))


def _writer_process(load: Load, recommend: str) -> None:
    """Recommendations as fast as they are accepted, until told to stop."""
    rng = random.Random(3)
    load.results.put(("ready", -1, None))
    load.go.wait()
    while not load.stop.is_set():
        try:
            echo(recommend, recommendation(rng))
            load.writes_ok.value += 1
        except OSError as exc:
            load.errors.put(f"writer: {exc!r}")
            return


class Prober(threading.Thread):
    """Reads `version` four times a second: a wedged mount shows as a stale probe."""

    def __init__(self, mountpoint: Path) -> None:
        super().__init__(daemon=True)
        self.path = mountpoint / "version"
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.last_ok = time.monotonic()
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.path.read_bytes()
            except OSError as exc:
                self.error = repr(exc)
                return
            self.latencies.append(time.perf_counter() - started)
            self.last_ok = time.monotonic()
            self.stop.wait(0.25)


def _run_with_timeout(fn: Callable[[], None], timeout: float) -> bool:
    """Run `fn` in a thread; False when it did not finish (a wedged mount)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


def _drain(q: Any) -> list[Any]:
    out = []
    with contextlib.suppress(Exception):
        while True:
            out.append(q.get_nowait())
    return out


def bench_concurrency(mount: BenchMount, model: Path, plan: Plan) -> Row:
    """32 dataset readers + 8 event readers + 1 recommendation writer, all at once."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process with library threads
    root = mount.mountpoint
    n_procs, per_proc, n_events = 4, 8, 8
    load = Load(ctx, n_procs * per_proc, n_events)
    event_procs = []
    for i in range(n_events):
        on_global = i % 2 == 0
        path = root / "events" if on_global else root / STEER / "events"
        p = ctx.Process(target=_event_reader, daemon=True,
                        args=(load, i, str(path), i % 4 >= 2, on_global))
        p.start()
        event_procs.append(p)
    workers = [ctx.Process(target=_reader_process, daemon=True,
                           args=(load, str(root), k * per_proc, per_proc, 2))
               for k in range(n_procs)]
    workers.append(ctx.Process(target=_writer_process, daemon=True,
                               args=(load, str(model / "recommend"))))
    for p in workers:
        p.start()
    # everyone imported, subscribed and waiting: then all start at once
    results: dict[int, dict[str, Any]] = {}
    ready, expected = 0, n_events + len(workers)
    deadline = time.monotonic() + 60
    while ready < expected and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            kind, index, value = load.results.get(timeout=1)
            if kind == "ready":
                ready += 1
            else:
                results[index] = value
    if ready < expected:
        load.stop.set()
        load.go.set()
        raise RuntimeError(f"only {ready} of {expected} concurrency workers started")
    load.go.set()
    prober = Prober(root)
    prober.start()
    cpu0 = mount.cpu_seconds()
    started = time.monotonic()
    mb_per_s, writes_per_s, events_per_s, rss, anon = [], [], [], [], []
    last = (0, 0, 0)
    wedged = False
    while time.monotonic() - started < plan.concurrency_seconds:
        time.sleep(1.0)
        now = (sum(load.bytes_read), load.writes_ok.value, sum(load.events_seen))
        mb_per_s.append((now[0] - last[0]) / MB)
        writes_per_s.append(float(now[1] - last[1]))
        events_per_s.append(float(now[2] - last[2]))
        last = now
        with contextlib.suppress(OSError, KeyError):
            memory = mount.memory_kb()
            rss.append(memory["VmRSS"] / 1024)
            anon.append(memory["RssAnon"] / 1024)
        if time.monotonic() - prober.last_ok > 10:
            wedged = True
            break
    elapsed = time.monotonic() - started
    cpu = 100 * (mount.cpu_seconds() - cpu0) / elapsed
    load.stop.set()
    prober.stop.set()
    for p in workers:
        p.join(30)
    wedged = wedged or any(p.is_alive() for p in workers)
    # the sentinel: every event reader must see it, after every accepted write
    sentinel = root / STEER / "models" / SENTINEL_MODEL
    if not wedged and not _run_with_timeout(lambda: os.mkdir(sentinel), 20):
        wedged = True
    deadline = time.monotonic() + 20
    while len(results) < n_events and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            kind, index, value = load.results.get(timeout=1)
            if kind == "result":
                results[index] = value
    for p in event_procs:
        p.join(5)
    wedged = wedged or len(results) < n_events
    if wedged:  # release processes stuck in the mount: abort it (they get ENOTCONN)
        mount.stop(signal.SIGKILL)
    else:
        _run_with_timeout(lambda: os.rmdir(sentinel), 20)
    for p in workers + event_procs:
        if p.is_alive():
            p.kill()
        p.join(10)
    errors = [str(e) for e in _drain(load.errors)]
    if prober.error:
        errors.append(f"probe: {prober.error}")
    writes_ok = load.writes_ok.value
    readers = [results.get(i, {}) for i in range(n_events)]
    lost = sum(r.get("overflow", 0) for r in readers)
    lost += sum(r.get("gaps", 0) for r in readers if r.get("global_stream"))
    lost += sum(abs(r.get("accepted", 0) - writes_ok) for r in readers)
    lost += sum(1 for r in readers if not r.get("sentinel") or not r.get("ordered"))
    ok = not wedged and not errors and lost == 0
    probe = prober.latencies or [math.nan]
    files = sum(load.files_read)
    progress(f"concurrency: {statistics.median(mb_per_s):.0f} MB/s read, "
             f"{statistics.median(writes_per_s):.0f} writes/s, errors {len(errors)}, "
             f"lost {lost}, wedged {wedged}")
    return Row(
        "concurrency", "concurrency: 32 dataset readers + 8 event readers + 1 writer",
        {"dataset MB/s": summarize(mb_per_s), "recommendations/s": summarize(writes_per_s),
         "event lines/s": summarize(events_per_s)},
        None, None, "no error, no lost event, no wedge", ok,
        f"{elapsed:.0f} s, per-second samples; {files} portions read (8 readers drop the "
        f"page cache first), {writes_ok} recommendations, each seen by all {n_events} "
        f"event readers (4 global, 4 per-subsystem; 4 poll, 4 blocking): {lost == 0}; "
        f"errors {len(errors)}; wedged {wedged}; `version` probe p99 "
        f"{percentile(probe, 99) * 1e3:.1f} ms; daemon CPU {cpu:.0f}% of one core, RSS max "
        f"{max(rss, default=math.nan):.0f} MB (anonymous {max(anon, default=math.nan):.0f} MB; "
        "the rest is the mapped portion, page cache shared with the state file)",
        extra={"errors": errors[:50], "wedged": wedged, "lost": lost, "event_readers": readers,
               "writes_ok": writes_ok, "portions_read": files,
               "probe_p99_ms": percentile(probe, 99) * 1e3, "daemon_cpu_pct": cpu,
               "daemon_rss_max_mb": max(rss, default=math.nan),
               "daemon_rss_anon_max_mb": max(anon, default=math.nan)},
    )


# ---- the report ------------------------------------------------------------------------
def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _cell(figures: dict[str, dict[str, Any]] | None) -> str:
    if not figures:
        return "—"
    return "<br>".join(f"{name} {_fmt(s['median'])} [{_fmt(s['min'])}–{_fmt(s['max'])}]"
                       for name, s in figures.items())


def markdown(report: dict[str, Any]) -> str:
    """The table users read: median [min–max] of repetitions, ratio, target, met."""
    host = report["host"]
    lines = [
        f"# mlfs bench — {report['date']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Host: Linux {host['kernel']}, {host['cpus']} CPUs, {host['memory_gb']:.0f} GB RAM, "
        f"Python {host['python']}, mlfs {report['mlfs_version']}"
        f"{' (quick run)' if report['quick'] else ''}; load average "
        f"{host['loadavg_start'][0]:.1f} at the start, {host['loadavg_end'][0]:.1f} at the end "
        f"({report['seconds']:.0f} s)  ",
        "Figures: median [min–max] over repetitions. Ratio: speed through mlfs / speed of "
        "the same-run reference (1.0 = as fast; for times, reference time / mlfs time).",
        "",
        "| what | measured | reference (same run) | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        if row["skipped"]:
            lines.append(f"| {row['what']} | skipped: {row['skipped']} | | | {row['target']} "
                         "| — |")
            continue
        ratio = row["ratio"]
        ratio_text = (f"{ratio['median']:.3g}× [{ratio['min']:.3g}–{ratio['max']:.3g}]"
                      if ratio else "—")
        met = {True: "yes", False: "**no**", None: "—"}[row["met"]]
        lines.append(f"| {row['what']} | {_cell(row['measured'])} | {_cell(row['reference'])} "
                     f"| {ratio_text} | {row['target']} | {met} |")
    lines += ["", "Notes:", ""]
    lines += [f"- **{row['key']}**: {row['note']}" for row in report["rows"] if row["note"]]
    return "\n".join(lines) + "\n"


def host_info() -> dict[str, Any]:
    memory = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    versions = {}
    for name in ("pyfuse3", "trio", "pyarrow", "polars", "duckdb"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:
            versions[name] = None
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "memory_gb": memory,
            "python": platform.python_version(), "versions": versions,
            "loadavg_start": os.getloadavg()}


def run(plan: Plan, command: str) -> dict[str, Any]:
    """Every measurement in order; the mount-free ones last so mounts end early."""
    from . import __version__

    reason = fuse_unavailable()
    if reason:
        raise RuntimeError(reason)
    started = time.monotonic()
    report: dict[str, Any] = {
        "mlfs_version": __version__,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "quick": plan.quick, "plan": asdict(plan),
        "host": host_info(), "extra": {}, "rows": [],
    }
    rows: list[Row] = report["rows"]
    session = Session()
    report["workdir"] = str(session.root)  # removed at the end; the smoke test checks
    try:
        state = session.root / "state"
        portion = state / BIG / "dataset" / PORTION
        progress(f"writing a {plan.file_mib} MiB portion into the state directory")
        report["extra"]["portion_rows"] = write_portion(portion, plan.file_mib * MiB)
        config = mount_config(3600.0)  # no sealing mid-run: both query sides see the same
        read_rows, mount = bench_reads(session, plan, state, config, report["extra"])
        rows += read_rows
        mounted_dataset = mount.mountpoint / BIG / "dataset"
        rows.append(bench_query("Polars", polars_query, mounted_dataset, portion.parent,
                                plan.query_reps))
        rows.append(bench_query("DuckDB", duckdb_query, mounted_dataset, portion.parent,
                                plan.query_reps))
        model = setup_model(mount.mountpoint)
        rows.append(bench_control(session, model, plan))
        rows.append(bench_events(session, mount.mountpoint, model, plan))
        progress(f"concurrency: {plan.concurrency_seconds:g} s")
        rows.append(bench_concurrency(mount, model, plan))
        report["extra"]["daemon_after_run"] = (mount.memory_kb() if mount.alive() else {})
        mount.stop()
        rows += bench_footprint(session, plan)
        shm = tmpfs_dir()
        if shm is not None:  # where the control-write time goes: the journal's fsync?
            diag = session.mount("tmpfs-state", config, session.scratch(shm))
            rows.append(bench_control(
                session, setup_model(diag.mountpoint), plan, "control_write_tmpfs_state",
                "control write round trip, state dir on tmpfs (no disk fsync)", judged=False))
            diag.stop()
        rows.append(bench_ingest(session.root, plan))
    finally:
        session.close()
    report["rows"] = [asdict(r) for r in rows]
    report["seconds"] = round(time.monotonic() - started, 1)
    report["host"]["loadavg_end"] = os.getloadavg()
    return report


def main(argv: list[str] | None = None) -> int:
    """`mlfs bench [--quick] [--json FILE]`: run, print the table, write JSON and .md."""
    parser = argparse.ArgumentParser(prog="mlfs bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    parser.add_argument("--json", help="write the report as JSON here (and the table as .md)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the cleanup: mounts ended, files removed

    signal.signal(signal.SIGTERM, on_sigterm)
    command = "mlfs bench" + (" --quick" if args.quick else "") + (
        f" --json {args.json}" if args.json else "")
    try:
        report = run(plan, command)
    except KeyboardInterrupt:
        print("mlfs bench: interrupted (mounts ended, temporary files removed)", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"mlfs bench: {exc}", file=sys.stderr)
        return 1
    table = markdown(report)
    print(table)
    if args.json:
        path = Path(args.json)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        path.with_suffix(".md").write_text(table)
        progress(f"wrote {path} and {path.with_suffix('.md')}")
    concurrency = next((r for r in report["rows"] if r["key"] == "concurrency"), None)
    if concurrency is not None and concurrency["met"] is False:
        print("mlfs bench: the concurrency run failed (errors, lost events or a wedge)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
