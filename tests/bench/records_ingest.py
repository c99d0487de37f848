"""Record ingest against pyarrow alone: batches in, sealed Parquet out.

    python -m tests.bench.records_ingest [--rows 3000000] [--batch 50000] [--repeats 5]

The measurement is mlfs/bench/records.py's (the `records_ingest` row of `mlfs bench`):
the same sim.disks batches through a `RecordStore` (`to_table`, numbering, the Arrow IPC
write-ahead file, one seal) and through `pyarrow.parquet.write_table` alone with the same
row groups and compression, the sides alternating which goes first; rows per second of
each and their ratio, per repeat and as medians.  Targets (issue 31): at least 0.5x
pyarrow alone and at least 1 M rows/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from mlfs.bench.records import ingest_pairs, source_batches


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    batches, fields = source_batches(args.rows, args.batch)
    with tempfile.TemporaryDirectory(prefix="mlfs-ingest-") as work:
        results = ingest_pairs(batches, fields, Path(work), args.repeats)
    summary = {"runs": results,
               "ours_rows_per_s_median": statistics.median(r["store_rows_per_s"]
                                                           for r in results),
               "ratio_median": statistics.median(r["ratio"] for r in results),
               "ratio_range": [min(r["ratio"] for r in results),
                               max(r["ratio"] for r in results)]}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
