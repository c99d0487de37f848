"""What the tests share: a real mlfs daemon (`Mount`), configurations, and helpers.

Plain functions and classes, imported by test modules and by the experiment
harnesses in tests/bench/ (`from tests.harness import Mount, wait_for`).  The
pytest fixtures built on them live in conftest files: the mount fixtures in
tests/mount/conftest.py, the loop device in tests/conftest.py.  Every daemon a
helper starts is ended by its PID, and every mount is unmounted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

FAST_CONFIG = """
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0
feedback_seal_seconds = 1.0
journal_seal_seconds = 1.0

[modes]
silence_seconds = 600.0

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 1
tick_seconds = 0.02
"""


def fuse_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mount tests need root (allow_other, default_permissions, setpriv)"
    if not os.path.exists("/dev/fuse"):
        return "mount tests need /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "mount tests need fusermount3 (Debian package fuse3)"
    return None


def mlfs_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlfs", *args]


class Mount:
    """One running daemon: its mountpoint, state dir and pid."""

    def __init__(self, root: Path, config: str = FAST_CONFIG, name: str = "mnt") -> None:
        self.root = root
        self.mountpoint = root / name
        self.state_dir = root / (name + "-state")
        self.config_path = root / (name + ".toml")
        self.mountpoint.mkdir(exist_ok=True)
        self.config_path.write_text(config)
        self.pid: int | None = None

    @property
    def sub(self) -> Path:
        return self.mountpoint / "sim.readahead"

    def start(self) -> Mount:
        done = subprocess.run(
            mlfs_command("mount", str(self.mountpoint), "--config", str(self.config_path),
                         "--state-dir", str(self.state_dir)),
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        self.pid = int((self.state_dir / "mlfs.pid").read_text())
        return self

    def alive(self) -> bool:
        """The daemon still runs (and the pid was not reused: its cmdline names us)."""
        if self.pid is None:
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        if str(self.mountpoint).encode() not in cmdline:
            return False
        return not stat.split(") ")[1].startswith("Z")

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """End the daemon by its pid and wait until it is gone."""
        if self.pid is None:
            return
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)  # still ours: alive() checked the cmdline
        self.pid = None
        self._clear_mount()

    def umount(self) -> subprocess.CompletedProcess:
        done = subprocess.run(mlfs_command("umount", str(self.mountpoint)),
                              capture_output=True, text=True, timeout=90, cwd=REPO)
        self.kill(signal.SIGTERM)
        return done

    def _clear_mount(self) -> None:
        for _ in range(50):
            if not os.path.ismount(self.mountpoint) and _stat_ok(self.mountpoint):
                return
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                           capture_output=True)
            time.sleep(0.05)


def _stat_ok(path: Path) -> bool:
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = ""):
    """Poll until `predicate()` is truthy; fail the test with `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


def sh(script: str, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
    """Run a bash script the way a user would."""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def unmount_everything_under(root: Path) -> None:
    """Lazily unmount every mount below `root`, stale ones included.

    Taken from /proc/self/mountinfo, not os.path.ismount: a mount whose daemon
    was killed together with its auto_unmount helper answers ENOTCONN, which
    ismount reports as "not a mount", and it would outlive the test.
    """
    prefix = str(root) + "/"
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4].encode().decode("unicode_escape") for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
        subprocess.run(["umount", "-l", point], capture_output=True)  # a tmpfs a test made


#: like FAST_CONFIG, but nothing is sealed unless asked (prepare_dataset) and no
#: event is sent unless a test causes one: a quiet stream for blocking readers
QUIET_CONFIG = FAST_CONFIG.replace("seal_seconds = 1.0", "seal_seconds = 3600.0").replace(
    "feedback_seal_seconds = 1.0", "feedback_seal_seconds = 3600.0").replace(
    "journal_seal_seconds = 1.0", "journal_seal_seconds = 3600.0")


def two_subsystems(config: str = FAST_CONFIG) -> str:
    """`config` serving two simulated subsystems, `sim.a` and `sim.b` (seeds 1 and 2)."""
    return config.replace('name = "sim.readahead"', 'name = "sim.a"') + """
[[subsystem]]
backend = "sim.readahead"
name = "sim.b"
seed = 2
tick_seconds = 0.02
"""


def write_errno(path: Path | str, data: bytes) -> int:
    """One open + one write(2) + close, as a trainer does; 0 or the write's errno."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
        return 0
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)


def new_model(sub: Path, name: str, start: bool = True) -> Path:
    """mkdir models/<name> (and `echo start > control`); returns its directory."""
    model = sub / "models" / name
    model.mkdir()
    if start:
        assert write_errno(model / "control", b"start\n") == 0
    return model


def read_rows(directory: Path) -> list[dict]:
    """Every row of every portion in `directory` (a Parquet dataset), in portion order."""
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for portion in sorted(directory.glob("*.parquet")):
        rows += pq.read_table(portion).to_pylist()
    return rows


class Models:
    """Models a test makes on a shared mount; all removed (rmdir) at teardown."""

    def __init__(self, sub: Path) -> None:
        self.sub = sub
        self.made: list[Path] = []

    def __call__(self, name: str, start: bool = True) -> Path:
        path = new_model(self.sub, name, start)
        self.made.append(path)
        return path

    def cleanup(self) -> None:
        for path in self.made:
            try:
                os.rmdir(path)
            except OSError:
                pass


class EventStream:
    """An open `events` file read without blocking the test (O_NONBLOCK + poll)."""

    def __init__(self, path: Path | str) -> None:
        import select

        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self._buffer = b""
        self.seen: list[dict] = []
        self._unread: list[dict] = []

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _read_some(self, timeout: float) -> None:
        import json

        if not self._poll.poll(max(0, int(timeout * 1000))):
            return
        try:
            self._buffer += os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        *whole, self._buffer = self._buffer.split(b"\n")
        events = [json.loads(line) for line in whole]
        self.seen += events
        self._unread += events

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "") -> dict:
        """The next event for which predicate(event) is true (earlier ones are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            while self._unread:
                event = self._unread.pop(0)
                if predicate(event):
                    return event
            if time.monotonic() > deadline:
                pytest.fail(f"no event {what or predicate} within {timeout:g} s; "
                            f"last seen: {self.seen[-3:]}")
            self._read_some(max(0.0, min(0.2, deadline - time.monotonic())))




# ---- a linux.block subsystem on a loop device (the safety tests) ----------------------
BLOCK_CONFIG = """
[store]
seal_seconds = 1.0

[modes]
silence_seconds = 600.0

[[subsystem]]
backend = "linux.block"
devices = ["{device}"]
tick_seconds = 0.1
measure_seconds = 0.05
{apply}
"""

APPLY = "apply = {read_ahead_kb = [16, 4096]}"


def read_ahead(device: str) -> str:
    return Path(f"/sys/block/{device}/queue/read_ahead_kb").read_text().strip()


def ledger(m: Mount) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((m.state_dir / "ledger").glob("*.json"))]


def recommend(m: Mount, device: str, value: int) -> Path:
    """A started model pinned in recommendation mode that recommends `value`."""
    sub = m.mountpoint / f"linux.block.{device}"
    info = json.loads((sub / "info").read_text())
    assert info["knobs"]["read_ahead_kb"]["min"] == 16
    assert info["knobs"]["read_ahead_kb"]["max"] == 4096
    model = sub / "models" / "m"
    done = sh(f"mkdir {model} && echo start > {model}/control && "
              f"echo recommendation > {model}/mode && "
              f"echo read_ahead_kb={value} > {model}/recommend")
    assert done.returncode == 0, done.stderr
    return model


# ---- a small file system to fill (the storage-fault tests) -------------------------------
@contextlib.contextmanager
def tmpfs(directory: Path, size: str):
    """A tmpfs of `size` at `directory`; unmounted after (the mlfs mount goes first)."""
    directory.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill(directory: Path) -> Path:
    """Write a file until the file system is full (ENOSPC)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as fh:
        block = b"\0" * 65536
        try:
            while True:
                fh.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:  # the last pages, byte by byte-ish
                fh.write(b"\0" * 512)
        except OSError:
            pass
    return filler
