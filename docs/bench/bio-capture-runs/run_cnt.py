"""The loader alone under fio, with the kernel's own count of each BPF program's runs.

    sysctl -w kernel.bpf_stats_enabled=1
    .venv/bin/python docs/bench/bio-capture-runs/run_cnt.py 6     (as root)
    sysctl -w kernel.bpf_stats_enabled=0

Per run of 200,000 fio random reads on a fresh loop device: the records the loader
wrote (its stdout, read after SIGTERM), the device's completed reads
(/sys/block/<dev>/stat), fio's total_ios, the kernel side's ring-full count, and
`bpftool prog show`'s run_cnt and recursion_misses of rq_insert, rq_issue,
rq_complete and rq_requeue (run_cnt counts every device; recursion_misses is printed
only when not 0), and the records whose issue or completion the capture did not see.
Its output at 65d7286 (the kernel's skipped completions missing) is run_cnt-65d7286.txt
beside it; at 32e89e9 (recorded at their struct's next issue) run_cnt-32e89e9.txt.
"""
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from mlfs.backends.linux.bio import MARKER, RECORD, build, device_number  # noqa: E402

from mlfs.bench.capture import loop_device as capture_loop_device  # noqa: E402

IMAGE = Path("/tmp/mlfs-run-cnt-disk.img")
RECORDS = Path("/tmp/mlfs-run-cnt-records.bin")
FIO = ["fio", "--name=r", "--rw=randread", "--bs=4k", "--iodepth=32", "--ioengine=libaio",
       "--direct=1", "--number_ios=200000", "--output-format=json"]


PROGRAMS = ("rq_insert", "rq_issue", "rq_complete", "rq_requeue")


def programs() -> dict:
    """run_cnt and recursion_misses of the capture's three programs."""
    shown = json.loads(subprocess.run(["bpftool", "prog", "show", "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    return {p["name"]: {k: p.get(k, 0) for k in ("run_cnt", "recursion_misses")}
            for p in shown if p.get("name", "") in PROGRAMS}


@contextlib.contextmanager
def loop_device() -> Iterator[str]:
    """A loop device over a fresh sparse 1 GiB file (mlfs.bench.capture's), detached and
    removed at the end, with the records file."""
    try:
        with capture_loop_device(IMAGE) as dev:
            yield dev
    finally:
        RECORDS.unlink(missing_ok=True)


def completed_reads(dev: str) -> int:
    return int(Path(f"/sys/block/{dev}/stat").read_text().split()[0])


def start_loader(dev: str, out) -> subprocess.Popen:
    """linux.bio's loader for `dev`, writing its records to `out`, once attached."""
    loader = subprocess.Popen([str(build()), str(device_number(dev))], stdout=out,
                              stderr=subprocess.PIPE)
    assert loader.stderr.readline().strip() == b"ready"
    return loader


def records_written() -> np.ndarray:
    """Everything the ended loader wrote: records and ring-full markers."""
    return np.fromfile(RECORDS, dtype=RECORD)


def main(runs: int) -> None:
    with loop_device() as dev:
        for run in range(runs):
            with open(RECORDS, "wb") as out:
                loader = start_loader(dev, out)
                before = completed_reads(dev)
                fio = subprocess.run([*FIO, f"--filename=/dev/{dev}"], capture_output=True,
                                     text=True, check=True)
                reads = completed_reads(dev) - before
                time.sleep(0.5)
                counts = programs()
                loader.send_signal(signal.SIGTERM)
                loader.wait()
            raw = records_written()
            markers = raw["issue_ns"] == MARKER
            ring_full = int(raw["sector"][markers].max()) if markers.any() else 0
            raw = raw[~markers]
            total_ios = json.loads(fio.stdout)["jobs"][0]["read"]["total_ios"]
            print(f"run {run}: records {len(raw)}, device reads {reads}, fio {total_ios}, "
                  f"ring full {ring_full}, issue unseen {int((raw['issue_ns'] == 0).sum())}, "
                  f"completion unseen {int((raw['complete_ns'] == 0).sum())}, "
                  f"programs {counts}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
