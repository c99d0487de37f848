"""Does mlfs beat the default and best static vm.dirty_* writeback settings?

tests/bench/fio_win.py's experiment for the ``writeback`` candidate: the
machine-wide vm.dirty_* sysctls (linux.vm; cgroup v1 has no per-cgroup
writeback, so they act on the whole machine and are always restored) under
the fio phases ``stream-write``, ``db-commit`` and ``read-under-write``, on a
loop device capped at 300 MB/s (fio_win.DEVICE_CAP_MB_PER_S says why; the runs
before 2026-12-07's last session were uncapped and measured the virtual disk).

    .venv/bin/python -m tests.bench.writeback_win --quick
    .venv/bin/python -m tests.bench.writeback_win --runs 3 --seconds 4 --sweep-rounds 2 \
        --train-seconds 240 --train-phase 15 --learning-share 0.5 --json-dir DIR

Training phases longer than the proxy's episodes (the dirty ratios declare
settle_ticks 5: 10-tick episodes), so an episode's measured ticks fall in
one phase.  ``stream-write`` flushes every 32 MiB (tests/bench/fio_phases.py
says why); bench-results/writeback-win/ predates that and settle_ticks.
"""

import sys

from tests.bench.fio_win import main

if __name__ == "__main__":
    sys.exit(main("writeback"))
