"""Model lifecycle, knob ownership, control commands and modes; umount and status."""

from __future__ import annotations

import errno
import os
import signal
import subprocess

import pyarrow.parquet as pq

from tests.harness import REPO, mlfs_command, sh, wait_for, write_errno


def text(path) -> str:
    return path.read_text()


def test_model_goes_initialized_started_running_stopped_and_starts_again(shared_mount,
                                                                        shared_models):
    model = shared_models("life", start=False)
    assert text(model / "state") == "initialized\n"
    assert sh(f"echo start > {model}/control").returncode == 0
    assert text(model / "state") == "started\n"
    assert sh(f"echo read_ahead_kb=256 > {model}/recommend").returncode == 0
    wait_for(lambda: text(model / "state") == "running\n", what="running after an ML tick")
    assert sh(f"echo stop > {model}/control").returncode == 0
    assert text(model / "state") == "stopped\n"
    assert sh(f"echo start > {model}/control").returncode == 0
    assert text(model / "state") == "started\n"
    assert sh(f"echo start > {model}/control").returncode == 0, "start is idempotent"
    assert text(model / "state") == "started\n"


def test_a_model_that_never_gets_a_recommendation_stays_started(shared_mount, shared_models):
    model = shared_models("waiting")
    before = int(_metric(shared_mount, "mlfs_ticks_total"))
    wait_for(lambda: int(_metric(shared_mount, "mlfs_ticks_total")) > before + 30,
             what="30 ticks")
    assert text(model / "state") == "started\n"


def _metric(mount, name: str) -> str:
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return line.rsplit(" ", 1)[1]
    raise AssertionError(f"no metric {name}")


def test_starting_a_second_model_on_the_same_knob_is_ebusy(shared_mount, shared_models):
    first = shared_models("owner")
    second = shared_models("rival", start=False)
    done = sh(f"echo start > {second}/control")
    assert done.returncode == 1
    assert "Device or resource busy" in done.stderr, done.stderr
    assert text(second / "state") == "initialized\n"
    assert "owner" in text(second / "errors")
    assert sh(f"echo stop > {first}/control").returncode == 0
    assert sh(f"echo start > {second}/control").returncode == 0
    assert text(second / "state") == "started\n"
    done = sh(f"echo start > {first}/control")
    assert "Device or resource busy" in done.stderr
    assert text(first / "state") == "stopped\n"


def test_writing_knobs_with_an_unknown_knob_is_einval_and_changes_nothing(shared_mount,
                                                                         shared_models):
    model = shared_models("knobset", start=False)
    for bad in ("swappiness", "read_ahead_kb swappiness", "", "read_ahead_kb read_ahead_kb"):
        done = sh(f"echo '{bad}' > {model}/knobs")
        assert done.returncode == 1, bad
        assert "Invalid argument" in done.stderr, (bad, done.stderr)
        assert text(model / "knobs") == "read_ahead_kb\n"
    assert sh(f"echo read_ahead_kb > {model}/knobs").returncode == 0
    assert text(model / "knobs") == "read_ahead_kb\n"
    assert len(text(model / "errors").splitlines()) == 4


def test_unknown_control_commands_are_einval(shared_mount, shared_models):
    model = shared_models("commands", start=False)
    for path in (model / "control", shared_mount.sub / "control"):
        for bad in ("bogus", "start stop", "START", ""):
            done = sh(f"echo '{bad}' > {path}")
            assert done.returncode == 1, (path, bad)
            assert "Invalid argument" in done.stderr, (path, bad, done.stderr)
    assert text(model / "state") == "initialized\n"
    assert "unknown command 'bogus'" in text(model / "errors")


def test_model_control_accepts_the_dataset_commands(shared_mount, shared_models):
    model = shared_models("dsctl", start=False)
    dataset = shared_mount.sub / "dataset"
    assert sh(f"echo prepare_dataset > {model}/control").returncode == 0
    before = {int(p.stem) for p in dataset.glob("*.parquet")}
    assert before
    assert sh(f"echo discard_dataset > {model}/control").returncode == 0
    # portions sealed since (one a second here) are newer than every discarded one
    wait_for(lambda: all(int(p.stem) > max(before) for p in dataset.glob("*.parquet")),
             timeout=1.5, what="the discarded portions gone from the listing")
    assert text(model / "state") == "initialized\n"


def test_mode_pins_and_auto_returns_to_automatic_switching(shared_mount, shared_models):
    model = shared_models("modes")
    assert text(model / "mode_switching") == "auto\n"
    for mode in ("collaboration", "recommendation", "learning", "emergency"):
        assert sh(f"echo {mode} > {model}/mode").returncode == 0
        assert text(model / "mode") == f"{mode}\n"
        assert text(model / "mode_switching") == "pinned\n"
    assert sh(f"echo learning > {model}/mode").returncode == 0
    assert sh(f"echo auto > {model}/mode").returncode == 0
    assert text(model / "mode_switching") == "auto\n"
    assert text(model / "mode") == "learning\n"
    for bad in ("bogus", "auto learning", "Learning", ""):
        done = sh(f"echo '{bad}' > {model}/mode")
        assert done.returncode == 1 and "Invalid argument" in done.stderr, bad
    assert text(model / "mode") == "learning\n"
    assert text(model / "mode_switching") == "auto\n"


def test_a_pinned_mode_is_kept(shared_mount, shared_models):
    model = shared_models("pinned")
    assert write_errno(model / "mode", b"recommendation\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=0\n") == 0  # a bad model
    before = int(_metric(shared_mount, "mlfs_ticks_total"))
    wait_for(lambda: int(_metric(shared_mount, "mlfs_ticks_total")) > before + 150,
             what="150 ticks")
    assert text(model / "mode") == "recommendation\n"
    assert float(text(model / "efficiency")) < 0.5


def test_auto_after_pinned_emergency_leaves_emergency(shared_mount, shared_models):
    """`echo auto > mode` after a pinned emergency must not leave the model stuck there."""
    model = shared_models("unpin")
    assert write_errno(model / "mode", b"emergency\n") == 0
    assert write_errno(model / "mode", b"auto\n") == 0
    assert text(model / "mode_switching") == "auto\n"
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    wait_for(lambda: text(model / "mode") != "emergency\n", timeout=5,
             what="the model out of emergency once unpinned and recommended to")
    wait_for(lambda: text(model / "state") == "running\n", timeout=5,
             what="an ML tick")


def test_start_with_mode_and_knobs_survives_in_status(mount):
    sub = mount.sub
    assert sh(f"mkdir {sub}/models/alpha {sub}/models/beta && "
              f"echo start > {sub}/models/alpha/control && "
              f"echo collaboration > {sub}/models/alpha/mode").returncode == 0
    done = subprocess.run(mlfs_command("status", str(mount.mountpoint)), capture_output=True,
                          text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "sim.readahead" in out
    alpha = next(line for line in out.splitlines() if line.split()[:1] == ["alpha"])
    beta = next(line for line in out.splitlines() if line.split()[:1] == ["beta"])
    assert "started" in alpha.split() and "collaboration" in alpha.split()
    assert "pinned" in alpha.split()
    assert "initialized" in beta.split() and "learning" in beta.split()
    assert "read_ahead_kb=" in out


def test_umount_seals_every_pending_row_and_leaves_an_empty_directory(mount):
    sub = mount.sub
    assert sh(f"mkdir {sub}/models/u && echo start > {sub}/models/u/control && "
              f"echo read_ahead_kb=512 > {sub}/models/u/recommend").returncode == 0
    wait_for(lambda: list((sub / "dataset").glob("*.parquet")), what="a first portion")
    pid = mount.pid
    reader = subprocess.Popen(["cat", str(mount.mountpoint / "events")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: int(_metric(mount, "mlfs_event_readers")) >= 1, what="reader open")
        ticks_seen = int(_metric(mount, "mlfs_ticks_total"))
        done = subprocess.run(mlfs_command("umount", str(mount.mountpoint)),
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr
        mount.pid = None  # gone: never signal a pid that may be reused
        assert reader.wait(timeout=10) == 0, "a blocked reader gets end of file"
    finally:
        if reader.poll() is None:
            reader.send_signal(signal.SIGKILL)
            reader.wait()
    assert not os.path.ismount(mount.mountpoint)
    assert os.listdir(mount.mountpoint) == []
    assert not _serves(pid, mount.mountpoint), "the daemon outlived umount"
    state = mount.state_dir / "sim.readahead/dataset"
    ticks = []
    for portion in sorted(state.glob("*.parquet")):
        ticks += pq.read_table(portion, columns=["tick"]).column(0).to_pylist()
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), "rows lost at umount"
    assert len(ticks) >= ticks_seen
    for wal in state.glob("wal.*.jsonl"):
        assert wal.stat().st_size == 0, f"{wal} still holds rows after umount"
    feedback = mount.state_dir / "sim.readahead/models/u/feedback"
    assert list(feedback.glob("*.parquet")), "feedback sealed at umount too"


def _serves(pid: int, mountpoint) -> bool:
    """Is `pid` (still) a live process whose command line names `mountpoint`?"""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().split(") ")[1].startswith("Z"):
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return str(mountpoint).encode() in fh.read().split(b"\0")
    except OSError:
        return False


def test_mount_refuses_a_second_daemon_on_a_mounted_directory(mount):
    done = subprocess.run(
        mlfs_command("mount", str(mount.mountpoint), "--config", str(mount.config_path),
                     "--state-dir", str(mount.root / "other-state")),
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode != 0
    assert mount.alive()
    assert (mount.mountpoint / "version").read_text().startswith("mlfs ")


def test_a_write_through_a_descriptor_opened_before_rmdir_is_enodev(shared_mount,
                                                                    shared_models):
    """As in sysfs: the attribute is gone; never EIO, never a write to a dead proxy."""
    for name, data in (("control", b"start\n"), ("recommend", b"read_ahead_kb=64\n"),
                       ("mode", b"learning\n"), ("policy", b"tree\n")):
        model = shared_models(f"vanish-{name}", start=name == "recommend")
        fd = os.open(model / name, os.O_WRONLY | os.O_TRUNC)
        try:
            os.rmdir(model)
            result = write_errno_fd(fd, data)
        finally:
            os.close(fd)
        assert result == errno.ENODEV, (name, errno.errorcode.get(result, result))
        assert f"vanish-{name}" not in os.listdir(shared_mount.sub / "models")
    assert not list((shared_mount.state_dir / "sim.readahead/models").glob("vanish-*"))
    assert "unexpected error" not in (shared_mount.state_dir / "mlfs.log").read_text()


def write_errno_fd(fd: int, data: bytes) -> int:
    try:
        os.write(fd, data)
        return 0
    except OSError as exc:
        return exc.errno
