"""mlfs.client against a real mount: attributes, one-write lines, events, portions, status,
and MountProcess's start/stop by pid (with the guard against a reused pid)."""

from __future__ import annotations

import errno
import signal
import subprocess
import time

import pytest

from mlfs import client
from tests.harness import FAST_CONFIG, REPO, wait_for


def test_read_attr_strips_and_read_attr_or_falls_back(shared_mount):
    assert client.read_attr(shared_mount.mountpoint / "version").startswith("mlfs ")
    assert client.read_attr_or(shared_mount.sub / "no-such-file", "?") == "?"
    with pytest.raises(OSError) as raised:
        client.read_attr(shared_mount.sub / "no-such-file")
    assert raised.value.errno == errno.ENOENT


def test_write_line_starts_a_model_and_a_refusal_keeps_its_errno_and_reason(shared_models):
    model = shared_models("client-write", start=False)
    client.write_line(model / "control", "start\n")
    assert client.read_attr(model / "state") in ("started", "running")
    with pytest.raises(OSError) as raised:
        client.write_line(model / "recommend", "read_ahead_kb=not-a-number\n")
    assert raised.value.errno == errno.EINVAL
    assert "read_ahead_kb" in client.last_error(model)
    assert client.write_errno(model / "recommend", b"no_such_knob=1\n") == errno.EINVAL
    assert client.write_errno(model / "recommend", b"read_ahead_kb=256\n") == 0


def test_event_stream_wakes_on_poll_and_yields_whole_json_events(shared_mount, shared_models):
    with client.EventStream(shared_mount.sub / "events") as events:
        model = shared_models("client-events", start=False)
        client.write_line(model / "control", "start\n")
        event = events.wait_for(lambda e: e.get("event") == "state"
                                and e.get("model") == "client-events"
                                and e.get("to") in ("started", "running"))
        assert event is not None, list(events.recent)
        assert event["subsystem"] == "sim.readahead" and event["from"] == "initialized"
        assert events.bad_lines == 0 and not events.ended
    assert events.fd == -1


def test_a_blocking_event_stream_waits_in_read_and_yields_the_same_events(shared_mount,
                                                                           shared_models):
    """blocking=True: each read() is one blocking read(2) (FAST_CONFIG seals every
    second, so the subsystem's stream is never silent for long)."""
    with client.EventStream(shared_mount.sub / "events", blocking=True) as events:
        shared_models("client-blocking")
        seen: list[dict] = []
        deadline = time.monotonic() + 20
        while not any(e.get("model") == "client-blocking" for e in seen):
            assert time.monotonic() < deadline, seen[-3:]
            seen += events.read()
        assert all("seq" in e and "event" in e for e in seen) and events.bad_lines == 0


def test_event_stream_wait_for_answers_none_when_nothing_matches(shared_mount):
    with client.EventStream(shared_mount.mountpoint / "events") as events:
        assert events.wait_for(lambda e: e.get("event") == "never-sent", timeout=0.3) is None


def test_portions_are_listed_oldest_first_and_read_whole(shared_mount):
    assert client.write_errno(shared_mount.sub / "control", b"prepare_dataset\n") == 0
    dataset = shared_mount.sub / "dataset"
    names = wait_for(lambda: client.list_portions(dataset), what="a sealed portion")
    assert names == sorted(names) and all(n.endswith(".parquet") for n in names)
    table = client.read_portion(dataset / names[-1], ["tick"])
    assert table.column_names == ["tick"] and table.num_rows > 0
    rows, older = client.tail_rows(dataset, ["tick"], 3)
    assert len(rows) == 3 and [r["tick"] for r in rows] == sorted(r["tick"] for r in rows)
    with pytest.raises(OSError):  # no parent either: not "nothing sealed yet" but an error
        client.list_portions(shared_mount.mountpoint / "no-such-dir" / "dataset")


def test_collect_status_shows_subsystems_and_models(shared_mount, shared_models):
    shared_models("client-status")
    status = client.collect_status(shared_mount.mountpoint)
    sub = status["subsystems"]["sim.readahead"]
    assert status["version"].startswith("mlfs ") and sub["backend"] == "sim.readahead"
    assert set(sub["models"]["client-status"]) == set(client.MODEL_ATTRIBUTES)
    assert "read_ahead_kb" in sub["knobs"]


def test_collect_status_of_a_plain_directory_raises_not_mounted(tmp_path):
    with pytest.raises(client.NotMounted) as raised:
        client.collect_status(tmp_path)
    assert "not an mlfs mount" in raised.value.strerror
    with pytest.raises(FileNotFoundError):  # a missing path is its own error, as before
        client.collect_status(tmp_path / "missing")


def test_mount_process_starts_stops_by_pid_and_leaves_nothing_mounted(mount_root):
    config = mount_root / "m.toml"
    config.write_text(FAST_CONFIG)
    (mount_root / "m").mkdir()
    proc = client.MountProcess(mount_root / "m", mount_root / "m-state", config, cwd=REPO)
    try:
        proc.start()
        assert proc.alive() and proc.ready() and proc.started == client.start_time(proc.pid)
        done = proc.umount()
        assert done.returncode == 0, done.stderr
        assert not proc.alive() and proc.pid is None and not proc.ready()
    finally:
        proc.stop()


def test_mount_process_never_signals_a_process_that_reused_the_pid(tmp_path):
    """A pid with another start time is someone else's: alive() says no, stop() leaves it."""
    other = subprocess.Popen(["sleep", "30"])
    try:
        proc = client.MountProcess(tmp_path / "m", tmp_path / "state")
        proc.pid, proc.started = other.pid, client.start_time(other.pid)
        assert proc.alive()
        proc.started -= 1  # as if our daemon had died and `sleep` had got its number
        assert not proc.alive() and not proc.send(signal.SIGTERM)
        (tmp_path / "m").mkdir()
        proc.stop(timeout=0.2)
        assert other.poll() is None  # still running: never signalled
    finally:
        other.kill()
        other.wait()


def test_a_mount_that_fails_raises_mount_failed_with_its_output_and_leaves_no_pid(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[mount]\nno_such_key = 1\n")
    (tmp_path / "m").mkdir()
    proc = client.MountProcess(tmp_path / "m", tmp_path / "state", bad, cwd=REPO)
    with pytest.raises(client.MountFailed) as raised:
        proc.start()
    assert "no_such_key" in raised.value.output and str(bad) in raised.value.output
    assert proc.pid is None and not proc.alive()
    proc.stop()  # nothing to end: returns at once, the mountpoint is a plain directory
