"""A declared subsystem (linux.sysfs) through a real mount: applied, then put back.

The knob is a loop device's queue/read_ahead_kb made for the test, declared
in the configuration (no backend code); a model's recommendation reaches the
device and `mlfs umount` restores the original.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.harness import Mount, ledger, read_ahead, sh, wait_for

DECLARED_CONFIG = """
[store]
seal_seconds = 1.0

[modes]
silence_seconds = 600.0

[[subsystem]]
backend = "linux.sysfs"
name = "ra.{device}"
description = "read-ahead of {device}, declared"
tick_seconds = 0.1
measure_seconds = 0.05
objective = "read_kb_per_s"

[subsystem.knobs.read_ahead_kb]
path = "/sys/block/{device}/queue/read_ahead_kb"
range = [0, 65536]
apply = [16, 4096]
unit = "KiB"

[subsystem.features.read_kb_per_s]
path = "/sys/block/{device}/stat"
field = 2
kind = "rate"
scale = 0.5
"""


def test_a_declared_knob_is_applied_and_umount_restores_the_original(mount_root: Path,
                                                                     loop: str) -> None:
    original = read_ahead(loop)
    m = Mount(mount_root, DECLARED_CONFIG.format(device=loop))
    m.start()
    try:
        sub = m.mountpoint / f"ra.{loop}"
        info = json.loads((sub / "info").read_text())
        assert info["backend"] == "linux.sysfs"
        assert info["knobs"]["read_ahead_kb"] == {"type": "int", "default": int(original),
                                                  "min": 16, "max": 4096, "unit": "KiB"}
        assert "read_kb_per_s" in info["features"]
        model = sub / "models" / "m"
        done = sh(f"mkdir {model} && echo start > {model}/control && "
                  f"echo recommendation > {model}/mode && "
                  f"echo read_ahead_kb=2048 > {model}/recommend")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: read_ahead(loop) == "2048", what="the recommendation applied")
        assert [e["original"] for e in ledger(m)] == [original]
        done = m.umount()
        assert done.returncode == 0, done.stdout + done.stderr
        assert read_ahead(loop) == original
        assert ledger(m) == []
    finally:
        m.kill(signal.SIGTERM)


def test_after_sigkill_the_next_mount_restores_the_declared_knob(mount_root: Path,
                                                                 loop: str) -> None:
    original = read_ahead(loop)
    m = Mount(mount_root, DECLARED_CONFIG.format(device=loop))
    m.start()
    try:
        model = m.mountpoint / f"ra.{loop}" / "models" / "m"
        done = sh(f"mkdir {model} && echo start > {model}/control && "
                  f"echo recommendation > {model}/mode && "
                  f"echo read_ahead_kb=1024 > {model}/recommend")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: read_ahead(loop) == "1024", what="the recommendation applied")
        m.kill(signal.SIGKILL)
        assert read_ahead(loop) == "1024"  # left behind by the crash
        again = Mount(mount_root, DECLARED_CONFIG.format(device=loop))
        again.start()
        try:
            assert read_ahead(loop) == original  # restored before the mount was ready
            assert ledger(again) == []
        finally:
            again.kill(signal.SIGTERM)
    finally:
        m.kill(signal.SIGTERM)
