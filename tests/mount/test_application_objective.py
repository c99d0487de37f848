"""An application writing its own figure once a second into 0.5 s ticks, on a real mount.

The writer is a shell loop (`echo "N window=1.0" > objective`), as an
application's wrapper would be; the dataset is read back with pyarrow.  Every
tick either carries one of the figures written or is missing (NaN): never the
simulator's own throughput (issue 33 item 4).
"""

from __future__ import annotations

import math
import signal
import subprocess

from tests.harness import Mount, read_rows, wait_for

CONFIG = """
[store]
seal_rows = 4096
seal_seconds = 1.0

[modes]
silence_seconds = 600.0

[[subsystem]]
backend = "sim.readahead"
name = "app"
seed = 2
tick_seconds = 0.5
objective = "application"
objective_unit = "ops/s"
objective_wait_seconds = 2.0
"""

WRITER = """
i=0
while [ $i -lt 5 ]; do
    sleep 1
    echo "$((1000 + i)).25 window=1.0" > "$1/objective"
    i=$((i + 1))
done
"""


def test_a_shell_writing_once_a_second_owns_every_tick_it_covers_and_nothing_else(
        mount_root):
    m = Mount(mount_root, CONFIG)
    m.start()
    try:
        sub = m.mountpoint / "app"
        info = (sub / "info").read_text()
        assert '"name": "application"' in info and '"ops/s"' in info
        writer = subprocess.Popen(["sh", "-c", WRITER, "sh", str(sub)])
        try:
            assert writer.wait(timeout=30) == 0
        finally:
            if writer.poll() is None:
                writer.kill()
        written = {1000.25 + i for i in range(5)}
        last = max(written)

        def settled():  # the last figure's ticks and the wait after them are sealed
            rows = read_rows(sub / "dataset")
            ticks = [r["tick"] for r in rows if r["objective"] == last]
            return rows if ticks and rows[-1]["tick"] >= max(ticks) + 5 else None

        rows = wait_for(settled, timeout=20, what="the last figure's rows, sealed")
        objectives = [r["objective"] for r in rows]
        assert all(v in written or math.isnan(v) for v in objectives), objectives
        covered = [v for v in objectives if v in written]
        assert len(covered) >= 6, f"most ticks of 5 s carry a figure: {objectives}"
        assert len(set(covered)) >= 4, "each second's figure covers its own ticks"
        ticks = [r["tick"] for r in rows]
        assert ticks == sorted(ticks) and len(ticks) == len(set(ticks))
    finally:
        m.kill(signal.SIGTERM)
