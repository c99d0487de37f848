"""Per-request capture under fio: requests seen, drops, fio's IOPS with it on and off, CPU.

    python -m tests.bench.bio_capture [--ios 200000] [--repeats 3] [--json FILE]

As root.  The measurement is mlfs/bench/capture.py's (the `bio_capture` row of `mlfs
bench`): on a fresh loop device, `fio --rw=randread --bs=4k --iodepth=32 --direct=1
--number_ios=N` with the capture off and on, interleaved `--repeats` times; the records
of each run against the read requests the device completed and fio's total_ios, the
records lost, fio's IOPS on against off, and the CPU of the daemon and its loader per
100k requests/s.
"""

from __future__ import annotations

import argparse

from mlfs.bench.capture import capture_runs, summary, unavailable
from mlfs.bench.harness import Session
from tests.bench.shared import emit


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ios", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        raise SystemExit(f"bio_capture: {why}")
    session = Session()
    try:
        runs = capture_runs(session.scratch(None), args.ios, args.repeats, session.mount)
    finally:
        session.close()
    return emit({"runs": runs, **summary(runs)}, args.json)


if __name__ == "__main__":
    main()
