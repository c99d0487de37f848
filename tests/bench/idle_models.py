"""What idle models cost the daemon: CPU share and file descriptors (issue 10).

    .venv/bin/python -m tests.bench.idle_models --models 0 2000 3000

Mounts the fast simulated subsystem (ticks every 20 ms), creates N models
with mkdir (not started), waits, then reads the daemon's utime+stime from
/proc/PID/stat over a few seconds and counts /proc/PID/fd.  Needs root and
/dev/fuse, as the mount tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import Mount


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(models: int, seconds: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mlfs-bench-", dir="/tmp"))
    os.chmod(root, 0o755)
    m = Mount(root).start()
    try:
        started = time.monotonic()
        for i in range(models):
            (m.sub / "models" / f"idle{i}").mkdir()
        mkdir_seconds = time.monotonic() - started
        time.sleep(2.0)
        before, t0 = cpu_seconds(m.pid), time.monotonic()
        time.sleep(seconds)
        share = (cpu_seconds(m.pid) - before) / (time.monotonic() - t0)
        return {"models": models, "cpu_share": round(share, 4),
                "fds": len(os.listdir(f"/proc/{m.pid}/fd")),
                "mkdir_ms": round(1000 * mkdir_seconds / max(models, 1), 2)}
    finally:
        m.umount()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[0, 2000])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    for n in args.models:
        print(json.dumps(measure(n, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
