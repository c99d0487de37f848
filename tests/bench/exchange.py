"""What the exchange costs (issue 2), next to the learning benchmark.

    .venv/bin/python -m tests.bench.exchange [--quick] [--json FILE]

A thin wrapper: the measurements live in `mlfs.bench` so that users get them
as `mlfs bench` without a source checkout, and this entry point runs exactly
the same code (no second copy to drift).  The `__main__` guard matters: the
concurrency run starts worker processes with multiprocessing's "spawn", which
re-imports this module in every worker.
"""

from __future__ import annotations

import sys

from mlfs.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
