"""Per-request capture under fio: requests seen, drops, fio's IOPS with it on and off, CPU.

    python -m tests.bench.bio_capture [--ios 200000] [--repeats 3] [--json FILE]

As root, on a fresh loop device over a sparse file: `fio --rw=randread --bs=4k
--iodepth=32 --direct=1 --number_ios=N`, the conditions interleaved (off, on, off, on,
...) `--repeats` times.  With the capture on, a real mount serves `linux.bio` for the
device (0.5 s ticks); measured: the records of the run against the read requests the
kernel says it completed (/sys/block/<dev>/stat: fio's I/Os less any the block layer
merged), the records lost (kernel side and pipe), fio's IOPS against the runs without
capture, and
the CPU of the daemon and its loader over the run, per 100k requests/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds

from mlfs.client import MountProcess, write_line

CONFIG = """
[mount]
allow_other = true

[store]
seal_seconds = 1.0

[[subsystem]]
backend = "linux.bio"
device = "{device}"
tick_seconds = 0.5
"""


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _reads(device: str) -> tuple[int, int]:
    """(read requests completed, reads merged into another request) of the device so far."""
    fields = [int(x) for x in Path(f"/sys/block/{device}/stat").read_text().split()]
    return fields[0], fields[1]


def fio(device: str, ios: int, out: Path) -> dict:
    subprocess.run(["fio", "--name=r", f"--filename=/dev/{device}", "--rw=randread",
                    "--bs=4k", "--iodepth=32", "--ioengine=libaio", "--direct=1",
                    f"--number_ios={ios}", "--output-format=json", f"--output={out}"],
                   check=True, capture_output=True, timeout=600)
    job = json.loads(out.read_text())["jobs"][0]["read"]
    return {"iops": job["iops"], "total_ios": job["total_ios"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ios", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mlfs-bio-bench-"))
    image = work / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(1 << 30)
    device = os.path.basename(subprocess.run(["losetup", "--find", "--show", str(image)],
                                             capture_output=True, text=True,
                                             check=True).stdout.strip())
    runs: list[dict] = []
    try:
        for repeat in range(args.repeats):
            off = fio(device, args.ios, work / "off.json")
            runs.append({"repeat": repeat, "capture": False, **off})
            (work / "mnt").mkdir(exist_ok=True)
            (work / "mlfs.toml").write_text(CONFIG.format(device=device))
            daemon = MountProcess(work / "mnt", work / f"state{repeat}", work / "mlfs.toml",
                                  timeout=60)
            daemon.start()
            try:
                pids = [daemon.pid, *_children(daemon.pid)]
                cpu0 = sum(_cpu(p) for p in pids)
                wall0 = time.monotonic()
                before = _reads(device)
                on = fio(device, args.ios, work / "on.json")
                after = _reads(device)
                wall = time.monotonic() - wall0
                # the kernel's own count of the read requests it completed: fio's I/Os the
                # block layer merged into another request are not requests of their own
                on["requests"] = after[0] - before[0]
                on["merged"] = after[1] - before[1]
                cpu = sum(_cpu(p) for p in pids) - cpu0
                sub = work / "mnt" / "linux.bio"
                deadline = time.monotonic() + 60
                seen = 0
                while time.monotonic() < deadline:
                    write_line(sub / "control", "prepare_dataset")
                    seen = ds.dataset(str(sub / "records"), format="parquet").count_rows()
                    if seen >= on["requests"]:
                        break
                    time.sleep(0.5)
                lost = json.loads((sub / "info").read_text())["records_lost"]
                rate = on["total_ios"] / wall
                runs.append({"repeat": repeat, "capture": True, **on, "records": seen,
                             "lost": lost, "cpu_share": round(cpu / wall, 4),
                             "cpu_share_per_100k_per_s": round(cpu / wall / (rate / 1e5), 4)})
            finally:
                daemon.stop()
    finally:
        subprocess.run(["losetup", "-d", f"/dev/{device}"], capture_output=True)
    off_iops = [r["iops"] for r in runs if not r["capture"]]
    on_iops = [r["iops"] for r in runs if r["capture"]]
    results = {"runs": runs, "iops_off_median": round(statistics.median(off_iops)),
               "iops_on_median": round(statistics.median(on_iops)),
               "iops_ratio": round(statistics.median(on_iops) / statistics.median(off_iops), 3),
               "every_request_recorded": all(r["records"] == r["requests"] and r["lost"] == 0
                                             for r in runs if r["capture"])}
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
