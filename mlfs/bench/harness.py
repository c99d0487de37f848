"""Running the bench: progress lines, the mounts it starts (ended by pid), the session
that removes everything, and the small I/O helpers the benchmarks share."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..client import MountProcess, write_line
from .plan import MODEL, RA_VALUES, STEER, SUBSYSTEMS

_T0 = time.monotonic()


def progress(message: str) -> None:
    """One line per step on stderr, so a long run is visibly alive."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def fuse_unavailable() -> str | None:
    """Why a mount cannot be started here (None when it can), as tests/conftest.py."""
    if os.geteuid() != 0:
        return "mlfs bench mounts with allow_other and needs root"
    if not os.path.exists("/dev/fuse"):
        return "mlfs bench needs /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "mlfs bench needs fusermount3 (Debian package fuse3)"
    return None


def read_whole(path: Path, buf: bytearray) -> tuple[int, float]:
    """Bytes and seconds to read `path` with 1 MiB read(2)s into one buffer (dd bs=1M)."""
    total = 0
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            total += n
    return total, time.perf_counter() - started


def echo(path: str, data: bytes) -> None:
    """What `echo x > path` does: open(O_WRONLY|O_CREAT|O_TRUNC), one write, close."""
    write_line(path, data, create=True)


def recommendation(rng: random.Random) -> bytes:
    return f"read_ahead_kb={rng.choice(RA_VALUES)}\n".encode()


def tmpfs_dir() -> Path | None:
    """/dev/shm when it is a writable tmpfs (the tmpfs references), else None."""
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "tmpfs" and parts[1] == "/dev/shm":
                    if os.access(parts[1], os.W_OK):
                        return Path(parts[1])
    except OSError:
        pass
    return None


# ---- mounts ----------------------------------------------------------------------------
def mount_config(seal_seconds: float) -> str:
    """Three sim.readahead subsystems at one tick per second (the footprint case)."""
    text = f"""
[mount]
allow_other = true
max_tasks = 512

[store]
seal_seconds = {float(seal_seconds)!r}
retention_bytes = {1 << 40}
retention_count = 100000

[modes]
silence_seconds = 3600.0
"""
    for seed, name in enumerate(SUBSYSTEMS):
        text += f"""
[[subsystem]]
backend = "sim.readahead"
name = "{name}"
seed = {seed}
tick_seconds = 1.0
"""
    return text


class BenchMount(MountProcess):
    """One daemon started with `mlfs mount` (as a user would) and ended by its pid;
    its CPU and memory from /proc, and the mount's bdi read-ahead."""

    def __init__(self, root: Path, name: str, config: str, state_dir: Path) -> None:
        (root / name).mkdir(exist_ok=True)
        (root / f"{name}.toml").write_text(config)
        super().__init__(root / name, state_dir, root / f"{name}.toml")
        self.read_ahead_kb: int | None = None

    def start(self) -> BenchMount:
        super().start()
        dev = os.stat(self.mountpoint).st_dev
        with contextlib.suppress(OSError, ValueError):
            bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
            self.read_ahead_kb = int(bdi.read_text())
        return self

    def cpu_seconds(self) -> float:
        """utime + stime of the daemon, dead threads included (/proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_kb(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(value.split()[0])
        return out


class Session:
    """The temporary root and every mount in it, so cleanup cannot miss one."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mlfs-bench-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.mounts: list[BenchMount] = []
        self.scratch_dirs: list[Path] = []

    def scratch(self, parent: Path | None) -> Path:
        """A temporary directory under `parent` (e.g. tmpfs), removed with the session."""
        if parent is None:
            path = Path(tempfile.mkdtemp(prefix="scratch-", dir=self.root))
        else:
            path = Path(tempfile.mkdtemp(prefix="mlfs-bench-", dir=parent))
        self.scratch_dirs.append(path)
        return path

    def mount(self, name: str, config: str, state_dir: Path) -> BenchMount:
        m = BenchMount(self.root, name, config, state_dir)
        self.mounts.append(m)
        return m.start()

    def close(self) -> None:
        for m in self.mounts:
            try:
                m.stop()
            except Exception as exc:  # cleanup goes on for the others
                progress(f"cleanup: {m.mountpoint}: {exc}")
        for path in self.scratch_dirs:
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)


def setup_model(mountpoint: Path) -> Path:
    """mkdir models/bench && echo start > control: a model that accepts recommendations."""
    model = mountpoint / STEER / "models" / MODEL
    if not model.exists():
        os.mkdir(model)
    echo(str(model / "control"), b"start\n")
    return model
