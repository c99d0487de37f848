"""The operator's mount-wide emergency switch: MOUNT/control and MOUNT/errors."""

from __future__ import annotations

import errno
import shutil
import signal
import stat
import subprocess

import pytest

from tests.harness import (
    FAST_CONFIG,
    REPO,
    EventStream,
    Mount,
    mlfs_command,
    new_model,
    sh,
    two_subsystems,
    wait_for,
    write_errno,
)

TWO_SUBSYSTEMS = two_subsystems(FAST_CONFIG)
PINNED = "pinned by the operator via MOUNT/control"
RELEASED = "released by the operator via MOUNT/control"
NOBODY = "setpriv --reuid=nobody --regid=nogroup --clear-groups"


@pytest.fixture
def two(mount_root):
    m = Mount(mount_root, TWO_SUBSYSTEMS).start()
    try:
        yield m
    finally:
        m.kill(signal.SIGTERM)


def read(path) -> str:
    return path.read_text().strip()


def pinned_metric(m: Mount) -> int:
    for line in (m.mountpoint / "metrics").read_text().splitlines():
        if line.startswith("mlfs_mount_emergency_pinned "):
            return int(line.split()[1])
    raise AssertionError("no mlfs_mount_emergency_pinned metric")


def models(m: Mount) -> dict:
    """a1, b1 started; a2, b2 not (a started model owns its knobs); b2 pinned by its own write."""
    out = {name: new_model(m.mountpoint / sub, name, start=name.endswith("1"))
           for sub, name in (("sim.a", "a1"), ("sim.a", "a2"), ("sim.b", "b1"),
                             ("sim.b", "b2"))}
    assert write_errno(out["b2"] / "mode", b"collaboration\n") == 0
    return out


def tick(m: Mount, sub: str) -> int:
    for line in (m.mountpoint / "metrics").read_text().splitlines():
        if line.startswith(f'mlfs_tick{{subsystem="{sub}"}} '):
            return int(line.split()[1])
    raise AssertionError(f"no mlfs_tick for {sub}")


def test_root_control_and_errors_have_sysfs_modes(two):
    control = (two.mountpoint / "control").stat()
    errors = (two.mountpoint / "errors").stat()
    assert stat.S_IMODE(control.st_mode) == 0o200
    assert stat.S_IMODE(errors.st_mode) == 0o444
    assert (two.mountpoint / "errors").read_text() == ""
    assert sorted(p.name for p in two.mountpoint.iterdir()) == [
        "backends", "control", "errors", "events", "host", "metrics", "sim.a", "sim.b",
        "version"]


def test_emergency_pins_every_model_of_both_subsystems_and_auto_releases_them(two):
    made = models(two)
    root = two.mountpoint
    before = {name: read(path / "mode") for name, path in made.items()}
    assert before["b2"] == "collaboration"
    with EventStream(root / "events") as events:
        done = sh(f"echo emergency > {root}/control")
        assert done.returncode == 0, done.stderr
        mount_wide = events.wait_for(lambda e: e["event"] == "emergency"
                                     and e.get("model") is None, what="mount-wide event")
        assert mount_wide["pinned"] is True and mount_wide["why"] == PINNED
        for name in made:
            event = events.wait_for(lambda e, n=name: e["event"] == "emergency"
                                    and e.get("model") == n, what=f"{name} emergency")
            assert event["why"] == PINNED
        modes = [e for e in events.seen if e["event"] == "mode"]
        assert {e["model"] for e in modes} == set(made)
        assert all(e["to"] == "emergency" and e["why"] == PINNED for e in modes)
    assert {name: read(path / "mode") for name, path in made.items()} == dict.fromkeys(
        made, "emergency")
    assert read(made["a1"] / "mode_switching") == "pinned"
    assert pinned_metric(two) == 1
    assert write_errno(made["a1"] / "recommend", b"read_ahead_kb=64\n") == errno.EBUSY
    assert "pinned by the operator" in (made["a1"] / "errors").read_text()
    # the pin holds against the automatic switching of many ticks, and a model's own
    # mode write is remembered for the release but does not lift the pin
    assert write_errno(made["a2"] / "mode", b"recommendation\n") == 0
    late = new_model(root / "sim.a", "late", start=False)
    assert read(late / "mode") == "emergency", "a model created under the pin starts pinned"
    now = tick(two, "sim.a")
    wait_for(lambda: tick(two, "sim.a") > now + 50, what="50 ticks under the pin")
    assert read(made["a2"] / "mode") == "emergency"
    assert sh(f"echo emergency > {root}/control").returncode == 0, "pinning twice is fine"

    with EventStream(root / "events") as events:
        done = sh(f"echo auto > {root}/control")
        assert done.returncode == 0, done.stderr
        released = events.wait_for(lambda e: e["event"] == "emergency"
                                   and e.get("model") is None, what="release event")
        assert released["pinned"] is False and released["why"] == RELEASED
        back = events.wait_for(lambda e: e["event"] == "mode" and e["model"] == "b2",
                               what="b2 back")
        assert back["why"] == RELEASED
    after = {name: read(path / "mode") for name, path in made.items()}
    assert after == {"a1": "learning", "a2": "recommendation", "b1": "learning",
                     "b2": "collaboration"}, "each back to its own pin or automatic switching"
    assert read(made["a1"] / "mode_switching") == "auto"
    assert read(late / "mode") == "learning"
    assert pinned_metric(two) == 0
    assert write_errno(made["a1"] / "recommend", b"read_ahead_kb=64\n") == 0
    assert (root / "errors").read_text() == "", "nothing was refused"


def test_nobody_cannot_pull_the_switch(two):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as nobody")
    made = models(two)
    done = sh(f"{NOBODY} bash -c 'echo emergency > {two.mountpoint}/control'")
    assert done.returncode != 0
    assert "Permission denied" in done.stderr, done.stderr
    assert pinned_metric(two) == 0
    assert read(made["a1"] / "mode") == "learning"
    assert (two.mountpoint / "errors").read_text() == "", "refused by the kernel"


BAD_COMMANDS = [
    (b"reboot\n", "unknown command 'reboot' (load, unload, emergency, auto)", "reboot"),
    (b"emergency now\n", "unknown command 'emergency now'", "emergency now"),
    (b"\n", "unknown command '(nothing)'", ""),
    (b"load sim.readahead name=sim3 seed=[1\n", "seed: '[1' is neither a TOML value",
     "load sim.readahead name=sim3 seed=[1"),
    (b"unload\n", "unload takes one subsystem name", "unload"),
    (b"emerg\xffency\n", "input is not ASCII text", "emerg\\xffency"),
]


def test_a_bad_command_is_einval_with_a_line_in_errors_and_changes_nothing(two):
    made = models(two)
    for count, (command, reason, shown) in enumerate(BAD_COMMANDS, 1):
        assert write_errno(two.mountpoint / "control", command) == errno.EINVAL, command
        lines = (two.mountpoint / "errors").read_text().splitlines()
        assert len(lines) == count
        stamp, file, rest = lines[-1].split(" ", 2)
        assert stamp.endswith("Z") and file == "control"
        assert rest.startswith(reason), rest
        assert rest.endswith(": " + shown), "the input, escaped"
    assert pinned_metric(two) == 0
    assert read(made["a1"] / "mode") == "learning"
    shell = sh(f"echo reboot > {two.mountpoint}/control")
    assert shell.returncode == 1 and "Invalid argument" in shell.stderr
    assert 'mlfs_rejected_writes_total{subsystem="",file="control"} 7' in (
        two.mountpoint / "metrics").read_text()


def test_the_pin_survives_a_crash_and_a_remount_until_released(mount_root):
    m = Mount(mount_root, TWO_SUBSYSTEMS).start()
    try:
        made = models(m)
        assert write_errno(m.mountpoint / "control", b"emergency\n") == 0
        assert (m.state_dir / "emergency_pinned").exists()
        m.kill(signal.SIGKILL)  # a crash
        m.start()
        assert pinned_metric(m) == 1
        assert {read(path / "mode") for path in made.values()} == {"emergency"}
        assert write_errno(made["b1"] / "recommend", b"read_ahead_kb=64\n") == errno.EBUSY
        status = subprocess.run(mlfs_command("status", str(m.mountpoint)), cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert "EMERGENCY: every model pinned by the operator" in status.stdout, status.stderr
        m.umount()  # a clean stop and a new mount: still pinned
        m.start()
        assert pinned_metric(m) == 1
        assert read(made["a1"] / "mode") == "emergency"
        assert write_errno(m.mountpoint / "control", b"auto\n") == 0
        assert read(made["b2"] / "mode") == "collaboration"
        assert not (m.state_dir / "emergency_pinned").exists()
        m.kill(signal.SIGKILL)
        m.start()
        assert pinned_metric(m) == 0, "released stays released"
        assert read(made["a1"] / "mode") == "learning"
    finally:
        m.kill(signal.SIGTERM)
