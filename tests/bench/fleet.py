"""Fleet training time against rows: a pushed store's rows replicated to N rows.

Takes a real fleet store (one `mlfs fleet push` filled, e.g. from a few
sim.readahead mounts), copies its dataset rows into a new store as H hosts
with portions of `seal_rows` rows (the store's default, 4096) until N rows,
and times `mlfs.fleet.train.train` on a LocalCluster.  What it measures is
Dask + lightgbm.dask on this machine; the rows repeat, so the validation
error here means nothing.

    .venv/bin/python -m tests.bench.fleet --from-store /tmp/fleet-dev-store \\
        --rows 100000 --hosts 4
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mlfs.fleet.layout import Source, info_path
from mlfs.fleet.train import train


def build(source: Path, target: Path, rows: int, hosts: int, portion_rows: int) -> int:
    files = sorted(glob.glob(f"{source}/subsystem=sim.readahead/*/kind=dataset/*.parquet"))
    base = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("tick")
    info = next(iter(glob.glob(f"{source}/info/sim.readahead/*.json")))
    per_host = rows // hosts
    written = 0
    for h in range(hosts):
        host = f"bench{h:03d}"
        (target / info_path("sim.readahead", host)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(info, target / info_path("sim.readahead", host))
        copies = -(-per_host // base.num_rows)
        table = pa.concat_tables([base] * copies).slice(0, per_host)
        ticks = pa.array(range(per_host), pa.int64())
        table = table.set_column(table.schema.get_field_index("tick"), "tick", ticks)
        table = table.set_column(table.schema.get_field_index("host_id"), "host_id",
                                 pa.array([host] * per_host, pa.string()))
        source_dir = Source("sim.readahead", "dataset")
        for n, start in enumerate(range(0, per_host, portion_rows)):
            path = target / source_dir.object_path(host, n + 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.slice(start, portion_rows), path)
        written += per_host
    return written


def worker_peak_rss(client) -> dict[str, float]:
    """Each worker process's peak resident memory so far, in MiB (getrusage)."""
    import resource

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    return {addr: round(v, 1) for addr, v in client.run(peak).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-store", required=True, type=Path)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--portion-rows", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--folds", type=int, default=None,
                        help="hosts held out (default: all); 0 times the final fit alone")
    parser.add_argument("--memory-limit", default="0",
                        help="per worker, as Dask takes it (e.g. 2GiB; 0: none)")
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    for rows in args.rows:
        target = Path(tempfile.mkdtemp(prefix="mlfs-fleet-bench-"))
        # a cluster of our own (not train's LocalCluster): to ask its workers their peak
        # memory after the run, the Dask-reported figure a cluster's sizing needs
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1,
                               dashboard_address=None, processes=True,
                               memory_limit=args.memory_limit)
        try:
            n = build(args.from_store, target, rows, args.hosts, args.portion_rows)
            started = time.perf_counter()
            card = train(str(target), "sim.readahead", cluster.scheduler_address,
                         folds=args.hosts if args.folds is None else args.folds,
                         n_workers=args.workers)
            with Client(cluster) as client:
                peaks = worker_peak_rss(client)
            print(json.dumps({"rows": n, "training_rows": card["rows"], "hosts": args.hosts,
                              "folds": args.folds, "workers": args.workers,
                              "memory_limit": args.memory_limit,
                              "seconds": round(time.perf_counter() - started, 2),
                              "stages": card["seconds_after"],
                              "worker_peak_rss_mib": peaks}), flush=True)
        finally:
            cluster.close()
            shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    main()
