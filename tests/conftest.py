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
        if self.pid is None:
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return not stat.split(") ")[1].startswith("Z")

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """End the daemon by its pid and wait until it is gone."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
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


@pytest.fixture
def mount_root():
    """A 0755 directory under /tmp (so `nobody` can traverse it), removed after."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mlfs-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    yield root
    for child in root.iterdir():
        if os.path.ismount(child):
            subprocess.run(["fusermount3", "-u", "-z", str(child)], capture_output=True)
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
