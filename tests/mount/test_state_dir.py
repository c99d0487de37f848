"""The state directory through real mounts: upgrade, damage, stale mounts, `mlfs restore`.

- A state directory written by mlfs at f0369e4 (format 1) is upgraded in
  place by a mount, and every portion, model and journal row is still served.
- Damage outside the stores (tick_reserved, mlfs.pid, a ledger entry) never
  stops a mount: the file is set aside as `.damaged`, with a log line.
- A mountpoint left stale (ENOTCONN) by a SIGKILLed daemon whose auto_unmount
  helper died first is cleared by the next `mlfs mount`.
- `mlfs restore --state-dir` puts a loop device's read_ahead_kb back after the
  daemon was SIGKILLed, and refuses while a daemon still serves the directory.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.harness import (
    APPLY,
    BLOCK_CONFIG,
    FAST_CONFIG,
    REPO,
    Mount,
    ledger,
    mlfs_command,
    read_ahead,
    read_rows,
    recommend,
    wait_for,
    write_errno,
)

DATA = Path(__file__).resolve().parent.parent / "data"


def mlfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command(*args), capture_output=True, text=True, timeout=90,
                          cwd=REPO)


def log_text(m: Mount) -> str:
    return (m.state_dir / "mlfs.log").read_text(errors="replace")


# ---- format version ---------------------------------------------------------------------
def test_a_format_1_state_directory_is_upgraded_and_everything_is_still_served(mount_root):
    m = Mount(mount_root)
    with tarfile.open(DATA / "state-format-1.tar.gz") as tar:
        tar.extractall(mount_root, filter="data")
    (mount_root / "state").rename(m.state_dir)
    old = m.state_dir / "sim.readahead"
    portions = sorted(p.name for p in (old / "dataset").glob("*.parquet"))
    old_rows = read_rows(old / "dataset")
    assert len(portions) == 6 and not (m.state_dir / "format").exists()
    m.start()
    try:
        assert (m.state_dir / "format").read_text() == "4\n"
        assert "state directory upgraded from format 1 to 2" in log_text(m)
        assert "state directory upgraded from format 2 to 3" in log_text(m)
        assert "state directory upgraded from format 3 to 4" in log_text(m)
        served = sorted(p.name for p in (m.sub / "dataset").glob("*.parquet"))
        assert served[:6] == portions
        assert read_rows(m.sub / "dataset")[:len(old_rows)] == old_rows
        model = m.sub / "models" / "m1"
        assert (model / "knobs").read_text() == "read_ahead_kb\n"
        journal = read_rows(model / "recommendations")
        assert [(r["status"], r["line"]) for r in journal[:2]] == [
            ("accepted", "read_ahead_kb=512 expect=900.5"),
            ("applied", "read_ahead_kb=512 expect=900.5")]
        assert len(list((model / "feedback").glob("*.parquet"))) >= 3
        # the subsystem runs on, and tick numbering continues after the old ticks
        assert write_errno(m.sub / "control", b"prepare_dataset\n") == 0
        new = read_rows(m.sub / "dataset")[len(old_rows):]
        assert new and min(r["tick"] for r in new) > max(r["tick"] for r in old_rows)
    finally:
        m.kill(signal.SIGTERM)


def test_a_newer_format_is_refused_in_one_line_and_nothing_mounts(mount_root):
    m = Mount(mount_root)
    m.state_dir.mkdir()
    (m.state_dir / "format").write_text("5\n")
    done = mlfs("mount", str(m.mountpoint), "--config", str(m.config_path),
                "--state-dir", str(m.state_dir))
    assert done.returncode == 2
    assert done.stderr == (f"mlfs: {m.state_dir}: state directory format 5 is newer than "
                           "this mlfs knows (4); mount it with a newer mlfs\n")
    assert not os.path.ismount(m.mountpoint)
    assert (m.state_dir / "format").read_text() == "5\n"


# ---- damage outside the stores ----------------------------------------------------------
VM_OBSERVED = FAST_CONFIG + """
[[subsystem]]
backend = "linux.vm"
tick_seconds = 0.5
"""


def test_damaged_tick_mark_pid_file_and_ledger_entry_do_not_stop_a_mount(mount_root):
    m = Mount(mount_root, VM_OBSERVED)
    m.start()
    m.kill(signal.SIGTERM)
    sub = m.state_dir / "sim.readahead"
    last_tick = max(r["tick"] for r in read_rows(sub / "dataset"))
    (sub / "tick_reserved").write_bytes(b"\xff\xfe garbage")
    (m.state_dir / "mlfs.pid").write_text("not a pid\n")
    knob = "/proc/sys/vm/swappiness"
    bad = m.state_dir / "ledger" / "%2Fproc%2Fsys%2Fvm%2Fswappiness.json"
    whole = json.dumps({"path": knob, "original": "60", "knob": "swappiness", "written": []})
    bad.write_text(whole[:-3])  # torn: not JSON any more
    escape = m.state_dir / "ledger" / "%2Fetc%2Fpasswd.json"
    escape.write_text(json.dumps({"path": "/etc/passwd", "original": "x", "written": []}))
    m.start()
    try:
        assert (sub / "tick_reserved.damaged").read_bytes() == b"\xff\xfe garbage"
        assert (m.state_dir / "mlfs.pid.damaged").read_text() == "not a pid\n"
        assert int((m.state_dir / "mlfs.pid").read_text()) == m.pid
        assert (bad.parent / (bad.name + ".damaged")).exists() and not bad.exists()
        assert (escape.parent / (escape.name + ".damaged")).exists() and not escape.exists()
        log = log_text(m)
        assert "tick_reserved is damaged" in log and "mlfs.pid is damaged" in log
        assert ("original still readable: swappiness=60 (/proc/sys/vm/swappiness)" in log)
        assert "'/etc/passwd' is not a file under /sys/ or /proc/sys/" in log
        # a damaged mark skips a whole reserve: no tick number is ever reused
        from mlfs.core.mount.runtime import TICK_RESERVE

        assert write_errno(m.sub / "control", b"prepare_dataset\n") == 0
        new_ticks = [r["tick"] for r in read_rows(m.sub / "dataset") if r["tick"] > last_tick]
        assert new_ticks and min(new_ticks) >= last_tick + 1 + TICK_RESERVE
    finally:
        m.kill(signal.SIGTERM)


def test_a_second_mount_on_a_state_directory_in_use_is_refused(mount_root, mount):
    other = mount_root / "other"
    other.mkdir()
    done = mlfs("mount", str(other), "--config", str(mount.config_path),
                "--state-dir", str(mount.state_dir))
    assert done.returncode == 2
    assert done.stderr == (f"mlfs: {mount.state_dir}: in use by the mlfs daemon {mount.pid} "
                           "(see its mlfs.pid)\n")
    assert not os.path.ismount(other)


# ---- a stale mountpoint -----------------------------------------------------------------
def _auto_unmount_helper(daemon: int, mountpoint: Path) -> int:
    """The pid of the fusermount3 child that would unmount when `daemon` dies."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(") ", 1)[1].split()[1])
        if ppid == daemon and argv[0].endswith(b"fusermount3") and \
                str(mountpoint).encode() in argv:
            return int(entry)
    pytest.fail(f"no auto_unmount helper of daemon {daemon}")


def _stat_errno(path: Path) -> int:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno or 0
    return 0


def test_mount_clears_a_stale_mountpoint_left_by_a_sigkilled_daemon(mount_root):
    m = Mount(mount_root)
    m.start()
    helper = _auto_unmount_helper(m.pid, m.mountpoint)
    os.kill(helper, signal.SIGKILL)  # no one left to unmount
    wait_for(lambda: not Path(f"/proc/{helper}").exists() or
             Path(f"/proc/{helper}/stat").read_text().split(") ")[1].startswith("Z"),
             what="the helper gone")
    daemon = m.pid
    os.kill(daemon, signal.SIGKILL)
    wait_for(lambda: not m.alive(), what="the daemon gone")
    m.pid = None
    wait_for(lambda: _stat_errno(m.mountpoint) == errno.ENOTCONN,  # once attrs expire
             what="ENOTCONN from the stale mountpoint")
    try:
        m.start()  # before: a traceback from pathlib's is_dir(), exit 1
        assert (m.mountpoint / "version").read_text().startswith("mlfs ")
        assert f"{m.mountpoint}: stale mount from a crash; unmounting it" in log_text(m)
    finally:
        m.kill(signal.SIGTERM)


# ---- mlfs restore -----------------------------------------------------------------------
def test_restore_puts_a_loop_device_knob_back_after_sigkill(mount_root, loop):
    original = read_ahead(loop)
    m = Mount(mount_root, BLOCK_CONFIG.format(device=loop, apply=APPLY))
    m.start()
    try:
        recommend(m, loop, 1024)
        wait_for(lambda: read_ahead(loop) == "1024", what="the recommendation applied")
    finally:
        m.kill(signal.SIGKILL)  # gone for good: nothing restored
    assert read_ahead(loop) == "1024"
    assert [e["original"] for e in ledger(m)] == [original]
    done = mlfs("restore", "--state-dir", str(m.state_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    path = f"/sys/block/{loop}/queue/read_ahead_kb"
    assert done.stdout == f"{path}: restored {original!r}\n"
    assert read_ahead(loop) == original
    assert ledger(m) == []
    again = mlfs("restore", "--state-dir", str(m.state_dir))
    assert again.returncode == 0 and "nothing to restore" in again.stdout


def test_restore_reads_a_set_aside_ledger_entry(mount_root, loop, tmp_path):
    original = read_ahead(loop)
    path = f"/sys/block/{loop}/queue/read_ahead_kb"
    state = tmp_path / "state"
    (state / "ledger").mkdir(parents=True)
    damaged = state / "ledger" / "x.json.damaged"
    whole = json.dumps({"format": "plain", "original": original, "path": path, "written": []})
    damaged.write_text(whole[:-5])  # torn: not JSON any more
    Path(path).write_text("2048\n")
    try:
        done = mlfs("restore", "--state-dir", str(state))
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == (f"{path}: restored {original!r} (from the set-aside "
                               "x.json.damaged)\n")
        assert read_ahead(loop) == original
        assert (state / "ledger" / "x.json.damaged.restored").exists()
    finally:
        Path(path).write_text(f"{original}\n")


def test_restore_reports_what_it_cannot_read_and_exits_nonzero(tmp_path):
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "y.json.damaged").write_bytes(b"\x00\x01")
    done = mlfs("restore", "--state-dir", str(tmp_path))
    assert done.returncode == 1
    assert "y.json.damaged: damaged: no kernel path with its original" in done.stderr
    assert "1 of 1 could not be restored" in done.stderr


def test_restore_refuses_while_a_daemon_serves_the_state_directory(mount):
    done = mlfs("restore", "--state-dir", str(mount.state_dir))
    assert done.returncode == 2
    assert done.stderr == (f"mlfs: {mount.state_dir}: the mlfs daemon {mount.pid} still "
                           "serves it; `mlfs umount` restores its knobs\n")
    assert mount.alive()


def test_restore_of_a_missing_directory_is_one_line(tmp_path):
    done = mlfs("restore", "--state-dir", str(tmp_path / "none"))
    assert (done.returncode, done.stderr) == (2, f"mlfs: {tmp_path / 'none'}: no such state "
                                                 "directory\n")
