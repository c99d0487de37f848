"""MOUNT/host: each mount's fleet host id, stable across remounts, configurable."""

from __future__ import annotations

import signal

import pytest

from mlfs.config import MountConfig
from tests.harness import FAST_CONFIG, Mount

pytestmark = pytest.mark.mount


def test_each_mount_is_its_own_host_and_keeps_its_id_across_remounts(mount_root):
    first, second = Mount(mount_root, name="a"), Mount(mount_root, name="b")
    try:
        first.start()
        second.start()
        a = (first.mountpoint / "host").read_text()
        b = (second.mountpoint / "host").read_text()
        assert a.endswith("\n") and a != b
        assert (first.state_dir / "host").read_text() == a  # kept in the state directory
        with pytest.raises(PermissionError):  # read-only, root too (as kernfs)
            (first.mountpoint / "host").write_text("other\n")
        first.umount()
        first.start()
        assert (first.mountpoint / "host").read_text() == a
    finally:
        first.kill(signal.SIGTERM)
        second.kill(signal.SIGTERM)


def test_configured_host_id_overrides_the_minted_one(mount_root):
    config = FAST_CONFIG.replace("[mount]\n", '[mount]\nhost_id = "rack7-db3"\n')
    m = Mount(mount_root, config=config)
    try:
        m.start()
        assert (m.mountpoint / "host").read_text() == "rack7-db3\n"
    finally:
        m.kill(signal.SIGTERM)


def test_host_id_that_is_no_safe_partition_value_is_refused():
    with pytest.raises(ValueError, match="mount.host_id"):
        MountConfig(host_id="../etc")
    with pytest.raises(ValueError, match="mount.host_id"):
        MountConfig(host_id="Host A")
