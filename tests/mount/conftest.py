"""The mount fixtures: real mlfs daemons on real FUSE mounts, torn down by PID.

Every test under tests/mount is marked `mount` here (deselect them with
`-m "not mount"`).  Mount tests need root and /dev/fuse (FUSE mounts with
allow_other); where they are missing the tests skip and say why.
"""

from __future__ import annotations

import shutil
import signal
import warnings
from pathlib import Path

import pytest

from tests.harness import (
    FAST_CONFIG,
    QUIET_CONFIG,
    Models,
    Mount,
    new_mount_root,
    unmount_everything_under,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/mount `mount` (this hook sees the whole session)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.mount)


@pytest.fixture
def mount_root():
    """A 0755 directory under /tmp (so `nobody` can traverse it), removed after."""
    root = new_mount_root()
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


def _module_mount(config: str):
    root = new_mount_root()
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


@pytest.fixture
def shared_models(shared_mount):
    """Make models on the module's shared mount; each removed after the test."""
    made = Models(shared_mount.sub)
    yield made
    made.cleanup()
