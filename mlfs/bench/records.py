"""Record ingest: a batch record source's batches into a record store, against pyarrow alone.

The store's side is the daemon's batch path without the tick loop: `to_table` (the cast
to the declared fields), `append_table` (numbering, queued for the write-ahead file),
`flush_wal` (the Arrow IPC write-ahead file), then one seal (Parquet, fsync, rename).
The reference is issue 31's "pyarrow alone": the same batches turned into Arrow arrays
and written by `pyarrow.parquet.write_table` with the same row groups and compression
(no fsync, no numbering, no write-ahead file).  The batches are sim.disks' drive-days
(`step()`'s numpy structured arrays, 16 fields, 95 bytes a row), made before timing.

Fresh memory is dear on this VM (pyarrow's mimalloc takes it as huge pages: the first
touch of 300 MB costs about a second of system time, a reuse nothing), so whichever side
runs first in a process pays more: the sides alternate which goes first, after an
untimed warm-up of both, and the ratio is taken per pair.  Used by `mlfs bench` and by
tests/bench/records_ingest.py.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from .harness import progress
from .plan import Plan
from .stats import Row, summarize

TARGET_RATIO = 0.5
TARGET_ROWS_PER_S = 1_000_000


def source_batches(rows: int, batch: int, seed: int = 0) -> tuple[list[Any], dict[str, str]]:
    """`rows // batch` days of a sim.disks population of `batch` drives, and its fields."""
    from mlfs.backends.sim_disks import SimDisks

    sim = SimDisks(drives=batch, seed=seed)
    return [sim.step({}).records for _ in range(max(1, rows // batch))], dict(sim.records)


def store_seconds(batches: list[Any], fields: dict[str, str], directory: Path) -> float:
    """Seconds for the batches to go through a record store into one sealed portion."""
    from mlfs.base.portion import StorePolicy
    from mlfs.core.storage.records import RecordStore, to_table

    rows = sum(len(b) for b in batches)
    policy = StorePolicy(seal_rows=rows + 1, max_waiting_rows=rows + 1)
    started = time.perf_counter()
    store = RecordStore(directory, fields, policy)
    for tick, batch in enumerate(batches):
        store.append_table(to_table(batch, fields), tick)
    if not store.flush_wal():
        raise OSError(*(store.error or (5, "write-ahead file not written")))
    store.seal_now()
    return time.perf_counter() - started


def pyarrow_seconds(batches: list[Any], fields: dict[str, str], path: Path) -> float:
    """Seconds for pyarrow alone to write the same batches: same row groups, compression."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mlfs.base.portion import PORTION_COMPRESSION
    from mlfs.core.storage.records import RECORD_ROW_GROUP_ROWS

    started = time.perf_counter()
    table = pa.concat_tables(pa.Table.from_arrays([pa.array(b[name]) for name in fields],
                                                  names=list(fields)) for b in batches)
    pq.write_table(table, path, compression=PORTION_COMPRESSION,
                   row_group_size=RECORD_ROW_GROUP_ROWS)
    return time.perf_counter() - started


def ingest_pairs(batches: list[Any], fields: dict[str, str], work: Path,
                 repeats: int) -> list[dict[str, Any]]:
    """Per repeat: rows/s of the store and of pyarrow alone, and their ratio (the sides
    alternate which goes first; an untimed warm-up of both before)."""
    rows = sum(len(b) for b in batches)

    def pair(index: int, some: list[Any]) -> dict[str, Any]:
        base = work / f"pair{index}"
        base.mkdir(parents=True)
        try:
            sides = [("store", lambda: store_seconds(some, fields, base / "store")),
                     ("pyarrow", lambda: pyarrow_seconds(some, fields, base / "ref.parquet"))]
            if index % 2:
                sides.reverse()
            seconds = {name: run() for name, run in sides}
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return {"repeat": index, "rows": rows, "first": sides[0][0],
                "store_rows_per_s": round(rows / seconds["store"]),
                "pyarrow_rows_per_s": round(rows / seconds["pyarrow"]),
                "ratio": round(seconds["pyarrow"] / seconds["store"], 3)}

    pair(-1, batches[:2])  # warm-up: first-call imports and allocations, untimed
    results = []
    for index in range(repeats):
        results.append(pair(index, batches))
        progress(f"record ingest: rep {index + 1}/{repeats}: "
                 f"{results[-1]['store_rows_per_s']:,} rows/s, pyarrow alone "
                 f"{results[-1]['pyarrow_rows_per_s']:,} rows/s, "
                 f"×{results[-1]['ratio']} ({results[-1]['first']} first)")
    return results


def bench_records(root: Path, plan: Plan) -> Row:
    """The `records_ingest` row: a batch record source against pyarrow alone."""
    batches, fields = source_batches(plan.records_rows, plan.records_batch)
    work = root / "records-ingest"
    try:
        pairs = ingest_pairs(batches, fields, work, plan.records_reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours = [p["store_rows_per_s"] for p in pairs]
    ratios = [p["ratio"] for p in pairs]
    met = (statistics.median(ratios) >= TARGET_RATIO
           and statistics.median(ours) >= TARGET_ROWS_PER_S)
    return Row("records_ingest", "record ingest: sim.disks batches → record store → Parquet",
               {"rows/s": summarize(ours)},
               {"rows/s": summarize([p["pyarrow_rows_per_s"] for p in pairs])},
               summarize(ratios), f"≥ {TARGET_RATIO}× and ≥ {TARGET_ROWS_PER_S / 1e6:g} M rows/s",
               met,
               f"{pairs[0]['rows']:,} rows in batches of {plan.records_batch:,} per rep: "
               "to_table + append_table + the Arrow IPC write-ahead file + one seal (zstd, "
               "fsync); reference: pa.array per column + pq.write_table, same row groups "
               "and compression, no fsync; the sides alternate which goes first",
               extra={"pairs": pairs})
