"""Does mlfs beat the block queue's default and best static scheduler/nr_requests?

tests/bench/fio_win.py's experiment for the ``queue`` candidate: a direct-io
loop device's ``scheduler`` and ``nr_requests`` (linux.block) under the fio
phases ``mixed-rw``, ``seq-read`` and ``db-commit`` (tests/bench/workloads/).

    .venv/bin/python -m tests.bench.queue_win --quick
    .venv/bin/python -m tests.bench.queue_win --runs 3 --json-dir bench-results/queue-win
"""

import sys

from tests.bench.fio_win import main

if __name__ == "__main__":
    sys.exit(main("queue"))
