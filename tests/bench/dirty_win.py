"""Does mlfs beat the default and best static dirty ratios on checkpoints and temporary files?

tests/bench/fio_win.py's experiment for the ``dirty`` candidate: the
machine-wide vm.dirty_background_ratio (linux.vm; always restored; the
dirty_ratio stays at its value: fio_win.WIN_KNOBS says why) under the fio
phases ``checkpoint`` (512 MiB checkpoints, each made durable: wants
writeback to start early, a low background ratio) and ``tempfiles`` (files
written once and deleted, never flushed: wants the dirty pages kept, no
early writeback), on a loop device capped at 1 GB/s
(fio_win.DEVICE_CAP_MB_PER_S; the VM's disk alone made the phases' speed
wander with the host's cache).  Neither phase owes anything to the next.

The model sees one feature, the size of the applications' write(2) calls
(fio_win.MODEL_FEATURES says why); the defaults are the options of the
README's runs (fio_win.RUN_DEFAULTS: 30 s visits).

    .venv/bin/python -m tests.bench.dirty_win --quick       # one run, ~50 minutes
    .venv/bin/python -m tests.bench.dirty_win --runs 3 --json-dir bench-results/dirty-win-13
"""

import sys

from tests.bench.fio_win import main

if __name__ == "__main__":
    sys.exit(main("dirty"))
