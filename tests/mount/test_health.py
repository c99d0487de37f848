"""linux.health on a real mount, over a disk that fails the way drives do.

The project's failing disk (tests/failing_disk.py) under a loop device: the kernel
completes requests with errors and logs them; linux.health records the device's
latency and errors every tick, marks the burst that ends the disk (`failure`) and the
default rule ("alert after the first error"), and a predictor model raises the rule's
alert in learning mode.
"""

from __future__ import annotations

import mmap
import os
import threading

import pyarrow.dataset as ds
import pytest

from tests.failing_disk import FailingLoop
from tests.harness import Mount, sh, wait_for, write_errno

CONFIG = """
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0

[[subsystem]]
backend = "linux.health"
devices = ["{device}"]
tick_seconds = 0.2
burst_errors = 5
horizon_ticks = 20
"""


def _reads(device: str, stop: threading.Event) -> None:
    """A reader that keeps the disk busy (O_DIRECT: every read reaches the disk)."""
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    block = mmap.mmap(-1, 4096)
    try:
        offset = 0
        while not stop.is_set():
            try:
                os.preadv(fd, [block], 4096 * (offset % 2048))
            except OSError:
                pass  # the failing disk's errors: what the test is about
            offset += 1
    finally:
        os.close(fd)


@pytest.fixture
def failing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("loop devices, /dev/kmsg and the block layer's capture need root")
    disk = FailingLoop(tmp_path / "disk", seed=5, healthy=1.5, degrading=3.0,
                       size_mb=16).start()
    try:
        yield disk
    finally:
        disk.stop()


def test_a_failing_disk_shows_rising_errors_the_burst_and_the_rules_alert(failing,
                                                                          mount_root):
    mount = Mount(mount_root, CONFIG.format(device=failing.name))
    mount.start()
    stop = threading.Event()
    reader = threading.Thread(target=_reads, args=(failing.device, stop), daemon=True)
    try:
        sub = mount.mountpoint / "linux.health"
        model = sub / "models" / "p"
        assert sh(f"mkdir {model} && echo start > {model}/control").returncode == 0
        reader.start()
        schedule = failing.schedule()
        # learning: the rule's alerts are raised (the model is shadowed)
        wait_for(lambda: (model / "alerts").read_text().strip() != "",
                 timeout=schedule["failure_s"] + 20, what="the rule's alert")
        alerts = (model / "alerts").read_text()
        wait_for(lambda: any(r["failure"] for r in _rows(sub)),
                 timeout=schedule["failure_s"] + 20, what="the burst that ends the disk")
        rows = _rows(sub)
    finally:
        stop.set()
        reader.join(timeout=10)
        mount.kill()
    ours = [r for r in rows if r["device"] == failing.name]
    assert ours, "no record of the watched device"
    first_error = next(i for i, r in enumerate(ours) if r["first_error"])
    first_burst = next(i for i, r in enumerate(ours) if r["failure"])
    assert first_error <= first_burst, "the rule's first error comes no later than the burst"
    assert ours[-1]["errors_total"] >= 5
    assert sum(r["errors_logged"] for r in ours) > 0, "the kernel's log named the device"
    counted = [r["errors"] for r in ours if r["errors"] is not None]
    if counted:  # the block layer's capture ran: it sees at least what the log says
        assert sum(counted) >= sum(r["errors_logged"] for r in ours)
    assert sum(r["reads"] for r in ours) > 0
    assert all(r["dev"] == ours[0]["dev"] for r in ours)
    assert "rule" in alerts and str(ours[0]["dev"]) in alerts, alerts


def _rows(sub) -> list[dict]:
    assert write_errno(sub / "control", b"prepare_dataset\n") == 0
    return ds.dataset(str(sub / "records"), format="parquet").to_table().to_pylist()
