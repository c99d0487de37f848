"""Shared fixtures: a real mlfs mount in a temporary directory.

Mount tests need root and /dev/fuse (FUSE mounts with allow_other); where they
are missing the tests skip and say why.  Every daemon a test starts is ended
by its PID, and every mount is unmounted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave without C++ static teardown once pytest has said everything.

    pyarrow 26 sometimes aborts a process at exit ("terminate called without
    an active exception", its I/O thread pool after pre-buffered Parquet
    reads); the suite's result is final by now, so end with pytest's status
    instead of a library's SIGABRT (see mlfs.cli.entry for the same reason).
    """
    import logging

    status = getattr(config, "_mlfs_exitstatus", None)
    if status is None:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))


def pytest_sessionfinish(session, exitstatus):
    session.config._mlfs_exitstatus = exitstatus

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


@pytest.fixture
def mount_root():
    """A 0755 directory under /tmp (so `nobody` can traverse it), removed after."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mlfs-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    yield root
    unmount_everything_under(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mount(mount_root):
    """A fresh mount of the fast simulated subsystem, torn down by pid."""
    m = Mount(mount_root)
    m.start()
    try:
        yield m
    finally:
        m.kill(signal.SIGTERM)


# ---- shared helpers and module-scoped mounts (added for the behaviour suites) ----

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


def _module_mount(config: str):
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mlfs-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    m = Mount(root, config)
    m.start()
    try:
        yield m
    finally:
        if not m.alive():  # it died under the module's tests: say how
            log = m.state_dir / "mlfs.log"
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
            warnings.warn(f"daemon {m.pid} of {m.mountpoint} died under the module's tests; "
                          f"log tail:\n{tail}", stacklevel=1)
            m.pid = None
        m.kill(signal.SIGTERM)
        unmount_everything_under(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_mount():
    """One FAST_CONFIG mount for a module whose tests each use their own model names."""
    yield from _module_mount(FAST_CONFIG)


@pytest.fixture(scope="module")
def quiet_mount():
    """One QUIET_CONFIG mount (sealing only on prepare_dataset) for a module."""
    yield from _module_mount(QUIET_CONFIG)


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


@pytest.fixture
def shared_models(shared_mount):
    made = Models(shared_mount.sub)
    yield made
    made.cleanup()


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


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[str]:
    """A fresh 64 MiB loop device (its name, e.g. "loop3"), detached afterwards."""
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if shutil.which("losetup") is None:
        pytest.skip("losetup (util-linux) is missing")
    image = tmp_path / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(64 << 20)
    done = subprocess.run(["losetup", "--find", "--show", str(image)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"losetup failed: {done.stderr.strip()}")
    device = done.stdout.strip()
    try:
        yield Path(device).name
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True)
