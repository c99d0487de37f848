"""Measure a real device's response to read_ahead_kb, through the linux.block backend.

Why: `sim.readahead` claims its throughput curves are modelled on a loop
device's measurements.  This re-measures them on this machine, so the claim
can be checked (and the anchors re-fitted) instead of believed, and it does so
through `LinuxBlock` itself: the knob is written by the backend under its
safety rules (ledger, bounds, restore on close), and the device-side features
are the ones a dataset row would carry.

Set-up: a sparse image file on the root file system, attached as a direct-io
loop device (so the host's page cache does not serve the reads), ext4 on it,
one data file.  For each read_ahead_kb and each pattern the file's pages are
dropped (POSIX_FADV_DONTNEED: a cold cache, as in the calibration) and the
pattern runs for a fixed number of bytes or seconds, `--repeats` times
(the median is shown with the range: on a shared VM single trials vary 2x):

- ``sequential``: 4 KiB buffered reads from the start of the file;
- ``random_pread``: 4 KiB preads at uniformly random 4 KiB-aligned offsets;
- ``strided``: 32 KiB records every 512 KiB.

Output: one line per (pattern, read_ahead_kb) with the application's MiB/s,
the device's read MB/s and mean request size (from the backend's features)
and `sim.readahead`'s noise-free curve for comparison.  Needs root, losetup,
mkfs.ext4 and mount; everything is undone at the end (even on Ctrl-C).

    .venv/bin/python -m tests.bench.readahead_experiment            # ~1-2 minutes
    .venv/bin/python -m tests.bench.readahead_experiment --quick    # ~10 s
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mlfs.backends.linux.block import LinuxBlock
from mlfs.backends.sim_readahead import throughput_curve

MIB = 1 << 20
GRID = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QUICK_GRID = (0, 32, 128, 512, 4096)


def run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout.strip()


#: the root blkio cgroup's throttle files (cgroup v1): they cap every process's I/O to
#: a device, the flusher's writeback included
BLKIO = Path("/sys/fs/cgroup/blkio")


def _cap(device: str, mb_per_s: int) -> None:
    number = Path(f"/sys/block/{Path(device).name}/dev").read_text().strip()
    for kind in ("read", "write"):
        (BLKIO / f"blkio.throttle.{kind}_bps_device").write_text(
            f"{number} {mb_per_s * 1_000_000}\n")


@contextmanager
def scratch_filesystem(size_mib: int, cap_mb_per_s: int = 0) -> Iterator[tuple[str, Path]]:
    """(loop device name, mounted directory) of a fresh ext4 on a direct-io loop.

    `cap_mb_per_s`: the device's reads and writes capped at that rate (the root
    blkio cgroup's throttle, which the flusher's writeback obeys too).  The
    loop's image lives on the VM's virtual disk, whose speed wanders with the
    host's cache (sequential reads of 36-291 MiB/s under one setting in the
    queue sweep, random writes at memory speed on some runs): a cap below the
    host's slowest makes it a device of one known speed.  0: no cap.
    """
    with tempfile.TemporaryDirectory(prefix="mlfs-ra-") as tmp:
        image, mnt = Path(tmp) / "disk.img", Path(tmp) / "mnt"
        mnt.mkdir()
        with open(image, "wb") as fh:
            fh.truncate(size_mib * MIB)
        device = run("losetup", "--find", "--show", "--direct-io=on", str(image))
        try:
            if cap_mb_per_s:
                _cap(device, cap_mb_per_s)
            run("mkfs.ext4", "-q", "-F", device)
            run("mount", device, str(mnt))
            try:
                yield Path(device).name, mnt
            finally:
                run("umount", str(mnt))
        finally:
            if cap_mb_per_s:
                _cap(device, 0)  # 0 removes the rule
            run("losetup", "-d", device)


def make_file(path: Path, size_mib: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as fh:
        for _ in range(size_mib):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def sequential(path: Path, budget_bytes: int, seconds: float) -> int:
    done = 0
    deadline = time.monotonic() + seconds
    with open(path, "rb", buffering=0) as fh:
        while done < budget_bytes and time.monotonic() < deadline:
            chunk = fh.read(4096)
            if not chunk:
                break
            done += len(chunk)
    return done


def random_pread(path: Path, budget_bytes: int, seconds: float) -> int:
    rng = random.Random(0)
    pages = path.stat().st_size // 4096
    done = 0
    deadline = time.monotonic() + seconds
    fd = os.open(path, os.O_RDONLY)
    try:
        while done < budget_bytes and time.monotonic() < deadline:
            done += len(os.pread(fd, 4096, rng.randrange(pages) * 4096))
    finally:
        os.close(fd)
    return done


def strided(path: Path, budget_bytes: int, seconds: float) -> int:
    size = path.stat().st_size
    done = 0
    deadline = time.monotonic() + seconds
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, 512 * 1024):
            if done >= budget_bytes or time.monotonic() >= deadline:
                break
            for page in range(0, 32 * 1024, 4096):  # 4 KiB reads, as an application would
                done += len(os.pread(fd, 4096, offset + page))
    finally:
        os.close(fd)
    return done


PATTERNS: dict[str, Callable[[Path, int, float], int]] = {
    "sequential": sequential,
    "random_pread": random_pread,
    "strided": strided,
}


def measure(args: argparse.Namespace) -> list[dict]:
    grid = QUICK_GRID if args.quick else GRID
    file_mib = 64 if args.quick else args.file_mib
    seconds = 0.5 if args.quick else args.seconds
    repeats = 1 if args.quick else args.repeats
    rows: list[dict] = []
    with scratch_filesystem(file_mib * 2 + 64) as (device, mnt):
        data = mnt / "data"
        make_file(data, file_mib)
        state = mnt.parent / "state"
        sub = LinuxBlock(device, measure_seconds=0, state_dir=state,
                         apply={"read_ahead_kb": [0, max(grid)]})
        try:
            for ra in grid:
                for name, pattern in PATTERNS.items():
                    trials = []
                    for _ in range(repeats):
                        drop_cache(data)
                        sample = sub.step({"read_ahead_kb": ra})  # apply; starts the window
                        for reason in sample.extra.get("refused", {}).values():
                            print(f"refused: {reason}", file=sys.stderr)
                        started = time.perf_counter()
                        done = pattern(data, file_mib * MIB, seconds)
                        elapsed = time.perf_counter() - started
                        features = sub.step({"read_ahead_kb": ra}).features  # ends it
                        trials.append((done / MIB / elapsed, features["read_mb_per_s"],
                                       features["read_req_kb"]))
                    app, dev, req = (statistics.median(t[i] for t in trials) for i in range(3))
                    row = {
                        "pattern": name, "read_ahead_kb": ra,
                        "app_mib_per_s": round(app, 1),
                        "app_min_max": [round(min(t[0] for t in trials), 1),
                                        round(max(t[0] for t in trials), 1)],
                        "device_mb_per_s": round(dev, 1),
                        "device_req_kb": round(req, 1),
                        "model_mib_per_s": round(throughput_curve(name, ra), 1),
                    }
                    rows.append(row)
                    print(json.dumps(row) if args.json else
                          f"{name:13s} ra={ra:5d}  app {row['app_mib_per_s']:8.1f} MiB/s "
                          f"{str(row['app_min_max']):>16s}  "
                          f"device {row['device_mb_per_s']:8.1f} MB/s "
                          f"({row['device_req_kb']:6.1f} KiB/req)  "
                          f"model {row['model_mib_per_s']:8.1f}", flush=True)
        finally:
            sub.close()  # the loop device's original read_ahead_kb, from the ledger
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid, 64 MiB file")
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="most seconds per (pattern, read_ahead_kb)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="trials per point (median shown, with min and max)")
    parser.add_argument("--json", action="store_true", help="JSON Lines output")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("readahead_experiment: needs root (loop devices, mount)", file=sys.stderr)
        return 2
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
