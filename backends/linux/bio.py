"""linux.bio: every block request as a record, captured by a BPF program, no Python per row.

What `biosnoop` prints, as a dataset: one record per completed request (device, sector,
bytes, operation and flags, issue and completion times and so latency, requests of its
device in flight at issue, the submitting pid).  The kernel side is a BPF CO-RE program
(backends/linux/bpf/blkreq.bpf.c) on BTF-typed block tracepoints: block_rq_insert notes the
submitter (at issue it is often a kworker), block_rq_issue the time and queue depth,
block_rq_complete reserves a fixed 48-byte record in a BPF ring buffer and submits it.
A small libbpf loader (backends/linux/bpf/blkreq.c) drains the ring and copies the records to
a pipe in bulk; each tick the backend reads the pipe in one go and decodes the bytes
with a numpy structured dtype: the proposal's shared memory with a producer and a
consumer position, without a Python object per request.

Why this toolchain: bcc needs kernel headers (absent here) and compiles at every start;
bpftrace prints text a line per event (measured at ~6 % of fio's IOPS for counting
alone); libbpf CO-RE with Debian's clang 14, libbpf 1.1 and bpftool 7.1 compiles once
against the kernel's own BTF (/sys/kernel/btf/vmlinux), and its ring buffer hands the
loader whole pages of records.  The build (about 2 s) is cached per kernel release and
source in /var/cache/mlfs/bpf.

Records the ring had no room for are counted on the kernel side; the loader reports the
running count, and each tick's new losses are `records_lost` (metric, `info`).  Loading
is root's: every request names the pid that made it.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from mlfs.abi import (
    EXTRA_RECORDS_LOST,
    Objective,
    Sample,
    Schema,
    SettingError,
    Subsystem,
    check_settings,
    defaults_from,
    text,
    tick_seconds,
)

ROOT_ONLY = True
SOURCES = Path(__file__).resolve().parent / "bpf"
CACHE = Path(os.environ.get("MLFS_BPF_CACHE", "/var/cache/mlfs/bpf"))
#: the loader's record: struct record of blkreq.bpf.c
RECORD = np.dtype([("issue_ns", "<u8"), ("complete_ns", "<u8"), ("sector", "<u8"),
                   ("dev", "<u4"), ("bytes", "<u4"), ("pid", "<u4"), ("cmd_flags", "<u4"),
                   ("queue_depth", "<u4"), ("error", "<i4")])
assert RECORD.itemsize == 48
MARKER = np.uint64(0xFFFFFFFFFFFFFFFF)
#: bytes held between ticks at most (about 5.6 M requests); beyond, records are counted lost
MAX_HELD = 256 << 20
#: REQ_OP_* (include/linux/blk_types.h): the low 8 bits of cmd_flags
OPS = {0: "read", 1: "write", 2: "flush", 3: "discard", 5: "secure_erase", 9: "write_zeroes",
       10: "zone_open", 11: "zone_close", 12: "zone_finish", 13: "zone_append",
       15: "zone_reset", 17: "zone_reset_all", 34: "drv_in", 35: "drv_out"}
TOOLS = ("clang", "bpftool", "cc")

RECORDS: dict[str, str] = {
    "device": "string", "dev_major": "uint32", "dev_minor": "uint32", "sector": "uint64",
    "bytes": "uint32", "op": "string", "cmd_flags": "uint32", "issue_ns": "uint64",
    "complete_ns": "uint64", "latency_us": "float64", "queue_depth": "uint32",
    "pid": "uint32", "error": "int32",
}


def unavailable() -> str | None:
    """Why the capture cannot run here (None: it can)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"{', '.join(missing)} missing (Debian: apt-get install clang bpftool "
                "libbpf-dev gcc)")
    if not Path("/usr/include/bpf/libbpf.h").exists():
        return "libbpf headers missing (Debian: apt-get install libbpf-dev)"
    if not Path("/sys/kernel/btf/vmlinux").exists():
        return "the kernel has no BTF (/sys/kernel/btf/vmlinux): CO-RE cannot work"
    if os.geteuid() != 0:
        return "capturing block requests needs root (bpf, perf_event_open)"
    return None


def build() -> Path:
    """The loader binary, built once per kernel release and source (cached)."""
    digest = hashlib.sha256()
    for name in ("blkreq.bpf.c", "blkreq.c"):
        digest.update((SOURCES / name).read_bytes())
    digest.update(os.uname().release.encode())
    target = CACHE / digest.hexdigest()[:16]
    binary = target / "blkreq"
    if binary.exists():
        return binary
    work = Path(str(target) + f".{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        def run(argv: list[str], out: Path | None = None) -> None:
            done = subprocess.run(argv, cwd=work, capture_output=True, timeout=120)
            if done.returncode != 0:
                raise SettingError("backend", f"building the BPF capture failed: {argv[0]}: "
                                   f"{done.stderr.decode(errors='replace').strip()[-300:]}")
            if out is not None:
                out.write_bytes(done.stdout)

        run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c"],
            work / "vmlinux.h")
        for name in ("blkreq.bpf.c", "blkreq.c"):
            shutil.copy(SOURCES / name, work / name)
        run(["clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-D__TARGET_ARCH_x86", "-I.",
             "-c", "blkreq.bpf.c", "-o", "blkreq.bpf.o"])
        run(["bpftool", "gen", "skeleton", "blkreq.bpf.o"], work / "blkreq.skel.h")
        run(["cc", "-O2", "-o", "blkreq", "blkreq.c", "-lbpf", "-lelf", "-lz"])
        (work / "vmlinux.h").unlink()
        if not binary.exists():
            os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary


def request_flag_bit(name: str, fallback: int = 19) -> int:
    """The bit of a request flag (`__REQ_RAHEAD`) in this kernel's `cmd_flags`, from its BTF.

    The flags' bits move between releases (`enum req_flag_bits`); bpftool, which the
    capture needs anyway, reads them from /sys/kernel/btf/vmlinux.  `fallback` (6.x's
    value) when the BTF cannot be read.
    """
    if name not in _FLAG_BITS:
        try:
            done = subprocess.run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
                                  capture_output=True, text=True, timeout=60)
            start = done.stdout.index("ENUM 'req_flag_bits'")
            for line in done.stdout[start:].splitlines()[1:]:
                if not line.startswith("\t'"):
                    break
                flag, _, value = line.strip().partition("' val=")
                _FLAG_BITS[flag.lstrip("'")] = int(value)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return _FLAG_BITS.get(name, fallback)


_FLAG_BITS: dict[str, int] = {}


def device_number(name: str) -> int:
    """`loop3` -> the kernel's dev_t as the BPF program packs it (major << 20 | minor)."""
    try:
        major, minor = (int(x) for x in Path(f"/sys/block/{name}/dev").read_text().split(":"))
    except (OSError, ValueError):
        raise SettingError("device", f"{name!r} is not a block device in /sys/block") from None
    return (major << 20) | minor


def _device_names(devs: np.ndarray) -> pa.Array:
    """The kernel's name of each record's device, as one dictionary-encoded column."""
    unique, index = np.unique(devs, return_inverse=True)
    names = []
    for dev in unique.tolist():
        major, minor = dev >> 20, dev & 0xFFFFF
        try:
            uevent = Path(f"/sys/dev/block/{major}:{minor}/uevent").read_text()
            name = next(line[8:] for line in uevent.splitlines()
                        if line.startswith("DEVNAME="))
        except (OSError, StopIteration):
            name = f"{major}:{minor}"
        names.append(name)
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)),
                                          pa.array(names)).cast(pa.string())


class LinuxBio(Subsystem):
    """Per-request block I/O (all devices, or one) as a record dataset."""

    backend = "linux.bio"
    description = "every block request (biosnoop's fields) from a BPF ring buffer"
    records = RECORDS
    private = True  # pids of every user

    def __init__(self, name: str = "linux.bio", tick_seconds: float = 1.0,
                 device: str = "", state_dir: str | None = None) -> None:
        self.name = name
        self.tick_seconds = tick_seconds
        self.objective = Objective("requests", "requests/s", "max")
        self.knobs = {}
        self.features = {"requests": "int64", "bytes": "int64", "latency_us_mean": "float64",
                         "lost": "int64"}
        why = unavailable()
        if why:
            raise SettingError("backend", f"linux.bio cannot capture here: {why}")
        only = device_number(device) if device else 0
        binary = build()
        self._proc = subprocess.Popen([str(binary), str(only)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
        ready = self._proc.stderr.readline().decode(errors="replace").strip()
        if ready != "ready":
            self._stop()
            raise SettingError("backend", f"the BPF capture did not start: {ready[:200]}")
        self._partial = b""
        self._chunks: list[bytes] = []
        self._held = 0
        self._overflow = 0
        self._lock = threading.Lock()
        # the pipe holds 64 KiB, a 100k IOPS device fills it in 30 ms: a thread keeps it
        # empty (whole 1 MiB reads, no Python per record) so the loader never blocks and
        # the kernel's ring never fills while the tick sleeps
        self._reader = threading.Thread(target=self._pump, name=f"{name}-pipe", daemon=True)
        self._reader.start()
        self._dropped = 0
        self.lost_total = 0
        self._last = time.monotonic()

    @property
    def pid(self) -> int:
        """The loader's pid (it is ended by it)."""
        return self._proc.pid

    def exited(self) -> int | None:
        """The loader's exit status once it has ended (None while it runs)."""
        return self._proc.poll()

    def _pump(self) -> None:
        fd = self._proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            if not chunk:
                return
            with self._lock:
                if self._held + len(chunk) > MAX_HELD:  # the tick loop is stuck: count
                    self._overflow += len(chunk) // RECORD.itemsize
                    continue
                self._chunks.append(chunk)
                self._held += len(chunk)

    def _drain(self) -> tuple[bytes, int]:
        with self._lock:
            chunks, self._chunks, self._held = self._chunks, [], 0
            overflow, self._overflow = self._overflow, 0
        data = self._partial + b"".join(chunks)
        whole = len(data) - len(data) % RECORD.itemsize
        self._partial = data[whole:]
        return data[:whole], overflow

    def step(self, knobs: dict) -> Sample:
        data, overflow = self._drain()
        raw = np.frombuffer(data, dtype=RECORD)
        markers = raw["issue_ns"] == MARKER
        lost = overflow
        if markers.any():
            total = int(raw["sector"][markers].max())
            lost += max(0, total - self._dropped)
            self._dropped = max(total, self._dropped)
            raw = raw[~markers]
        self.lost_total += lost
        n = len(raw)
        # issue_ns 0: the issue was not seen (before the capture, or refused): latency unknown
        seen = raw["issue_ns"] != 0
        latency = np.where(seen, (raw["complete_ns"] - raw["issue_ns"]).astype(np.float64)
                           / 1000.0, np.nan)
        table = pa.table({
            "device": _device_names(raw["dev"]) if n else pa.array([], pa.string()),
            "dev_major": raw["dev"] >> 20, "dev_minor": raw["dev"] & 0xFFFFF,
            "sector": raw["sector"], "bytes": raw["bytes"],
            "op": _ops(raw["cmd_flags"]), "cmd_flags": raw["cmd_flags"],
            "issue_ns": raw["issue_ns"], "complete_ns": raw["complete_ns"],
            "latency_us": latency, "queue_depth": raw["queue_depth"], "pid": raw["pid"],
            "error": raw["error"],
        })
        features = {"requests": n, "bytes": int(raw["bytes"].sum()),
                    "latency_us_mean": float(np.nanmean(latency)) if seen.any() else math.nan,
                    "lost": lost}
        now = time.monotonic()
        objective = n / max(1e-9, now - self._last)
        self._last = now
        extra = {EXTRA_RECORDS_LOST: lost} if lost else {}
        return Sample(features=features, objective=objective, extra=extra,
                      records=table if n else None)

    def _stop(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self._stop()


def _ops(flags: np.ndarray) -> pa.Array:
    codes = (flags & 0xFF).astype(np.int32)
    unique, index = np.unique(codes, return_inverse=True)
    names = [OPS.get(int(c), f"op{int(c)}") for c in unique]
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)),
                                          pa.array(names, pa.string())).cast(pa.string())


#: `[[subsystem]] backend = "linux.bio"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "tick_seconds": tick_seconds(),
    "device": text(32),
}

DESCRIPTION = ("every block request (device, sector, bytes, op, latency, queue depth, pid) "
               "captured by a BPF program into a ring buffer (root's)")
defaults_from(SETTINGS, LinuxBio.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked constructor arguments and the one subsystem name; SettingError."""
    kwargs = check_settings(settings, SETTINGS)
    if kwargs.get("device"):
        device_number(kwargs["device"])
    return kwargs, [kwargs.get("name", "linux.bio")]


def factory(settings: dict) -> list[LinuxBio]:
    """`[[subsystem]] backend = "linux.bio"`: one subsystem."""
    kwargs, _ = check(settings)
    kwargs.pop("state_dir", None)
    return [LinuxBio(**kwargs)]
