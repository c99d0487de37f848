"""Ingest: the runtime's tick and sealing in-process, against pyarrow writing the same rows."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .harness import progress
from .plan import Plan
from .stats import Row, summarize


def ingest_run(ticks: int, seed: int, directory: Path) -> tuple[float, list[dict], Any]:
    """Rows/s of tick() + sealing at full speed, and the rows it produced."""
    import pyarrow as pa

    from mlfs.backends.sim_readahead import SimReadahead
    from mlfs.core.mount.exchange import Exchange

    from ..config import load_config

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
