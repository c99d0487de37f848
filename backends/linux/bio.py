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

Completions the kernel runs no program for.  On this machine's 6.18 kernel about one
fio run of 200,000 requests in three completes 1, 32 or 64 requests without the
block_rq_complete program running at all: its own run count (`kernel.bpf_stats_enabled`)
falls short of rq_issue's and of the device's completed reads by exactly the records
missing, with no recursion miss, and the ring was never full
(bench-results/bio-capture-runs/run_cnt.py); bpftrace's count of the classic
block:block_rq_complete tracepoint falls short by the same number in the same runs
(tracepoint_count.py), and so does a program on block_io_done, the tracepoint beside
the line that counts the completion in /sys/block/<dev>/stat.  kprobes are not built
into this kernel and it refuses fentry programs (EPERM), so no other hook sees them.
What every request does have is an issue: the block layer hands a `struct request` out
again only once it has completed (a requeue, block_rq_requeue, forgets it first), so
an issue finding its struct still in `started`, unrecorded, records that earlier
request then: device, sector, bytes, operation, pid, issue time and queue depth, with
`complete_ns`, `latency_us` and `error` null (`records_table`).  The block layer's own
count stays the check: `CompletionLedger` (backends/linux/completions.py) compares
each watched disk's completed reads, writes and discards (/sys/block/<dev>/stat) with
the records of those operations, and what stays unrecorded for more than
`LEDGER_SLACK_SECONDS` is counted lost, beside the ring's losses: records + records_lost
= the requests the device completed (a request recorded later than that, when its struct
is reused only after the device went idle, leaves the count an upper bound).
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mlfs.abi import (
    EXTRA_RECORDS_LOST,
    Backend,
    ConformanceEnv,
    ExampleUnavailable,
    Objective,
    Sample,
    Schema,
    SettingError,
    Subsystem,
    check_settings,
    defaults_from,
    open_dir,
    open_regular,
    read_bounded,
    text,
    tick_seconds,
)

from .completions import BlockCompletions, CompletionLedger

ROOT_ONLY = True
SOURCES = Path(__file__).resolve().parent / "bpf"
CACHE = Path(os.environ.get("MLFS_BPF_CACHE", "/var/cache/mlfs/bpf"))
#: the loader's record: struct record of blkreq.bpf.c
RECORD = np.dtype([("issue_ns", "<u8"), ("complete_ns", "<u8"), ("sector", "<u8"),
                   ("dev", "<u4"), ("bytes", "<u4"), ("pid", "<u4"), ("cmd_flags", "<u4"),
                   ("queue_depth", "<u4"), ("error", "<i4")])
assert RECORD.itemsize == 48
MARKER = np.uint64(0xFFFFFFFFFFFFFFFF)
#: `error` of a request whose completion no program saw (ERROR_UNKNOWN of blkreq.bpf.c):
#: null in the dataset, as its `complete_ns` (0 in the record) is
ERROR_UNKNOWN = np.int32(-(2 ** 31))
#: bytes held between ticks at most (about 5.6 M requests); beyond, records are counted lost
MAX_HELD = 256 << 20
#: REQ_OP_* (include/linux/blk_types.h): the low 8 bits of cmd_flags
OPS = {0: "read", 1: "write", 2: "flush", 3: "discard", 5: "secure_erase", 9: "write_zeroes",
       10: "zone_open", 11: "zone_close", 12: "zone_finish", 13: "zone_append",
       15: "zone_reset", 17: "zone_reset_all", 34: "drv_in", 35: "drv_out"}
TOOLS = ("clang", "bpftool", "cc")
#: the operations /sys/block/<dev>/stat counts as completed requests (`STAT_COMPLETED`)
COUNTED_OPS = np.array([0, 1, 3], dtype=np.uint32)  # read, write, discard

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


#: the loader's sha256, written beside it when it is built and checked before each start
LOADER_HASH = "blkreq.sha256"
#: part of every cache entry's key: entries an older mlfs built have no LOADER_HASH, so
#: they are never looked at (a new entry is built beside them), rather than refused
CACHE_LAYOUT = b"mlfs-bpf-cache-2\n"


def _cache_dir() -> Path:
    """CACHE, its missing directories made 0755 whatever the umask (red-team B2: under
    umask 0 they were 0777, and anyone could replace the loader root then ran)."""
    cache = Path(os.path.realpath(CACHE))
    existing = cache
    while not existing.exists():
        existing = existing.parent
    os.close(open_dir(existing, cache.relative_to(existing).parts, create=True, mode=0o755))
    return cache


def untrusted(path: Path) -> str | None:
    """Why root must not run the file at `path` (None: it may): it and every directory
    above it owned by root (or this user), not writable by group or others (a sticky
    directory above the cache, as /tmp, excepted), no link, and the bytes hashing to
    the LOADER_HASH recorded beside it at build time."""
    owners = {0, os.geteuid()}
    cache = Path(os.path.realpath(CACHE))
    for where in [path, *path.parents]:
        info = os.lstat(where)
        if stat.S_ISLNK(info.st_mode):
            return f"{where} is a symbolic link"
        if info.st_uid not in owners:
            return f"{where} is owned by uid {info.st_uid}"
        sticky_above = info.st_mode & stat.S_ISVTX and not where.is_relative_to(cache)
        if info.st_mode & 0o022 and not sticky_above:
            return f"{where} is writable by group or others ({oct(info.st_mode & 0o777)})"
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return f"{path} is not a regular file"
    try:
        recorded = read_bounded(path.parent / LOADER_HASH, 128).decode().strip()
    except (OSError, ValueError) as exc:
        return f"{path.parent / LOADER_HASH}: {exc}"
    with open_regular(path) as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    if digest != recorded:
        return f"{path}: sha256 {digest[:16]}... is not the {recorded[:16]}... recorded"
    return None


def _checked(binary: Path) -> Path:
    why = untrusted(binary)
    if why:
        raise SettingError("backend", f"the cached BPF loader is not root's own: {why}; "
                           f"refused (remove {binary.parent} to rebuild it)")
    return binary


def build() -> Path:
    """The loader binary, built once per kernel release and source (cached), checked
    (`untrusted`) before it is returned to be run as root."""
    digest = hashlib.sha256(CACHE_LAYOUT)
    for name in ("blkreq.bpf.c", "blkreq.c"):
        digest.update((SOURCES / name).read_bytes())
    digest.update(os.uname().release.encode())
    cache = _cache_dir()
    target = cache / digest.hexdigest()[:16]
    binary = target / "blkreq"
    if os.path.lexists(binary):
        return _checked(binary)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=cache))
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
        for entry in work.iterdir():
            entry.chmod(0o755 if entry.name == "blkreq" else 0o644)
        with open_regular(work / "blkreq") as fh:
            (work / LOADER_HASH).write_text(hashlib.file_digest(fh, "sha256").hexdigest())
        (work / LOADER_HASH).chmod(0o644)
        work.chmod(0o755)
        if not os.path.lexists(binary):
            os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _checked(binary)


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
        # the block layer's count, from just after the loader attached: what completes
        # from now on is recorded, or counted lost (`CompletionLedger`)
        self._completions = BlockCompletions([device] if device else None)
        self._ledger = CompletionLedger(self._completions.total(), now=self._last)

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
        counted = int(np.isin(raw["cmd_flags"] & 0xFF, COUNTED_OPS).sum())
        lost += self._ledger.observe(time.monotonic(), self._completions.total(),
                                     counted, lost)
        self.lost_total += lost
        n = len(raw)
        table = records_table(raw)
        latency = table.column("latency_us")
        mean = pc.mean(latency).as_py() if n else None
        features = {"requests": n, "bytes": int(raw["bytes"].sum()),
                    "latency_us_mean": math.nan if mean is None else mean,
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


def records_table(raw: np.ndarray) -> pa.Table:
    """The loader's records (`RECORD`, markers taken out) as the dataset's columns.

    What the capture did not see is null, not a number: `issue_ns` 0 is an issue not
    seen (before the capture, or its map update refused; kept as 0), `complete_ns` 0 and
    `error` `ERROR_UNKNOWN` a completion the kernel ran no program for, and `latency_us`
    is null when either end is unknown."""
    seen = (raw["issue_ns"] != 0) & (raw["complete_ns"] != 0)
    latency = (raw["complete_ns"] - raw["issue_ns"]).astype(np.float64) / 1000.0
    return pa.table({
        "device": _device_names(raw["dev"]) if len(raw) else pa.array([], pa.string()),
        "dev_major": raw["dev"] >> 20, "dev_minor": raw["dev"] & 0xFFFFF,
        "sector": raw["sector"], "bytes": raw["bytes"],
        "op": _ops(raw["cmd_flags"]), "cmd_flags": raw["cmd_flags"],
        "issue_ns": raw["issue_ns"],
        "complete_ns": pa.array(raw["complete_ns"], mask=raw["complete_ns"] == 0),
        "latency_us": pa.array(latency, mask=~seen), "queue_depth": raw["queue_depth"],
        "pid": raw["pid"],
        "error": pa.array(raw["error"], mask=raw["error"] == ERROR_UNKNOWN),
    })


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


def _example(env: ConformanceEnv) -> dict:
    """The conformance suite's instance: the suite's loop device, captured by BPF."""
    why = unavailable() or (None if env.device else "no block device to capture")
    if why:
        raise ExampleUnavailable(why)
    return {"tick_seconds": 0.1, "device": env.device}


BACKEND = Backend(name="linux.bio", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, root_only=ROOT_ONLY, kinds=("predictor",),
                  example=_example)
