"""Does mlfs beat the default and best static vm.dirty_* writeback settings?

tests/bench/fio_win.py's experiment for the ``writeback`` candidate: the
machine-wide vm.dirty_* sysctls (linux.vm; cgroup v1 has no per-cgroup
writeback, so they act on the whole machine and are always restored) under
the fio phases ``stream-write``, ``db-commit`` and ``read-under-write``.

    .venv/bin/python -m tests.bench.writeback_win --quick
    .venv/bin/python -m tests.bench.writeback_win --runs 3 --json-dir docs/bench/writeback-win
"""

import sys

from tests.bench.fio_win import main

if __name__ == "__main__":
    sys.exit(main("writeback"))
