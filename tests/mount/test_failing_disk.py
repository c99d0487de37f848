"""The project's failing disk makes the kernel log genuine block I/O errors, on schedule."""

import mmap
import os
import time

import pytest

from tests.failing_disk import FailingLoop


def _kmsg_tail():
    """Every record /dev/kmsg holds now (non-blocking; each open starts at the oldest)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                records.append(os.read(fd, 8192).decode(errors="replace"))
            except BlockingIOError:
                return records
            except BrokenPipeError:  # overrun while reading: skip on
                continue
    finally:
        os.close(fd)


@pytest.fixture
def failing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("loop devices and /dev/kmsg need root")
    disk = FailingLoop(tmp_path, seed=3, healthy=1.0, degrading=2.0, size_mb=16).start()
    try:
        yield disk
    finally:
        disk.stop()


def test_requests_succeed_while_healthy_and_fail_with_kernel_io_errors_after(failing):
    fd = os.open(failing.device, os.O_RDWR | os.O_DIRECT)
    block = mmap.mmap(-1, 4096)  # O_DIRECT wants an aligned buffer
    block.write(b"x" * 4096)
    try:
        os.pwrite(fd, block, 0)  # healthy at the start: no error
        schedule = failing.schedule()
        failures = 0
        deadline = time.monotonic() + schedule["failure_s"] + 10
        while failures < 3 and time.monotonic() < deadline:
            try:
                os.preadv(fd, [block], 4096 * (failures % 64))
            except OSError:
                failures += 1
            time.sleep(0.01)
        assert failures >= 3, "the disk never failed"
    finally:
        os.close(fd)
    wanted = f"I/O error, dev {failing.name}, sector"
    assert any(wanted in record for record in _kmsg_tail()), "no kernel record of the errors"
