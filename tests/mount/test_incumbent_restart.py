"""The incumbent survives a restart of the daemon (docs/ABI.md, "The incumbent").

sim.readahead in its strided phase: 32 KiB of read-ahead beats the default x1.35
(tests/mount/test_incumbent.py).  A trainer's recommendation gets it measured and
proven; the mount is unmounted while the model runs and mounted again on the same
state directory: the measured pairs come back (`measured.json`), so the incumbent
is the same setting at once.  A stopped model measures nothing after the restore,
so there the whole `incumbent` file must come back exactly as it was.
"""

from __future__ import annotations

import signal

from mlfs.core.models.incumbent import Incumbent
from mlfs.core.models.safe_set_file import SAFE_SET_FILE, SAVE_EVERY_PAIRS, decode
from tests.harness import Mount, wait_for, write_errno
from tests.mount.test_incumbent import STRIDED


def explore_32(m: Mount, ttl: int):
    """Model m started in learning, a trainer's 32 KiB exploration in force for `ttl`."""
    model = m.sub / "models" / "m"
    model.mkdir()
    assert write_errno(model / "control", b"start\n") == 0
    assert write_errno(model / "mode", b"learning\n") == 0
    assert write_errno(model / "recommend", f"read_ahead_kb=32 ttl={ttl}\n".encode()) == 0
    return model


def test_the_incumbent_and_its_pairs_survive_umount_and_mount(mount_root):
    m = Mount(mount_root, STRIDED).start()
    try:
        model = explore_32(m, ttl=3000)
        wait_for(lambda: (model / "incumbent").read_text().startswith("read_ahead_kb=32 "),
                 timeout=120, what="32 KiB becomes the incumbent")

        m.umount()  # the model still runs: the mount's close keeps its pairs
        saved = m.state_dir / "sim.readahead" / "models" / "m" / SAFE_SET_FILE
        safe = decode(saved.read_bytes(), ["knob_read_ahead_kb"])
        kept = Incumbent(safe, {"knob_read_ahead_kb": "read_ahead_kb"}).file_text()
        assert kept.startswith("read_ahead_kb=32 "), kept

        m.start()
        shown = (model / "incumbent").read_text()
        assert shown.startswith("read_ahead_kb=32 "), shown
        assert (model / "errors").read_text() == ""

        # stopped, the model measures nothing more: the file comes back as it was
        assert write_errno(model / "control", b"stop\n") == 0
        before = (model / "incumbent").read_text()
        m.umount()
        m.start()
        assert (model / "state").read_text().strip() == "stopped"
        assert (model / "incumbent").read_text() == before
    finally:
        m.kill(signal.SIGTERM)


def test_a_crash_loses_at_most_the_pairs_since_the_last_snapshot(mount_root):
    """SIGKILL: no close runs, so what comes back is the snapshot written every
    `SAVE_EVERY_PAIRS` pairs while the model ran, never an empty incumbent."""
    m = Mount(mount_root, STRIDED).start()
    try:
        model = explore_32(m, ttl=100000)
        saved = m.state_dir / "sim.readahead" / "models" / "m" / SAFE_SET_FILE
        wait_for(saved.exists, timeout=300, what=f"a snapshot after {SAVE_EVERY_PAIRS} pairs")
        m.kill(signal.SIGKILL)
        # what the crash left is a whole snapshot (an atomic replace), whichever it is
        crashed = decode(saved.read_bytes(), ["knob_read_ahead_kb"])
        assert len(crashed.held()[1]["tick"]) > 0
        kept = Incumbent(crashed, {"knob_read_ahead_kb": "read_ahead_kb"}).file_text()
        assert kept.startswith("read_ahead_kb=32 "), kept

        m.start()
        assert (model / "errors").read_text() == ""
        shown = (model / "incumbent").read_text()
        assert shown.startswith("read_ahead_kb=32 "), shown
        assert not saved.with_name(SAFE_SET_FILE + ".damaged").exists()
    finally:
        m.kill(signal.SIGTERM)


def test_a_damaged_snapshot_is_set_aside_and_the_model_starts_empty(mount_root):
    m = Mount(mount_root, STRIDED).start()
    try:
        model = m.sub / "models" / "m"
        model.mkdir()
        m.umount()
        saved = m.state_dir / "sim.readahead" / "models" / "m" / SAFE_SET_FILE
        saved.write_bytes(b'{"format": 1, "level": 100.0, "settings": [[["knob_x", 1]]], ')
        m.start()
        assert (model / "incumbent").read_text().startswith("default x1.000\n")
        errors = (model / "errors").read_text()
        assert f"{SAFE_SET_FILE} not JSON" in errors and ".damaged" in errors, errors
        assert not saved.exists()
        assert saved.with_name(SAFE_SET_FILE + ".damaged").exists()
    finally:
        m.kill(signal.SIGTERM)
