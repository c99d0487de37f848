"""Fleet training at scale: time and peak memory per Dask worker against rows.

A source store is made in virtual time (no mount): the real exchange on
`sim.readahead` with a model pinned to collaboration that recommends a seeded
random read_ahead_kb each time its last recommendation expired, `--source-rows`
ticks, sealed as one host's dataset portions with the pusher's host columns
and the subsystem's `info`, laid out as `mlfs fleet push` lays them out
(mlfs/fleet/layout.py).  `tests.bench.fleet.build` (imported, not copied)
replicates those rows to N rows over H hosts; `mlfs.fleet.train.train` trains
and publishes on a LocalCluster started here (so the workers' PIDs are known:
their peak RSS is `VmHWM` of /proc/<pid>/status, read in the worker when the
run is done; a fresh cluster per size).

`--memory-limit L` gives each worker Dask's memory limit (the nanny restarts
a worker past 95 % of it); a size that fails under it is reported as such, so
the largest size that trains with two workers of limit L can be read off.

    .venv/bin/python -m tests.bench.fleet_scale --rows 1000000 10000000 \\
        --json bench-results/fleet-scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from mlfs.backends.sim_readahead import RA_GRID, SimReadahead

from mlfs import __version__
from mlfs.config import load_config
from mlfs.core.mount.exchange import Exchange
from mlfs.fleet.layout import HOST_COLUMNS, Source, info_path
from mlfs.fleet.train import train
from tests.bench.fleet import build


def make_source(target: Path, rows: int, seed: int = 7) -> int:
    """One host's `rows` ticks of sim.readahead, shipped as the pusher ships them."""
    rng = random.Random(seed)
    host = "source000"
    values = {"host_id": host, "host_name": socket.gethostname(),
              "kernel_release": os.uname().release, "machine": os.uname().machine,
              "mlfs_version": __version__}
    with tempfile.TemporaryDirectory(prefix="mlfs-scale-src-") as state:
        exchange = Exchange(load_config(None), Path(state), [SimReadahead(seed=seed)])
        runtime = exchange.runtimes["sim.readahead"]
        proxy = runtime.create_model("explore")
        proxy.start()
        proxy.set_mode(b"collaboration\n")
        for _ in range(rows):
            if proxy.current is None:
                proxy.recommend(f"read_ahead_kb={rng.choice(RA_GRID)}\n".encode())
            runtime.tick()
        runtime.dataset.seal_now()
        table = runtime.dataset.read_all()
        info = json.dumps(runtime.info())
        exchange.close()
    for name in HOST_COLUMNS:
        table = table.append_column(name, pa.array([values[name]] * table.num_rows, pa.string()))
    source = Source("sim.readahead", "dataset")
    for n, start in enumerate(range(0, table.num_rows, 4096)):
        path = target / source.object_path(host, n + 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.slice(start, 4096), path)
    (target / info_path("sim.readahead", host)).parent.mkdir(parents=True, exist_ok=True)
    (target / info_path("sim.readahead", host)).write_text(info)
    return table.num_rows


def _peak_rss() -> dict:
    """Run in a worker: its own peak and current resident set, MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":")
                fields[key] = int(value.split()[0]) / 1024
    return {"pid": os.getpid(), "peak_mib": round(fields["VmHWM"], 1),
            "rss_mib": round(fields["VmRSS"], 1)}


def measure(source: Path, rows: int, hosts: int, workers: int, memory_limit: str | None,
            folds: int) -> dict:
    from distributed import Client, LocalCluster

    target = Path(tempfile.mkdtemp(prefix="mlfs-fleet-scale-"))
    out: dict = {"rows": rows, "hosts": hosts, "workers": workers,
                 "memory_limit": memory_limit, "fits": min(hosts, folds) + 1}
    try:
        t = time.perf_counter()
        build(source, target, rows, hosts, 4096)
        out["build_seconds"] = round(time.perf_counter() - t, 1)
        out["store_mib"] = round(sum(p.stat().st_size for p in target.rglob("*.parquet"))
                                 / 2**20, 1)
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, memory_limit=memory_limit or "auto")
        try:
            with Client(cluster) as client:
                started = time.perf_counter()
                try:
                    card = train(str(target), "sim.readahead", cluster.scheduler_address,
                                 folds=folds, n_workers=workers)
                except Exception as exc:  # noqa: BLE001  (a size too big for L is a result)
                    out["failed"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    card = None
                out["seconds"] = round(time.perf_counter() - started, 1)
                out["peak_per_worker_mib"] = sorted(
                    v["peak_mib"] for v in client.run(_peak_rss).values())
                if card:
                    stages = card["seconds_after"]
                    out["training_rows"] = card["rows"]
                    out["stages"] = stages
                    out["final_fit_seconds"] = round(card["seconds"] - stages["validation"], 1)
                    out["validation_seconds"] = round(stages["validation"]
                                                      - stages["summaries"], 1)
        finally:
            cluster.close()
    finally:
        shutil.rmtree(target, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--source-rows", type=int, default=20_000)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--folds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", help="per worker, e.g. 2GiB (default: Dask's auto)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    source = Path(tempfile.mkdtemp(prefix="mlfs-fleet-source-"))
    results = []
    try:
        t = time.perf_counter()
        n = make_source(source, args.source_rows)
        print(json.dumps({"source_rows": n, "seconds": round(time.perf_counter() - t, 1)}),
              flush=True)
        for rows in args.rows:
            result = measure(source, rows, args.hosts, args.workers, args.memory_limit,
                             args.folds)
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.json:
                existing = json.loads(args.json.read_text()) if args.json.exists() else []
                args.json.write_text(json.dumps(existing + [result], indent=2) + "\n")
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
