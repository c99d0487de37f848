"""The pusher's cost on a host: CPU share and bytes per hour at 1 tick/s.

A real mount with one sim.readahead subsystem ticking once a second (the
store's default sealing: a dataset portion every 10 s, feedback every 2 s,
the journal every 30 s) and one started model, and `mlfs fleet push` running
as the service runs it (a loop, `--interval`) into a directory store.  After
a warm-up (the pusher's imports and its first pass over what is already
sealed) the pusher's CPU time (utime + stime of /proc/<pid>/stat) and the
store's growth are measured over `--seconds`; the daemon's own CPU time over
the same window is given for scale.

    .venv/bin/python -m tests.bench.fleet_cost --seconds 240 \\
        --json bench-results/fleet-cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.harness import REPO, Mount, mlfs_command

CONFIG = """
[mount]
allow_other = true

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 5
tick_seconds = 1.0
"""

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=5.0,
                        help="the pusher's --interval (its default: 5 s)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mlfs-fleet-cost-", dir="/tmp"))
    os.chmod(root, 0o755)
    store = root / "store"
    m = Mount(root, config=CONFIG, name="host")
    pusher = None
    try:
        m.start()
        model = m.sub / "models" / "lgbm"
        model.mkdir()
        (model / "control").write_text("start\n")
        log = open(root / "push.log", "ab")  # noqa: SIM115 (the child owns it)
        pusher = subprocess.Popen(
            mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                         "--state-dir", str(m.state_dir), "--interval", str(args.interval)),
            stdout=log, stderr=log, cwd=REPO)
        log.close()
        time.sleep(args.warmup)
        if pusher.poll() is not None:
            raise RuntimeError((root / "push.log").read_text()[-2000:])
        daemon_pid = m.pid
        t0, c0, d0, b0 = time.monotonic(), cpu_seconds(pusher.pid), cpu_seconds(daemon_pid), \
            store_bytes(store)
        time.sleep(args.seconds)
        t1, c1, d1, b1 = time.monotonic(), cpu_seconds(pusher.pid), cpu_seconds(daemon_pid), \
            store_bytes(store)
        wall = t1 - t0
        objects = sum(1 for p in store.rglob("*.parquet"))
        result = {
            "tick_seconds": 1.0, "pusher_interval": args.interval,
            "window_seconds": round(wall, 1), "warmup_seconds": args.warmup,
            "pusher_cpu_seconds": round(c1 - c0, 2),
            "pusher_cpu_share": round((c1 - c0) / wall, 4),
            "daemon_cpu_share": round((d1 - d0) / wall, 4),
            "store_bytes_in_window": b1 - b0,
            "bytes_per_hour": round((b1 - b0) / wall * 3600),
            "objects_in_store": objects,
        }
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if pusher is not None and pusher.poll() is None:
            os.kill(pusher.pid, signal.SIGTERM)
            try:
                pusher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(pusher.pid, signal.SIGKILL)
                pusher.wait()
        m.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
