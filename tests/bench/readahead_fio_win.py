"""Does mlfs beat a static read_ahead_kb for an application that keeps its files open?

tests/bench/fio_win.py's experiment for the ``readahead`` candidate: the
loop device's read_ahead_kb (linux.block) under the fio phases ``seq-scan``
(buffered sequential reads) and ``mmap-lookup`` (random page faults on a
mapping).  Unlike readahead_win's workload, which reopens its file every
50 ms, each fio visit opens its file once, at its start: the value in place
then is the one it reads with all visit long, and what mlfs sets during the
visit reaches only the next one (sweep.CANDIDATES says why).  Made for issue
33's new workload families: an application that keeps its files open, phases
that alternate faster than the knob's carry-over.

    .venv/bin/python -m tests.bench.readahead_fio_win --quick --json-dir DIR
"""

import sys

from tests.bench.fio_win import main

if __name__ == "__main__":
    sys.exit(main("readahead"))
