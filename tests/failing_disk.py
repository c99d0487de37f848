"""A disk that fails the way drives do, for tests and benchmarks: a one-file FUSE file system.

    python -m tests.failing_disk MOUNTPOINT --seed N [--size-mb 64] [--healthy S]
        [--degrading S] [--schedule-out FILE]

This kernel has no device-mapper (dm-flakey, dm-error), no fault injection, no null_blk,
nbd or ublk, so a failing block device is made here: MOUNTPOINT/disk.img is a file whose
reads and writes are served from memory with a latency and an error rate that follow a
schedule drawn from the seed.  A loop device over it turns every failed request into a
genuine kernel `I/O error, dev loopN, sector ...` record, as a dying drive would.

The schedule has three stages, in seconds since the mount:
- healthy: no errors, a small latency;
- degrading (drawn length): latency rises and sporadic requests fail, more and more of
  them (a rate that grows exponentially, from about one in ten thousand);
- failed: the burst that ends the disk: most requests fail.
No single precursor gives the end away: the latency's noise is large, and error counts
start at rates indistinguishable from the occasional transient error of a healthy disk.
The drawn schedule is written as JSON (`--schedule-out`) so a test or benchmark knows the
truth afterwards (the failure time), never before.

Served with direct_io, so every read of the loop device reaches this process (no page
cache hides the failures); the FUSE-notes rules hold: every handler answers quickly,
nothing touches its own mount.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import signal
import stat
import sys
import time

import numpy as np
import pyfuse3
import trio

FILE_NAME = b"disk.img"
FILE_INODE = pyfuse3.ROOT_INODE + 1
#: the error rate at the start of the degradation and when the disk fails
ERROR_RATE_START = 1e-4
ERROR_RATE_FAILED = 0.8
#: latency of a healthy request, and its rise by the failure
LATENCY_HEALTHY_S = 0.0002
LATENCY_RISE_S = 0.004


class Schedule:
    """Healthy until `onset`, degrading until `failure`, then failed (seconds)."""

    def __init__(self, seed: int, healthy: float, degrading: float) -> None:
        rng = np.random.default_rng([seed, 30])
        self.seed = seed
        self.onset = float(healthy * rng.uniform(0.6, 1.4))
        self.failure = self.onset + float(degrading * rng.uniform(0.6, 1.4))
        self._rng = np.random.default_rng([seed, 31])

    def error_rate(self, t: float) -> float:
        if t < self.onset:
            return 0.0
        if t >= self.failure:
            return ERROR_RATE_FAILED
        progress = (t - self.onset) / (self.failure - self.onset)
        # exponential growth from ERROR_RATE_START to a tenth of the failed rate
        return ERROR_RATE_START * math.exp(progress * math.log(0.1 * ERROR_RATE_FAILED
                                                               / ERROR_RATE_START))

    def latency(self, t: float) -> float:
        base = LATENCY_HEALTHY_S
        if t >= self.onset:
            progress = min(1.0, (t - self.onset) / (self.failure - self.onset))
            base += LATENCY_RISE_S * progress
        return base * float(np.exp(0.5 * self._rng.standard_normal()))

    def fails(self, t: float) -> bool:
        return bool(self._rng.random() < self.error_rate(t))

    def as_dict(self) -> dict:
        return {"seed": self.seed, "onset_s": self.onset, "failure_s": self.failure,
                "error_rate_start": ERROR_RATE_START, "error_rate_failed": ERROR_RATE_FAILED}


class FailingDisk(pyfuse3.Operations):
    def __init__(self, size: int, schedule: Schedule) -> None:
        super().__init__()
        self.data = bytearray(size)
        self.schedule = schedule
        self.started = time.monotonic()
        self.requests = 0
        self.failed = 0

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        if inode == pyfuse3.ROOT_INODE:
            entry.st_mode = stat.S_IFDIR | 0o755
            entry.st_nlink = 2
        else:
            entry.st_mode = stat.S_IFREG | 0o600
            entry.st_nlink = 1
            entry.st_size = len(self.data)
        entry.attr_timeout = 300
        entry.entry_timeout = 300
        return entry

    async def getattr(self, inode, ctx=None):
        if inode not in (pyfuse3.ROOT_INODE, FILE_INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == pyfuse3.ROOT_INODE and name == FILE_NAME:
            return self._attr(FILE_INODE)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, inode, ctx):
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        if start_id == 0:
            pyfuse3.readdir_reply(token, FILE_NAME, self._attr(FILE_INODE), 1)

    async def open(self, inode, flags, ctx):
        if inode != FILE_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        return pyfuse3.FileInfo(fh=inode, direct_io=True, keep_cache=False)

    async def _request(self) -> None:
        t = time.monotonic() - self.started
        self.requests += 1
        await trio.sleep(self.schedule.latency(t))
        if self.schedule.fails(t):
            self.failed += 1
            raise pyfuse3.FUSEError(errno.EIO)

    async def read(self, fh, off, size):
        await self._request()
        return bytes(self.data[off:off + size])

    async def write(self, fh, off, buf):
        await self._request()
        end = min(len(self.data), off + len(buf))
        if off >= len(self.data):
            raise pyfuse3.FUSEError(errno.ENOSPC)
        self.data[off:end] = buf[:end - off]
        return end - off

    async def fsync(self, fh, datasync):
        await self._request()

    async def release(self, fh):
        return None


class FailingLoop:
    """A failing disk mounted at `root`/mnt in a child process, with a loop device over it.

    For tests and benchmarks: `start()` returns once the loop device exists; `stop()`
    detaches it and ends the child by its PID (never by name), whatever happened.
    """

    def __init__(self, root, seed: int, healthy: float, degrading: float,
                 size_mb: int = 64) -> None:
        from pathlib import Path

        self.root = Path(root)
        self.mountpoint = self.root / "mnt"
        self.schedule_file = self.root / "schedule.json"
        self.args = ["--seed", str(seed), "--healthy", str(healthy), "--degrading",
                     str(degrading), "--size-mb", str(size_mb), "--schedule-out",
                     str(self.schedule_file)]
        self.process = None
        self.device: str | None = None  # e.g. "/dev/loop3"

    def start(self) -> FailingLoop:
        import subprocess

        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.failing_disk", str(self.mountpoint), *self.args],
            stderr=subprocess.PIPE, text=True)
        image = self.mountpoint / FILE_NAME.decode()
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the failing disk did not mount")
            time.sleep(0.02)
        done = subprocess.run(["losetup", "--find", "--show", str(image)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"losetup: {done.stderr.strip()}")
        self.device = done.stdout.strip()
        return self

    @property
    def name(self) -> str:
        return os.path.basename(self.device or "")

    def schedule(self) -> dict:
        with open(self.schedule_file) as fh:
            return json.load(fh)

    def stop(self) -> None:
        import subprocess

        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True)
            self.device = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                           capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mountpoint")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--healthy", type=float, default=20.0, help="mean healthy seconds")
    parser.add_argument("--degrading", type=float, default=30.0,
                        help="mean degrading seconds")
    parser.add_argument("--schedule-out", help="write the drawn schedule here (JSON)")
    args = parser.parse_args(argv)
    if not 1 <= args.size_mb <= 4096:
        print("failing_disk: --size-mb must be 1..4096", file=sys.stderr)
        return 2
    schedule = Schedule(args.seed, args.healthy, args.degrading)
    if args.schedule_out:
        with open(args.schedule_out, "w") as out:
            json.dump(schedule.as_dict(), out)
    ops = FailingDisk(args.size_mb << 20, schedule)
    options = set(pyfuse3.default_options)
    options.add("fsname=failing_disk")
    pyfuse3.init(ops, args.mountpoint, options)

    async def run():
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                async def stop_on_signal():
                    async for _ in signals:
                        pyfuse3.terminate()
                        return
                nursery.start_soon(stop_on_signal)
                await pyfuse3.main()
                nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    print(json.dumps({"requests": ops.requests, "failed": ops.failed}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
