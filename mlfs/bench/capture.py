"""Per-request capture under fio: requests seen, drops, fio's IOPS with it on and off, CPU.

On a fresh loop device over a sparse file: `fio --rw=randread --bs=4k --iodepth=32
--ioengine=libaio --direct=1 --number_ios=N`, the conditions interleaved (off, on, off,
on, ...).  With the capture on, a real mount serves `linux.bio` for the device (0.5 s
ticks); measured: the records of the run against the read requests the kernel says it
completed (/sys/block/<dev>/stat: fio's I/Os less any the block layer merged) and against
fio's `total_ios`, the records lost (kernel side and pipe), fio's IOPS against the run
without capture just before it, and the CPU of the daemon and its loader over the run,
per 100k requests/s.

It needs root, /dev/fuse, fio, losetup and linux.bio's toolchain (clang, bpftool, libbpf,
BTF); where one is missing the row says which (`unavailable`).  Used by `mlfs bench`
(the `bio_capture` row) and tests/bench/bio_capture.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..client import write_line
from .harness import progress
from .plan import Plan
from .stats import Row, summarize

SUBSYSTEM = "linux.bio"
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
IMAGE_BYTES = 1 << 30
#: seconds to wait for the run's records to be sealed after fio ends, at most, and without
#: a new record (a request that completes with no record, linux.bio's known defect, must
#: not hold the row for the whole wait)
SEAL_WAIT = 60.0
SETTLED = 3.0


def unavailable() -> str | None:
    """Why the capture run cannot happen here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (a loop device, BPF)"
    missing = [tool for tool in ("fio", "losetup") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (Debian: apt-get install fio util-linux)"
    from mlfs.backends.linux.bio import unavailable as bio_unavailable

    why = bio_unavailable()
    return f"linux.bio cannot capture here: {why}" if why else None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The direct children of a process (the daemon's BPF loader)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def device_reads(device: str) -> tuple[int, int]:
    """(read requests completed, reads merged into another request) of the device so far."""
    fields = [int(x) for x in Path(f"/sys/block/{device}/stat").read_text().split()]
    return fields[0], fields[1]


@contextlib.contextmanager
def loop_device(image: Path, size: int = IMAGE_BYTES) -> Iterator[str]:
    """A loop device (`loopN`) over a new sparse file, detached at the end."""
    with open(image, "wb") as fh:
        fh.truncate(size)
    device = os.path.basename(subprocess.run(
        ["losetup", "--find", "--show", str(image)], capture_output=True, text=True,
        check=True).stdout.strip())
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", f"/dev/{device}"], capture_output=True)
        image.unlink(missing_ok=True)


def fio(device: str, ios: int, out: Path) -> dict[str, Any]:
    """One fio run of `ios` random 4 KiB direct reads at queue depth 32: IOPS, total_ios."""
    subprocess.run(["fio", "--name=r", f"--filename=/dev/{device}", "--rw=randread",
                    "--bs=4k", "--iodepth=32", "--ioengine=libaio", "--direct=1",
                    f"--number_ios={ios}", "--output-format=json", f"--output={out}"],
                   check=True, capture_output=True, timeout=600)
    job = json.loads(out.read_text())["jobs"][0]["read"]
    return {"iops": job["iops"], "total_ios": job["total_ios"]}


def _records(mountpoint: Path, expected: int) -> tuple[int, int]:
    """(records sealed, records_lost) once the run's records are sealed (or no new one
    came for SETTLED seconds)."""
    import pyarrow.dataset as ds

    sub = mountpoint / SUBSYSTEM
    now = time.monotonic()
    deadline, grew, seen = now + SEAL_WAIT, now, 0
    while time.monotonic() < min(deadline, grew + SETTLED):
        write_line(sub / "control", "prepare_dataset")
        count = ds.dataset(str(sub / "records"), format="parquet").count_rows()
        if count > seen:
            seen, grew = count, time.monotonic()
        if seen >= expected:
            break
        time.sleep(0.5)
    return seen, json.loads((sub / "info").read_text())["records_lost"]


def capture_runs(work: Path, ios: int, repeats: int,
                 mount: Callable[[str, str, Path], Any]) -> list[dict[str, Any]]:
    """`repeats` interleaved pairs of fio runs, capture off then on.

    `mount(name, config, state_dir)` starts a daemon and returns it started (`pid`,
    `mountpoint`, `stop()`); each "on" run has a mount of its own, stopped after it.
    """
    runs: list[dict[str, Any]] = []
    with loop_device(work / "disk.img") as device:
        for repeat in range(repeats):
            off = fio(device, ios, work / "off.json")
            runs.append({"repeat": repeat, "capture": False, **off})
            daemon = mount(f"capture{repeat}", CONFIG.format(device=device),
                           work / f"state{repeat}")
            try:
                pids = [daemon.pid, *children(daemon.pid)]
                cpu0 = sum(cpu_seconds(p) for p in pids)
                wall0 = time.monotonic()
                before = device_reads(device)
                on = fio(device, ios, work / "on.json")
                after = device_reads(device)
                wall = time.monotonic() - wall0
                cpu = sum(cpu_seconds(p) for p in pids) - cpu0
                # the kernel's own count of the read requests it completed: fio's I/Os the
                # block layer merged into another request are not requests of their own
                on["requests"] = after[0] - before[0]
                on["merged"] = after[1] - before[1]
                on["records"], on["lost"] = _records(daemon.mountpoint, on["requests"])
            finally:
                daemon.stop()
            rate = on["total_ios"] / wall
            runs.append({"repeat": repeat, "capture": True, **on,
                         "iops_ratio": round(on["iops"] / off["iops"], 4),
                         "cpu_share": round(cpu / wall, 4),
                         "cpu_share_per_100k_per_s": round(cpu / wall / (rate / 1e5), 4)})
            progress(f"capture: rep {repeat + 1}/{repeats}: {on['records']:,} records of "
                     f"{on['requests']:,} requests ({on['total_ios']:,} fio I/Os), lost "
                     f"{on['lost']}, IOPS {on['iops']:,.0f} on / {off['iops']:,.0f} off")
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs and whether every request was recorded with nothing lost."""
    on = [r for r in runs if r["capture"]]
    off_iops = statistics.median(r["iops"] for r in runs if not r["capture"])
    on_iops = statistics.median(r["iops"] for r in on)
    return {"iops_off_median": round(off_iops), "iops_on_median": round(on_iops),
            # the ratio of the medians (bench-results/bio-capture.json's since the first run),
            # and the median of the per-pair ratios (the bench row's)
            "iops_ratio": round(on_iops / off_iops, 3),
            "iops_ratio_median": statistics.median(r["iops_ratio"] for r in on),
            "cpu_share_max": max(r["cpu_share"] for r in on),
            "every_request_recorded": all(
                r["records"] == r["requests"] == r["total_ios"] and r["lost"] == 0
                for r in on)}


def bench_capture(session: Any, plan: Plan) -> Row:
    """The `bio_capture` row (skipped, with the reason, where it cannot run)."""
    what = ("per-request capture (linux.bio) under fio randread 4k, iodepth 32, libaio, "
            "direct, on a loop device")
    target = "0 lost, records = requests = fio total_ios; daemon < 1 core"
    why = unavailable()
    if why:
        return Row("bio_capture", what, {}, None, None, target, None, skipped=why)
    progress(f"capture: {plan.capture_reps} × {plan.capture_ios:,} fio I/Os, off then on")
    work = session.scratch(None)
    try:
        runs = capture_runs(work, plan.capture_ios, plan.capture_reps, session.mount)
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError, KeyError) as exc:
        # a loop device refused, fio or the mount failed: the row says so, the rest of
        # the bench goes on (the session still ends every mount it started)
        reason = " ".join(f"the capture run failed: {exc}".split())[:300]
        progress(f"capture: {reason}")
        return Row("bio_capture", what, {}, None, None, target, None, skipped=reason)
    on = [r for r in runs if r["capture"]]
    figures = summary(runs)
    met = figures["every_request_recorded"] and figures["cpu_share_max"] < 1.0
    return Row(
        "bio_capture", what,
        {"IOPS on": summarize([r["iops"] for r in on]),
         "records": summarize([r["records"] for r in on]),
         "device requests": summarize([r["requests"] for r in on]),
         "fio total_ios": summarize([r["total_ios"] for r in on]),
         "lost": summarize([r["lost"] for r in on]),
         "daemon CPU (cores)": summarize([r["cpu_share"] for r in on]),
         "cores per 100k ev/s": summarize([r["cpu_share_per_100k_per_s"] for r in on])},
        {"IOPS off": summarize([r["iops"] for r in runs if not r["capture"]])},
        summarize([r["iops_ratio"] for r in on]), target, met,
        f"{plan.capture_reps} interleaved pairs (off, then on with a mount of its own) of "
        f"{plan.capture_ios:,} I/Os on a 1 GiB sparse loop device; ratio: fio IOPS with the "
        "capture / without, per pair; requests from /sys/block/<dev>/stat; CPU: utime + "
        "stime of the daemon and its loader over the fio run",
        extra={"runs": runs, **figures})
