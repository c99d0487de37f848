"""The event streams (docs/ABI.md, events) read by real readers: shells, coreutils, Python, poll."""

from __future__ import annotations

import errno
import json
import os
import re
import select
import shutil
import signal
import subprocess
import threading
import time

import pyarrow.parquet as pq
import pytest

from tests.harness import (
    FAST_CONFIG,
    QUIET_CONFIG,
    REPO,
    EventStream,
    Models,
    Mount,
    mlfs_command,
    sh,
    two_subsystems,
    wait_blocked,
    wait_for,
    write_errno,
)

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")


@pytest.fixture
def quiet_models(quiet_mount):
    made = Models(quiet_mount.sub)
    yield made
    made.cleanup()


def readers(mount) -> int:
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.startswith("mlfs_event_readers "):
            return int(line.split()[1])
    raise AssertionError("no mlfs_event_readers metric")


def prepare(mount) -> None:
    assert write_errno(mount.sub / "control", b"prepare_dataset\n") == 0


def popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def end(procs) -> None:
    """SIGKILL whatever is still running, by pid, and reap it."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_reader_opened_before_prepare_dataset_gets_the_portion_line(quiet_mount):
    with EventStream(quiet_mount.mountpoint / "events") as events:
        prepare(quiet_mount)
        event = events.wait_for(lambda e: e["event"] == "portion", what="portion")
    assert isinstance(event["seq"], int) and event["seq"] > 0
    assert RFC3339.match(event["ts"]), event["ts"]
    assert event["subsystem"] == "sim.readahead"
    assert re.fullmatch(r"sim\.readahead/dataset/\d{10}\.parquet", event["path"])
    path = quiet_mount.mountpoint / event["path"]
    assert path.exists(), "the portion is visible when its event is sent"
    assert pq.read_metadata(path).num_rows == event["rows"] > 0


def test_a_shell_read_loop_gets_whole_json_lines(quiet_mount):
    script = (f"while read -r line; do echo \"$line\"; case $line in *portion*) break;; "
              f"esac; done < {quiet_mount.sub}/events")
    proc = popen("bash", "-c", script)
    try:
        wait_for(lambda: readers(quiet_mount) >= 1, what="the shell reading")
        prepare(quiet_mount)
        out, err = proc.communicate(timeout=10)
    finally:
        end([proc])
    assert proc.returncode == 0 and err == ""
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["event"] == "portion"


def test_each_open_has_its_own_cursor_starting_at_now(quiet_mount):
    with EventStream(quiet_mount.sub / "events") as early:
        prepare(quiet_mount)
        first = early.wait_for(lambda e: e["event"] == "portion", what="first portion")
        with EventStream(quiet_mount.sub / "events") as late:
            prepare(quiet_mount)
            second = early.wait_for(lambda e: e["event"] == "portion", what="second")
            seen_late = late.wait_for(lambda e: e["event"] == "portion", what="late portion")
    assert second["seq"] > first["seq"]
    assert seen_late == second
    assert first not in late.seen


def test_head_n1_returns_one_line_and_exits_cleanly(quiet_mount):
    proc = popen("head", "-n1", str(quiet_mount.mountpoint / "events"))
    try:
        wait_for(lambda: readers(quiet_mount) >= 1, what="head reading")
        prepare(quiet_mount)
        out, err = proc.communicate(timeout=10)
    finally:
        end([proc])
    assert proc.returncode == 0
    assert err == "", "head seeks back after its line: offsets are ignored"
    assert out.count("\n") == 1
    assert json.loads(out)["event"] == "portion"


#: mawk (Debian's awk) fills its whole buffer before matching, on a pipe too;
#: -W interactive makes it read line by line
AWK = ["awk", "-W", "interactive"] if "mawk" in os.path.realpath(
    shutil.which("awk") or "") else ["awk"]


def test_waiting_sed_awk_grep_and_head_get_no_spurious_error(quiet_mount):
    events = str(quiet_mount.sub / "events")
    procs = [
        popen("sed", "-n", "/portion/{p;q}", events),
        popen(*AWK, "/portion/ { print; exit }", events),
        popen("grep", "-m1", "portion", events),
        popen("head", "-n1", events),
        # these two never exit by themselves: they read to end of file
        popen("sed", "-n", "1p", events),
        popen("awk", "NR == 1", events),
    ]
    try:
        wait_for(lambda: readers(quiet_mount) >= len(procs), what="all readers waiting")
        time.sleep(2.5)  # longer than any fixed read timeout: they must just wait
        for proc in procs:
            assert proc.poll() is None, (proc.args, proc.stderr.read())
        prepare(quiet_mount)
        for proc in procs[:4]:
            out, err = proc.communicate(timeout=10)
            assert (proc.returncode, err) == (0, ""), proc.args
            assert json.loads(out)["event"] == "portion", proc.args
        for still in procs[4:]:
            assert still.poll() is None, still.args
            still.send_signal(signal.SIGTERM)
            still.wait(timeout=5)
            assert still.stderr.read() == "", still.args
    finally:
        end(procs)


def test_a_blocked_cat_is_ended_by_sigterm_with_no_event_coming(quiet_mount):
    """Nothing is published on the quiet mount: only the daemon's signal check ends
    the read, so a reader still blocked at the timeout means that check is broken."""
    proc = popen("cat", str(quiet_mount.mountpoint / "events"))
    try:
        wait_blocked(quiet_mount, 1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        end([proc])
    assert proc.returncode == -signal.SIGTERM
    wait_for(lambda: readers(quiet_mount) == 0, what="the reader released")


def test_a_python_reader_gets_its_signal_handler_run_while_blocked(quiet_mount):
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGALRM, lambda *a: sys.exit(7))\n"
            "signal.setitimer(signal.ITIMER_REAL, 0.5)\n"
            f"open({str(quiet_mount.sub / 'events')!r}, 'rb').read(100)\n")
    done = subprocess.run(["python3", "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 7, done.stderr


def test_o_nonblock_read_with_nothing_ready_is_eagain(quiet_mount):
    fd = os.open(quiet_mount.sub / "events", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(BlockingIOError) as info:
            os.read(fd, 4096)
        assert info.value.errno == errno.EAGAIN
    finally:
        os.close(fd)


def test_poll_wakes_on_a_new_event(quiet_mount):
    fd = os.open(quiet_mount.sub / "events", os.O_RDONLY | os.O_NONBLOCK)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(0) == []
        fired = []

        def trigger():
            fired.append(time.monotonic())
            prepare(quiet_mount)

        timer = threading.Timer(0.3, trigger)
        timer.start()
        ready = poller.poll(10_000)
        woke = time.monotonic()
        timer.join()
        assert ready and ready[0][1] & select.POLLIN
        print(f"poll woke {1000 * (woke - fired[0]):.1f} ms after the trigger started")
        line = os.read(fd, 65536)
        assert json.loads(line.splitlines()[0])["event"] == "portion"
    finally:
        os.close(fd)


def test_select_on_a_blocking_descriptor_reports_readable(quiet_mount):
    with open(quiet_mount.sub / "events", "rb", buffering=0) as fh:
        assert select.select([fh], [], [], 0)[0] == []
        prepare(quiet_mount)
        assert select.select([fh], [], [], 10)[0] == [fh]
        assert json.loads(fh.read(65536).splitlines()[0])["event"] == "portion"


def test_a_reader_with_a_small_buffer_gets_lines_in_pieces(quiet_mount):
    fd = os.open(quiet_mount.sub / "events", os.O_RDONLY)
    try:
        prepare(quiet_mount)
        data = b""
        while not data.endswith(b"\n"):
            piece = os.read(fd, 16)
            assert 0 < len(piece) <= 16
            data += piece
    finally:
        os.close(fd)
    assert json.loads(data)["event"] == "portion"


def test_a_reader_that_does_not_read_later_sees_an_overflow_line(quiet_mount, quiet_models):
    model = quiet_models("burst")
    burst = b"read_ahead_kb=64\nread_ahead_kb=65\n" * 100  # 200 lines, 3400 bytes
    fd = os.open(quiet_mount.sub / "events", os.O_RDONLY)
    try:
        produced = 0
        rec = os.open(model / "recommend", os.O_WRONLY)
        try:
            while produced < 11_000:  # EventBus.capacity is 10,000
                assert os.write(rec, burst) == len(burst)
                produced += 400  # 200 accepted + 200 superseded
        finally:
            os.close(rec)
        data = b""
        while not data.endswith(b"\n"):
            data += os.read(fd, 1 << 16)
        first = json.loads(data.splitlines()[0])
        assert first["event"] == "overflow"
        assert first["lost"] > 0
        assert first["subsystem"] == "sim.readahead"
        assert "ts" in first and isinstance(first["seq"], int)
        following = [json.loads(line) for line in data.splitlines()[1:]]
        assert all(e["event"] == "recommendation" for e in following[:10])
    finally:
        os.close(fd)
    assert (quiet_mount.sub / "info").read_text().startswith("{"), "the mount still answers"


def test_fifty_blocked_readers_do_not_stall_the_mount(quiet_mount, quiet_models):
    paths = [quiet_mount.mountpoint / "events", quiet_mount.sub / "events"]
    procs = [popen("cat", str(paths[i % 2])) for i in range(50)]
    try:
        wait_blocked(quiet_mount, 50)
        sub = quiet_mount.sub
        done = sh(f"cat {sub}/info >/dev/null && ls {sub}/dataset >/dev/null && "
                  f"mkdir {sub}/models/crowd && echo start > {sub}/models/crowd/control && "
                  f"cat {sub}/models/crowd/state && rmdir {sub}/models/crowd && "
                  f"cat {quiet_mount.mountpoint}/metrics >/dev/null", timeout=20)
        assert done.returncode == 0, done.stderr
        prepare(quiet_mount)
        wait_for(lambda: all(b"portion" in _peek(p) for p in procs),
                 what="every reader got the portion line")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=5)
    finally:
        end(procs)
    wait_for(lambda: readers(quiet_mount) == 0, what="every reader released")


def _peek(proc: subprocess.Popen) -> bytes:
    """What a cat printed so far (its stdout is a pipe we may read without blocking)."""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    buf = getattr(proc, "_seen", b"")
    try:
        while chunk := os.read(fd, 65536):
            buf += chunk
    except BlockingIOError:
        pass
    proc._seen = buf
    return buf


#: no timed seals here: every portion event comes from a prepare_dataset of the test
TWO_SUBSYSTEMS = two_subsystems(QUIET_CONFIG)


def test_a_subsystem_stream_is_filtered_and_seq_is_global(mount_root):
    m = Mount(mount_root, TWO_SUBSYSTEMS).start()
    try:
        root = m.mountpoint
        with EventStream(root / "events") as everything, \
                EventStream(root / "sim.a/events") as only_a:
            for _ in range(2):
                assert write_errno(root / "sim.b/control", b"prepare_dataset\n") == 0
                assert write_errno(root / "sim.a/control", b"prepare_dataset\n") == 0
            last_a = None
            for _ in range(2):
                last_a = only_a.wait_for(lambda e: e["event"] == "portion", what="a portion")
            everything.wait_for(lambda e: e["seq"] >= last_a["seq"], what="the global stream")
        assert {e["subsystem"] for e in only_a.seen} == {"sim.a"}
        assert {"sim.a", "sim.b"} <= {e["subsystem"] for e in everything.seen}
        seqs = [e["seq"] for e in everything.seen]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        a_seqs = {e["seq"] for e in only_a.seen if e["seq"] <= last_a["seq"]}
        assert a_seqs <= set(seqs), "the global stream has every event of sim.a"
        assert set(range(min(a_seqs), max(a_seqs) + 1)) - a_seqs, "the filtered stream has gaps"
        b_seqs = {e["seq"] for e in everything.seen if e["subsystem"] == "sim.b"}
        assert not a_seqs & b_seqs
    finally:
        m.kill(signal.SIGTERM)


def test_umount_gives_blocked_readers_end_of_file(mount_root):
    m = Mount(mount_root, FAST_CONFIG.replace("seal_seconds = 1.0", "seal_seconds = 3600.0"))
    m.start()
    code = (f"import sys\nf = open({str(m.sub / 'events')!r}, 'rb')\n"
            "while f.read(65536): pass\nprint('eof')\n")
    procs = [popen("cat", str(m.mountpoint / "events")), popen("python3", "-c", code)]
    try:
        wait_for(lambda: readers(m) >= 2, what="readers open")
        done = subprocess.run(mlfs_command("umount", str(m.mountpoint)), capture_output=True,
                              text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
        m.pid = None  # gone: never signal a pid that may be reused
        for proc in procs:
            proc.wait(timeout=10)
        assert procs[0].returncode == 0, procs[0].stderr.read()
        assert procs[1].returncode == 0, procs[1].stderr.read()
        assert "eof" in procs[1].stdout.read()
    finally:
        end(procs)
        m.kill(signal.SIGTERM)
