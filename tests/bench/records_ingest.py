"""Record ingest against pyarrow alone: batches in, sealed Parquet out.

    python -m tests.bench.records_ingest [--rows 5000000] [--batch 50000] [--repeats 5]

The same batches (sim.disks' drive-day columns, `--batch` rows each) go once through a
`RecordStore` (`to_table`, numbering, the Arrow IPC write-ahead file, one seal) and once
through `pyarrow.parquet.write_table` alone with the same row groups and compression;
rows per second of each and their ratio, per repeat and as medians.  Targets (issue 31):
at least 0.5x pyarrow alone and at least 1 M rows/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from mlfs.backends.sim_disks import RECORDS, DrivePopulation, _structured

from mlfs.core.portion import StorePolicy
from mlfs.core.records import RecordStore, to_table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    population = DrivePopulation(drives=args.batch, seed=0)
    batches = [_structured(population.day()) for _ in range(max(1, args.rows // args.batch))]
    rows = sum(len(b) for b in batches)
    results = []
    for repeat in range(args.repeats):
        work = Path(tempfile.mkdtemp(prefix="mlfs-ingest-"))
        try:
            policy = StorePolicy(seal_rows=rows + 1, max_waiting_rows=rows + 1)
            started = time.perf_counter()
            store = RecordStore(work / "store", RECORDS, policy)
            for tick, batch in enumerate(batches):
                store.append_table(to_table(batch, RECORDS), tick)
            store.flush_wal()
            store.seal_now()
            ours = time.perf_counter() - started
            started = time.perf_counter()
            table = pa.concat_tables(pa.Table.from_arrays(
                [pa.array(b[name]) for name in RECORDS], names=list(RECORDS)) for b in batches)
            pq.write_table(table, work / "reference.parquet", compression="zstd",
                           row_group_size=1 << 20)
            reference = time.perf_counter() - started
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append({"repeat": repeat, "rows": rows, "ours_rows_per_s": round(rows / ours),
                        "pyarrow_rows_per_s": round(rows / reference),
                        "ratio": round(reference / ours, 3)})
        print(results[-1])
    summary = {"runs": results,
               "ours_rows_per_s_median": statistics.median(r["ours_rows_per_s"] for r in results),
               "ratio_median": statistics.median(r["ratio"] for r in results),
               "ratio_range": [min(r["ratio"] for r in results),
                               max(r["ratio"] for r in results)]}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
