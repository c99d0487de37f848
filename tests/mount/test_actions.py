"""Action commands on a real mount: root's configuration names one, a predictor's own alert
in recommendation mode runs it with the device as its argument, bounded in time; a load
may never name one."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.failing_disk import FailingLoop
from tests.harness import Mount, sh, wait_for, write_errno

CONFIG = """
[mount]
allow_other = true

[[subsystem]]
backend = "linux.health"
devices = ["{device}"]
tick_seconds = 0.1
capture = "off"
action = ["{script}", "--mark"]
action_timeout_seconds = {timeout}
action_every_seconds = 3600
"""


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _mount(mount_root: Path, loop: str, script: Path, timeout: float = 10.0) -> Mount:
    if os.geteuid() != 0:
        pytest.skip("linux.health reads /dev/kmsg: root")
    mount = Mount(mount_root, CONFIG.format(device=loop, script=script, timeout=timeout))
    mount.start()
    return mount


def _alert(mount: Mount, loop: str) -> Path:
    """A predictor in recommendation mode (root pins it) predicting the device's failure."""
    sub = mount.mountpoint / "linux.health"
    model = sub / "models" / "p"
    assert sh(f"mkdir {model} && echo start > {model}/control && "
              f"echo recommendation > {model}/mode").returncode == 0
    dev = json.loads((sub / "info").read_text())["targets"]["failure"]["key"]
    assert dev == "dev"
    number = (int(Path(f"/sys/block/{loop}/dev").read_text().split(":")[0]) << 20) | int(
        Path(f"/sys/block/{loop}/dev").read_text().split(":")[1])
    assert write_errno(model / "recommend",
                       f"dev={number} target=failure p=0.95\n".encode()) == 0
    return model


def test_a_models_alert_runs_roots_command_with_the_device(mount_root, loop, tmp_path):
    seen = tmp_path / "seen"
    script = _script(tmp_path / "mark", f'echo "$@" >> {seen}\n')
    mount = _mount(mount_root, loop, script)
    try:
        model = _alert(mount, loop)
        wait_for(lambda: seen.exists() and seen.read_text().strip(), what="the action ran")
        assert seen.read_text() == f"--mark {loop}\n"
        wait_for(lambda: "action target=failure argument=" in (model / "alerts").read_text(),
                 what="the action's end in alerts")
        assert f"argument={loop} exited exit=0" in (model / "alerts").read_text()
        metrics = (mount.mountpoint / "metrics").read_text()
        assert 'mlfs_actions_total{status="exited"} 1' in metrics
        # once per action_every_seconds for one device, whatever the alerts
        assert seen.read_text().count("\n") == 1
    finally:
        mount.kill()


def test_a_command_past_its_time_is_killed_and_the_ticks_go_on(mount_root, loop, tmp_path):
    script = _script(tmp_path / "hang", "exec sleep 600\n")
    mount = _mount(mount_root, loop, script, timeout=0.5)
    try:
        model = _alert(mount, loop)
        wait_for(lambda: "killed" in (model / "alerts").read_text(), what="the command killed")
        assert 'mlfs_actions_total{status="killed"} 1' in (mount.mountpoint /
                                                           "metrics").read_text()
        ticks = _ticks(mount)
        wait_for(lambda: _ticks(mount) > ticks + 3, what="the ticks going on")
    finally:
        mount.kill()


def _ticks(mount: Mount) -> int:
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.startswith('mlfs_ticks_total{subsystem="linux.health"}'):
            return int(float(line.split()[-1]))
    raise AssertionError("no tick counter")


def test_a_load_naming_an_action_is_refused(mount):
    assert write_errno(mount.mountpoint / "control",
                       b'load sim.readahead name=sim2 action=["/bin/true"]\n') == errno.EPERM
    assert "configuration file only" in (mount.mountpoint / "errors").read_text()
    assert not (mount.mountpoint / "sim2").exists()


# ---- containment: a command never holds the mount, and dies whole ----------------------
SIM_CONFIG = """
[mount]
allow_other = true

[[subsystem]]
backend = "sim.disks"
name = "disks"
drives = {drives}
seed = 1
tick_seconds = 0.2
action = ["{script}"]
action_timeout_seconds = {timeout}
action_every_seconds = 3600
"""


def _sim_mount(mount_root: Path, script: Path, timeout: float, drives: int = 5) -> Mount:
    mount = Mount(mount_root, SIM_CONFIG.format(script=script, timeout=timeout,
                                                drives=drives))
    mount.start()
    return mount


def _predictor(mount: Mount) -> Path:
    """Root's predictor on `disks`, started and pinned to recommendation (its alerts act)."""
    model = mount.mountpoint / "disks" / "models" / "p"
    assert sh(f"mkdir {model} && echo start > {model}/control && "
              f"echo recommendation > {model}/mode").returncode == 0
    return model


def _sigkill_pending_in_d(device: str) -> int | None:
    """The pid of a `dd` reading `device` that sits in D state with SIGKILL pending: the
    daemon killed it at its timeout and the kernel cannot deliver the kill until the I/O
    ends."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if Path(argv[0].decode()).name != "dd" or device.encode() not in b" ".join(argv):
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
        if fields["State"].startswith("D") and pending & (1 << (signal.SIGKILL - 1)):
            return int(entry.name)
    return None


def test_an_action_in_uninterruptible_sleep_never_holds_the_emergency_switch(mount_root,
                                                                              tmp_path):
    """Red team A9: the action reads a loop device whose backing FUSE server is stopped, so
    it sits in D state and SIGKILL at its timeout cannot end it.  The mount must still
    answer and `echo emergency > MOUNT/control` must complete and apply; the command is
    abandoned (counted, in `errors` and `alerts`), never waited for."""
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("a loop device over a FUSE file needs root and losetup")
    disk = FailingLoop(tmp_path / "disk", seed=1, healthy=1e6, degrading=1e6,
                       size_mb=16).start()
    stopped = False
    mount = None
    try:
        script = _script(tmp_path / "stuck", f"exec dd if={disk.device} of=/dev/null "
                         "iflag=direct bs=4096 count=1 skip=77\n")
        mount = _sim_mount(mount_root, script, timeout=1.0)
        model = _predictor(mount)
        os.kill(disk.process.pid, signal.SIGSTOP)  # the "disk" stops answering
        stopped = True
        assert write_errno(model / "recommend", b"drive_id=1 target=failure p=1\n") == 0
        wait_for(lambda: _sigkill_pending_in_d(disk.device), timeout=60,
                 what="the action killed at its timeout, still in D state")
        done = sh(f"timeout 30 bash -c 'echo emergency > {mount.mountpoint}/control'",
                  timeout=40)
        assert done.returncode == 0, f"the emergency switch hung or failed: {done}"
        assert (model / "mode").read_text().split()[0] == "emergency"
        assert sh(f"timeout 30 cat {mount.mountpoint}/version", timeout=40).returncode == 0
        wait_for(lambda: "abandoned" in (model / "alerts").read_text(), timeout=60,
                 what="the stuck command abandoned")
        assert "action abandoned" in (mount.mountpoint / "errors").read_text()
        assert 'mlfs_actions_total{status="abandoned"} 1' in (
            mount.mountpoint / "metrics").read_text()
        assert _sigkill_pending_in_d(disk.device), "still stuck: abandoned, not waited for"
    finally:
        if stopped:
            os.kill(disk.process.pid, signal.SIGCONT)
        if mount is not None:
            mount.kill()
        disk.stop()


def _processes(marker: str) -> list[int]:
    """Pids of live processes whose argv holds `marker` (a number no other process uses;
    as a sleep's length, longer than any test waits, so only a kill ends it)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker.encode() in argv and state != b"Z":
                out.append(int(entry.name))
    return out


def _kill_all(marker: str) -> None:
    for pid in _processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _count(mount: Mount, status: str) -> int:
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.startswith(f'mlfs_actions_total{{status="{status}"}}'):
            return int(float(line.split()[-1]))
    return 0


def test_at_most_four_commands_live_counting_every_process_they_started(mount_root,
                                                                         tmp_path):
    """Red team A7: `sleep & exit 0` let 50 commands live at once, since the bound counted
    direct children.  A command lives while any process it started lives."""
    marker = "3141.59"
    script = _script(tmp_path / "bg", f"sleep {marker} &\nexit 0\n")
    mount = _sim_mount(mount_root, script, timeout=600, drives=50)
    try:
        model = _predictor(mount)
        lines = "".join(f"drive_id={d} target=failure p=1\n" for d in range(50))
        assert write_errno(model / "recommend", lines.encode()) == 0
        wait_for(lambda: len(_processes(marker)) > 4 or _count(mount, "skipped") >= 150,
                 timeout=120, what="commands started or skipped")
        assert len(_processes(marker)) <= 4
    finally:
        mount.kill()
        _kill_all(marker)


def test_a_daemonizing_command_is_killed_at_its_timeout(mount_root, tmp_path):
    """Red team A10: `setsid sleep &` left its session and process group and outlived the
    timeout.  Its cgroup holds it, so it is killed with the command."""
    marker = "2718.28"
    script = _script(tmp_path / "daemon", f"setsid sleep {marker} &\nexit 0\n")
    mount = _sim_mount(mount_root, script, timeout=1.0)
    try:
        model = _predictor(mount)
        assert write_errno(model / "recommend", b"drive_id=1 target=failure p=1\n") == 0
        wait_for(lambda: "action target=" in (model / "alerts").read_text(), timeout=60,
                 what="the command's end")
        assert "killed" in (model / "alerts").read_text()
        wait_for(lambda: not _processes(marker), timeout=30, what="the setsid'ed sleep gone")
    finally:
        mount.kill()
        _kill_all(marker)


def test_a_daemonizing_command_dies_with_the_mount(mount_root, tmp_path):
    """Red team A10: the setsid'ed grandchild also outlived `mlfs umount`."""
    marker = "1618.03"
    script = _script(tmp_path / "daemon", f"setsid sleep {marker} &\nexit 0\n")
    mount = _sim_mount(mount_root, script, timeout=600)
    try:
        model = _predictor(mount)
        assert write_errno(model / "recommend", b"drive_id=1 target=failure p=1\n") == 0
        wait_for(lambda: _processes(marker), timeout=60, what="the command's sleep")
        mount.kill(signal.SIGTERM)
        wait_for(lambda: not _processes(marker), timeout=30, what="the sleep gone at umount")
    finally:
        mount.kill()
        _kill_all(marker)


def test_a_finished_command_is_reported_while_its_model_is_stopped(mount_root, tmp_path):
    """Issue 51: commands were reaped only from a predictor's records, so a command that
    ended after its model stopped was never reported.  The exchange reaps every tick."""
    running, gate = tmp_path / "running", tmp_path / "gate"
    script = _script(tmp_path / "wait", f"touch {running}\n"
                     f"while [ ! -e {gate} ]; do sleep 0.05; done\n")
    mount = _sim_mount(mount_root, script, timeout=600)
    try:
        model = _predictor(mount)
        assert write_errno(model / "recommend", b"drive_id=1 target=failure p=1\n") == 0
        wait_for(running.exists, timeout=60, what="the command running")
        assert write_errno(model / "control", b"stop\n") == 0
        gate.touch()
        wait_for(lambda: "exited exit=0" in (model / "alerts").read_text(), timeout=60,
                 what="the command's end reported")
    finally:
        mount.kill()
