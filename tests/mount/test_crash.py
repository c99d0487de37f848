"""SIGKILL of the daemon and a new `mlfs mount` on the same mountpoint and state dir."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests.harness import QUIET_CONFIG, Mount, read_rows, sh, wait_for, write_errno


def metric(mount: Mount, name: str) -> float:
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.split("{")[0].split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def dataset_ticks(mount: Mount) -> list[int]:
    ticks: list[int] = []
    for portion in sorted((mount.sub / "dataset").glob("*.parquet")):
        ticks += pq.read_table(portion, columns=["tick"]).column(0).to_pylist()
    return ticks


def hard_kill(mount: Mount) -> None:
    """SIGKILL by pid and wait for it to be gone, leaving the mount as the crash left it."""
    pid = mount.pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not mount.alive(), what="the daemon gone")
    mount.pid = None


def test_sigkill_then_mount_again_keeps_rows_models_and_journal(mount):
    sub = mount.sub
    model = sub / "models/survivor"
    assert sh(f"mkdir {model} && echo collaboration > {model}/mode && "
              f"echo start > {model}/control && "
              f"echo 'read_ahead_kb=400 expect=900' > {model}/recommend").returncode == 0
    wait_for(lambda: len(list((sub / "dataset").glob("*.parquet"))) >= 2, what="2 portions")
    visible = dataset_ticks(mount)
    numbers = [int(p.stem) for p in (sub / "dataset").glob("*.parquet")]
    next_tick = int(metric(mount, "mlfs_tick"))
    mount.kill(signal.SIGKILL)
    assert not os.path.ismount(mount.mountpoint)
    mount.start()
    assert (mount.mountpoint / "version").read_text().startswith("mlfs ")
    # the model and its settings survived; it is started again, not running yet
    assert (model / "state").read_text() == "started\n"
    assert (model / "mode").read_text() == "collaboration\n"
    assert (model / "mode_switching").read_text() == "pinned\n"
    assert (model / "knobs").read_text() == "read_ahead_kb\n"
    assert write_errno(sub / "control", b"prepare_dataset\n") == 0
    ticks = dataset_ticks(mount)
    assert set(visible) <= set(ticks), "rows visible before the crash are gone"
    assert ticks == sorted(set(ticks)), "a tick went backward or was reused"
    before = [t for t in ticks if t < next_tick]
    assert before == list(range(before[0], before[-1] + 1)), "a gap before the crash"
    assert before[-1] >= next_tick - 50, "more than a second of rows lost"
    after = [t for t in ticks if t >= next_tick]
    assert after, "no rows after the restart"
    new_numbers = [int(p.stem) for p in (sub / "dataset").glob("*.parquet")
                   if int(p.stem) not in numbers]
    assert new_numbers and min(new_numbers) > max(numbers), "portion numbering restarted"
    journal = wait_for(lambda: [r for r in read_rows(model / "recommendations")
                                if r["status"] == "accepted"], what="the journal sealed")
    assert journal[0]["line"] == "read_ahead_kb=400 expect=900"
    assert journal[0]["expect"] == 900.0


def test_pending_rows_come_back_in_the_first_portion_after_a_crash(mount_root):
    m = Mount(mount_root, QUIET_CONFIG).start()
    try:
        wait_for(lambda: metric(m, "mlfs_dataset_rows_pending") >= 40, what="40 pending rows")
        assert not list((m.sub / "dataset").glob("*.parquet"))
        next_tick = int(metric(m, "mlfs_tick"))
        m.kill(signal.SIGKILL)
        m.start()
        assert write_errno(m.sub / "control", b"prepare_dataset\n") == 0
        (first,) = sorted((m.sub / "dataset").glob("*.parquet"))
        ticks = pq.read_table(first, columns=["tick"]).column(0).to_pylist()
        recovered = [t for t in ticks if t < next_tick]
        assert recovered[0] == 0
        assert recovered == list(range(len(recovered)))
        assert len(recovered) >= next_tick - 50
        assert ticks == sorted(set(ticks))
        fresh = [t for t in ticks if t >= next_tick]
        assert fresh and fresh[0] > recovered[-1]
    finally:
        m.kill(signal.SIGTERM)


def test_mount_cleans_a_mount_left_by_a_crashed_daemon(mount):
    model = mount.sub / "models/stays"
    model.mkdir()
    hard_kill(mount)  # no fusermount3 by the test: whatever the crash left stays
    mount.start()
    assert mount.alive()
    assert os.path.ismount(mount.mountpoint)
    assert (model / "state").read_text() == "initialized\n"
    assert sh(f"ls {mount.sub}").returncode == 0


def test_blocked_readers_do_not_hang_when_the_daemon_is_killed(mount):
    procs = [subprocess.Popen(["cat", str(mount.mountpoint / "events")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(3)]
    try:
        wait_for(lambda: metric(mount, "mlfs_event_readers") >= 3, what="readers open")
        time.sleep(0.2)
        hard_kill(mount)
        for proc in procs:
            proc.wait(timeout=10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
    mount.start()
    assert (mount.sub / "info").read_text().startswith("{")


def test_the_pid_file_names_the_running_daemon_and_its_mountpoint(mount):
    pid = int((mount.state_dir / "mlfs.pid").read_text())
    assert pid == mount.pid
    cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    assert str(mount.mountpoint).encode() in cmdline


HOURLY_CONFIG = """
[mount]
allow_other = true

[[subsystem]]
backend = "sim.readahead"
tick_seconds = 3600
"""


def test_sigterm_ends_the_daemon_at_once_while_a_prepare_dataset_waits_for_an_hourly_tick(
        mount_root):
    m = Mount(mount_root, HOURLY_CONFIG)
    m.start()
    try:
        write_errno(m.sub / "control", b"prepare_dataset\n")  # seals the first tick's row
        writer = subprocess.Popen(["sh", "-c", f"echo prepare_dataset > {m.sub}/control"])
        # nothing is pending now: the writer waits in the kernel for the daemon's answer
        wait_for(lambda: "request_wait_answer" in Path(f"/proc/{writer.pid}/wchan").read_text()
                 or "fuse" in Path(f"/proc/{writer.pid}/wchan").read_text(),
                 what="the writer waiting in the kernel for the daemon's answer")
        assert metric(m, "mlfs_dataset_rows_pending") == 0
        # an hourly tick is 3,600 s: a stop that ends within 30 s did not wait for it
        m.stop(signal.SIGTERM, timeout=30)
        writer.wait(timeout=10)
    finally:
        m.kill()


def test_a_live_mount_is_not_mounted_over_and_keeps_serving(mount):
    """A second `mlfs mount` on a mountpoint a live daemon serves gives up (exit 1,
    "already mounted") after waiting the few seconds a killed daemon's mount may take
    to go, and the first one keeps serving."""
    done = subprocess.run(mount.command("mount", str(mount.mountpoint), "--state-dir",
                                        str(mount.state_dir) + "-second"),
                          capture_output=True, text=True, timeout=60, cwd=mount.cwd)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "already mounted" in done.stdout + done.stderr
    assert mount.alive()
    assert (mount.mountpoint / "version").read_text().startswith("mlfs ")
