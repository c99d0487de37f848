"""Session-wide pytest set-up, and the loop-device fixture (core and mount tests use it).

The mount fixtures are in tests/mount/conftest.py, the helpers every test
shares in tests/harness.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

#: fixtures shared by modules of both tiers: `s3_endpoint`, a moto S3 server per module
pytest_plugins = ["tests.moto_s3"]

# Transitional: branches written before tests/harness.py existed import these
# from here; new code imports tests.harness.  Drop once every branch is merged.


#: Test modules that share something of the machine's with each other: the kernel's
#: settings and log (sysctls, /sys/block, /dev/kmsg, loop devices, BPF), systemd,
#: podman, or a timing a busy CPU disturbs.  With pytest-xdist (README's test
#: command runs two workers) they form one group, run one after another on one
#: worker, while the other modules run beside them, each module whole on one
#: worker (its module-scoped mount is made once, and its tests keep their order).
SERIAL_MODULES = frozenset({
    "test_actions", "test_attributes", "test_backend_conformance", "test_bench_smoke",
    "test_bio", "test_blktrace",
    "test_containers", "test_declared", "test_fair_service", "test_failing_disk",
    "test_health", "test_kmsg", "test_learning_loop", "test_linux_backends",
    "test_linux_safety", "test_linux_sysfs", "test_loading", "test_operators",
    "test_plugins", "test_state_dir",
})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        group = "machine" if module in SERIAL_MODULES else f"{item.path.parent.name}.{module}"
        item.add_marker(pytest.mark.xdist_group(group))


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
    if status is None or hasattr(config, "workerinput"):  # an xdist worker ends as xdist says
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))


def pytest_sessionfinish(session, exitstatus):
    session.config._mlfs_exitstatus = exitstatus


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
