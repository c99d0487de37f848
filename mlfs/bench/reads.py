"""Dataset reads and queries through the mount against the same files in the state directory."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .data import same_bytes
from .harness import BenchMount, Session, progress, read_whole, tmpfs_dir
from .plan import BIG, MB, PORTION, MiB, Plan
from .stats import Row, summarize


def _tmpfs_copy(session: Session, state_file: Path, buf: bytearray) -> Path | None:
    """A second, diagnostic reference: the same bytes on tmpfs (4 KiB pages, like the
    mount's page cache, where the state directory's filesystem may use large folios),
    read twice; None without a tmpfs or room on it."""
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
    return shm_copy


def bench_reads(session: Session, plan: Plan, state_dir: Path, config: str,
                extra: dict[str, Any]) -> tuple[list[Row], BenchMount]:
    """First and repeated reads through new mounts, each paired with a warm state read."""
    state_file = state_dir / BIG / "dataset" / PORTION
    size = state_file.stat().st_size
    buf = bytearray(MiB)
    for _ in range(2):  # the reference is the state file *warm* in the page cache
        read_whole(state_file, buf)
    shm_copy = _tmpfs_copy(session, state_file, buf)
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
