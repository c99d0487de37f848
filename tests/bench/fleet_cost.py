"""The pusher's cost on a host: CPU share and bytes per hour at 1 tick/s.

Mounts sim.readahead ticking once a second (portions sealed every 10 s, the
default), runs `mlfs fleet push --interval 5` against a local directory store,
lets it start (its start-up CPU is reported apart), then measures its CPU time
(/proc/<pid>/stat utime + stime) and the store's growth over SECONDS.

    .venv/bin/python -m tests.bench.fleet_cost 240     # as root (a FUSE mount)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import FAST_CONFIG, REPO, Mount, mlfs_command

CLOCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK


def tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 240.0
    root = Path(tempfile.mkdtemp(prefix="mlfs-fleet-cost-", dir="/tmp"))
    os.chmod(root, 0o755)
    config = (FAST_CONFIG.replace("tick_seconds = 0.02", "tick_seconds = 1.0")
              .replace("seal_seconds = 1.0", "seal_seconds = 10.0"))
    m = Mount(root, config=config)
    store = root / "store"
    pusher = None
    try:
        m.start()
        with open(root / "pusher.log", "wb") as log:
            pusher = subprocess.Popen(
                mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                             "--state-dir", str(m.state_dir), "--interval", "5"),
                cwd=REPO, stdout=log, stderr=log)
        time.sleep(30)
        cpu0, bytes0, t0 = cpu_seconds(pusher.pid), tree_bytes(store), time.monotonic()
        time.sleep(seconds)
        cpu1, bytes1, t1 = cpu_seconds(pusher.pid), tree_bytes(store), time.monotonic()
        elapsed = t1 - t0
        print(json.dumps({"seconds": round(elapsed, 1), "startup_cpu_seconds": cpu0,
                          "cpu_seconds": round(cpu1 - cpu0, 2),
                          "cpu_share": round((cpu1 - cpu0) / elapsed, 5),
                          "store_bytes": bytes1 - bytes0,
                          "bytes_per_hour": round((bytes1 - bytes0) * 3600 / elapsed)}))
    finally:
        if pusher is not None and pusher.poll() is None:
            os.kill(pusher.pid, signal.SIGTERM)
            pusher.wait(timeout=30)
        m.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
