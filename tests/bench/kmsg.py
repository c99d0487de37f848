"""The kernel log's rates: records drained from /dev/kmsg into Parquet, and the CPU it costs.

    python -m tests.bench.kmsg [--records 20000] [--paced-seconds 20] [--json FILE]

As root, on a real mount serving `linux.kmsg` (tick 0.1 s, `start = "now"`):

1. burst: a writer fills the kernel's ring as fast as it can (one open per record,
   /dev/kmsg's per-open rate limit); measured: the writer's rate, the rate at which the
   records became rows of sealed Parquet portions, and how many were lost (ring overrun);
2. paced: a writer at 1,000 records/s for `--paced-seconds`; measured: the daemon's CPU
   (user + system, /proc/PID/stat) over the wall time, as a share of one core.

The figures depend on the machine's load; run it on a quiet machine and report them all.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.dataset as ds

from mlfs.client import MountProcess, write_line
from tests.bench.shared import emit

CONFIG = """
[mount]
allow_other = true

[store]
seal_seconds = 1.0

[[subsystem]]
backend = "linux.kmsg"
tick_seconds = 0.1
start = "now"
"""


@contextmanager
def kmsg_mount(prefix: str) -> Iterator[MountProcess]:
    """A real mount serving `linux.kmsg` (`CONFIG`) in a new directory, stopped on the
    way out whatever happens inside the block."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "mnt").mkdir()
    (work / "mlfs.toml").write_text(CONFIG)
    daemon = MountProcess(work / "mnt", work / "state", work / "mlfs.toml", timeout=60)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def _write(message: str) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, message.encode())
    finally:
        os.close(fd)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rows(sub: Path, marker: str) -> tuple[int, int]:
    write_line(sub / "control", "prepare_dataset")
    table = ds.dataset(str(sub / "records"), format="parquet").to_table(
        columns=["message", "kind", "count"])
    messages = table.column("message").to_pylist()
    kinds = table.column("kind").to_pylist()
    counts = table.column("count").to_pylist()
    seen = sum(1 for m in messages if m.startswith(marker))
    lost = sum(c for k, c in zip(kinds, counts, strict=True) if k == "lost")
    return seen, lost


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--paced-seconds", type=float, default=20.0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    results: dict = {}
    with kmsg_mount("mlfs-kmsg-bench-") as daemon:
        sub = daemon.mountpoint / "linux.kmsg"
        marker = f"random: bench {os.getpid()} "
        start = time.monotonic()
        for i in range(args.records):
            _write(f"<6>{marker}{i}\n")
        written = time.monotonic() - start
        deadline = time.monotonic() + 120
        seen = lost = 0
        last_change = time.monotonic()
        while time.monotonic() < deadline:
            now_seen, now_lost = _rows(sub, marker)
            if (now_seen, now_lost) != (seen, lost):
                seen, lost, last_change = now_seen, now_lost, time.monotonic()
            if seen + lost >= args.records or time.monotonic() - last_change > 5:
                break
            time.sleep(0.2)
        drained = last_change - start
        results["burst"] = {"records": args.records, "writer_per_s": round(args.records / written),
                            "rows": seen, "lost": lost,
                            "drained_per_s": round(seen / drained),
                            "seconds_to_parquet": round(drained, 2)}
        paced = f"random: paced {os.getpid()} "
        cpu0, wall0 = _cpu_seconds(daemon.pid), time.monotonic()
        n = 0
        while time.monotonic() - wall0 < args.paced_seconds:
            due = int((time.monotonic() - wall0) * 1000)
            while n < due:
                _write(f"<6>{paced}{n}\n")
                n += 1
            time.sleep(0.005)
        cpu = _cpu_seconds(daemon.pid) - cpu0
        wall = time.monotonic() - wall0
        results["paced"] = {"records_per_s": round(n / wall), "seconds": round(wall, 1),
                            "daemon_cpu_share_of_one_core": round(cpu / wall, 4)}
    return emit(results, args.json)


if __name__ == "__main__":
    main()
