"""`mlfs umount` finds its daemon from a pid file named after the mountpoint.

It must never touch another mount: a second mount whose daemon is stopped
(SIGSTOP, as a wedged daemon) must not delay `mlfs umount` of the first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from mlfs import runfile
from tests.harness import REPO, Mount, mlfs_command, wait_for


def umount(mountpoint, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command("umount", str(mountpoint), "--timeout", "30"),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


@pytest.mark.parametrize("path", ["/mnt/mlfs", "/srv/ml fs/mount-1", "/", "/a/.b/ç",
                                  "//x//y/", "/tmp/mlfs-test-a_b/mnt"])
def test_pid_file_name_is_the_mountpoint_escaped_as_systemd_escape_does(path):
    if shutil.which("systemd-escape") is None:
        pytest.skip("systemd-escape is not installed (Debian package systemd)")
    expected = subprocess.run(["systemd-escape", "--path", path], capture_output=True,
                              text=True, check=True).stdout.strip()
    assert runfile.escape_path(path) == expected


def test_the_daemon_writes_its_pid_file_under_run_and_removes_it_on_umount(mount):
    path = runfile.run_dir() / f"{runfile.escape_path(str(mount.mountpoint))}.pid"
    assert path.read_text() == f"{mount.pid}\n{mount.mountpoint}\n{mount.state_dir}\n"
    assert runfile.state_dir(mount.mountpoint) == mount.state_dir
    done = umount(mount.mountpoint)
    assert done.returncode == 0, done.stderr
    assert not path.exists()
    assert not os.path.ismount(mount.mountpoint)


def test_umount_of_one_mount_is_not_held_up_by_another_wedged_mount(mount_root):
    # b first: a scan of /proc in pid order would then meet b's daemon before a's
    b = Mount(mount_root, name="b").start()
    a = Mount(mount_root, name="a")
    try:
        a.start()
        os.kill(b.pid, signal.SIGSTOP)  # b's daemon answers nothing now
        time.sleep(1.5)  # past the root's 1 s attribute timeout: a stat of b now waits on b
        # b wedged: a's umount must still end (the timeout says broken, not slow)
        done = umount(a.mountpoint, timeout=60)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: not a.alive(), what="a's daemon to end")
        assert not os.path.ismount(a.mountpoint)
        os.kill(b.pid, signal.SIGCONT)
        assert (b.mountpoint / "version").read_text().startswith("mlfs ")
    finally:
        if b.pid is not None:
            os.kill(b.pid, signal.SIGCONT)
        b.kill(signal.SIGTERM)
        a.kill(signal.SIGTERM)


def test_a_pid_file_whose_pid_now_belongs_to_another_process_is_not_trusted(tmp_path):
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    env = {**os.environ, "MLFS_RUN_DIR": str(tmp_path / "run")}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run").mkdir()
        name = runfile.escape_path(str(mountpoint))
        (tmp_path / "run" / f"{name}.pid").write_text(f"{bystander.pid}\n{mountpoint}\n")
        done = umount(mountpoint, env=env)
        assert done.returncode == 1
        assert "no mlfs daemon serves" in done.stderr, done.stderr
        assert bystander.poll() is None, "umount signalled a process that is not the daemon"
    finally:
        bystander.kill()
        bystander.wait()


def test_umount_of_a_wedged_mount_gives_up_after_its_timeout_and_detaches(mount):
    """Finding the daemon never stats the mount, so even its own wedge cannot hang umount."""
    os.kill(mount.pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)  # past the root's attribute timeout: a stat would wait on the daemon
        done = subprocess.run(mlfs_command("umount", str(mount.mountpoint), "--timeout", "2"),
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 1 and "unmounting lazily" in done.stderr, done.stderr
        assert not os.path.ismount(mount.mountpoint)
    finally:
        os.kill(mount.pid, signal.SIGCONT)
    # the SIGTERM it got while stopped is delivered now: it seals and ends by itself
    wait_for(lambda: not mount.alive(), timeout=60, what="the daemon to end after SIGCONT")
