"""Why writeback's streaming phase reads x2-3 apart under one setting: the phase alone,
back to back, against the phase between writeback's other two (nothing changed but what
runs in between), every visit from a clean page cache (`fio_phases.settle`).

    python -m tests.bench.stream_spread [--visits 8] [--seconds 4] [--cap-mb-per-s N]   (as root)

Runs on a fresh scratch file system (`scratch_filesystem`, the experiments' own), under
whatever vm.dirty_* the machine has; prints each visit's MiB/s and the spread (max/min)
of each order.  A spread the settled start leaves in the "between" order and not in the
"alone" order comes from below the guest's page cache (the loop image's virtual disk).
`--cap-mb-per-s`: the device capped at that rate (`scratch_filesystem`), the way the
writeback and dirty-ratio experiments cap it (fio_win.DEVICE_CAP_MB_PER_S): a cap below
the virtual disk's slowest speed should leave no spread in either order.
"""

from __future__ import annotations

import argparse
import sys

from tests.bench.fio_phases import run_phase, settle
from tests.bench.readahead_experiment import scratch_filesystem

OTHERS = ("db-commit", "read-under-write")  # writeback's other phases (sweep.CANDIDATES)


def visits(mnt, count: int, seconds: float, between: bool) -> list[float]:
    """stream-write's MiB/s over `count` settled visits, writeback's other phases run
    between them when `between`."""
    got = []
    for _ in range(count):
        settle()
        got.append(run_phase("stream-write", mnt, seconds)["mib_per_s"])
        if between:
            for phase in OTHERS:
                settle()
                run_phase(phase, mnt, seconds)
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--visits", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--image-mib", type=int, default=12288)
    parser.add_argument("--cap-mb-per-s", type=int, default=0,
                        help="cap the loop device's reads and writes (0: no cap)")
    args = parser.parse_args(argv)
    with scratch_filesystem(args.image_mib, args.cap_mb_per_s) as (_device, mnt):
        for phase in ("stream-write", *OTHERS):  # lay the files out, as the experiments do
            run_phase(phase, mnt, 1)
        for between in (False, True):
            got = visits(mnt, args.visits, args.seconds, between)
            label = "between db-commit and read-under-write" if between else "alone"
            print(f"stream-write {label}: " + ", ".join(f"{v:.0f}" for v in got)
                  + f" MiB/s; spread x{max(got) / min(got):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
