"""Fair service (issue 10): unprivileged `events` readers cannot starve root.

Readers are real `cat` and Python processes run as `nobody` and as other
unprivileged uids through setpriv, parked in read(2) on a quiet mount whose
limits are small enough that more readers than `max_tasks` try to park.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess

import pytest

from tests.harness import (
    QUIET_CONFIG,
    REPO,
    Mount,
    metric,
    mlfs_command,
    new_model,
    sh,
    wait_for,
    write_errno,
)

NOBODY_UID = 65534
NOGROUP_GID = 65534
#: an interpreter other users may run (the venv's may live under a 0700 /root)
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"
#: unprivileged uids besides nobody (setpriv takes numbers; no passwd entry needed)
OTHER_UIDS = [61001, 61002, 61003, 61004]

LIMITS = """
[mount]
allow_other = true
max_tasks = 64
events_streams_per_uid = 16
events_streams = 256
events_blocked_reads_per_uid = 10
events_blocked_reads = 32
handles_per_uid = 20
handles = 30
"""
#: the quiet configuration (nothing published unless a test causes it) with the limits
CONFIG = QUIET_CONFIG.replace("[mount]\nallow_other = true\n", LIMITS)


@pytest.fixture(autouse=True)
def _need_setpriv():
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as other users")


@pytest.fixture
def limited(mount_root):
    m = Mount(mount_root, CONFIG).start()
    try:
        yield m
    finally:
        m.kill(signal.SIGTERM)


def as_uid(uid: int, *argv: str) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={NOGROUP_GID}", "--clear-groups", *argv]


def end(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every reader still running, by its pid, and reap it."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=20)


OPENER = """
import os, sys
fds = []
while True:
    try:
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
    except OSError as exc:
        print(len(fds), exc.errno, flush=True)
        break
"""


def test_beyond_the_per_uid_stream_limit_nobody_gets_emfile_at_open(limited):
    events = str(limited.sub / "events")
    done = subprocess.run(as_uid(NOBODY_UID, PYTHON, "-c", OPENER, events),
                          capture_output=True, text=True, timeout=30)
    opened, code = (int(x) for x in done.stdout.split())
    assert (opened, code) == (16, errno.EMFILE), done.stderr
    assert metric(limited, "mlfs_event_opens_refused_total") == 1
    wait_for(lambda: metric(limited, "mlfs_event_readers") == 0, what="nobody's files closed")
    again = subprocess.run(as_uid(NOBODY_UID, PYTHON, "-c", OPENER, events),
                           capture_output=True, text=True, timeout=30)
    assert again.stdout.split() == ["16", str(errno.EMFILE)], "closing gives the slots back"
    fds = [os.open(events, os.O_RDONLY) for _ in range(40)]  # root: no stream limit
    try:
        assert metric(limited, "mlfs_event_readers") == 40
    finally:
        for fd in fds:
            os.close(fd)


def test_parked_unprivileged_readers_leave_root_served_and_umount_prompt(limited):
    model = new_model(limited.sub, "served")
    paths = [limited.sub / "events", limited.mountpoint / "events"]
    uids = [NOBODY_UID] + OTHER_UIDS
    procs: list[subprocess.Popen] = []
    try:
        # 70 readers, more than max_tasks (64): 5 uids x 14, each uid may park 10,
        # all of them together 32; the others get EAGAIN at read and exit
        for i in range(70):
            procs.append(subprocess.Popen(as_uid(uids[i % 5], "cat", str(paths[i % 2])),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        wait_for(lambda: sum(p.poll() is not None for p in procs) == 38, timeout=30,
                 what="38 readers refused")
        assert metric(limited, "mlfs_event_reads_blocked") == 32
        refused = [p for p in procs if p.poll() is not None]
        for proc in refused:
            assert proc.returncode == 1
            assert b"Resource temporarily unavailable" in proc.stderr.read()
        parked = [p for p in procs if p.poll() is None]
        assert len(parked) == 32

        # root is answered while 32 readers park (before the fair service, only at the
        # next event: 2.6-9.8 s); how fast is tests/bench/parked_readers.py's to measure
        done = sh(f"cat {limited.mountpoint}/version", timeout=20)
        assert done.stdout.startswith("mlfs"), done.stderr
        done = sh(f"echo read_ahead_kb=64 > {model}/recommend", timeout=20)
        assert done.returncode == 0, done.stderr

        root_reader = subprocess.Popen(["cat", str(paths[0])], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
        procs.append(root_reader)
        wait_for(lambda: metric(limited, "mlfs_event_reads_blocked") >= 33,
                 what="root parks beyond the others' limit")

        victim = parked[0]
        victim.send_signal(signal.SIGTERM)
        victim.wait(timeout=20)  # a signal still ends a parked reader

        done = subprocess.run(mlfs_command("umount", str(limited.mountpoint)),
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
        for proc in parked[1:] + [root_reader]:
            proc.wait(timeout=10)
            assert proc.returncode == 0, "a parked reader gets end of file at unmount"
    finally:
        end(procs)


def test_a_read_that_may_not_wait_gets_eagain_but_poll_still_works(mount_root):
    """Beyond the limits a blocking read answers EAGAIN; poll holds no task, so it works."""
    code = """
import errno, os, select, sys
fds = [os.open(sys.argv[1], os.O_RDONLY) for _ in range(2)]
poller = select.poll()
poller.register(fds[1], select.POLLIN)
print(len(poller.poll(100)), flush=True)
try:
    os.read(fds[0], 4096)
except OSError as exc:
    print(exc.errno, flush=True)
sys.stdin.readline()
print(len(poller.poll(10000)), os.read(fds[1], 4096).count(b"\\n"), flush=True)
"""
    limits = CONFIG.replace("events_blocked_reads_per_uid = 10", "events_blocked_reads_per_uid = 0")
    m = Mount(mount_root, limits).start()
    proc = subprocess.Popen(as_uid(NOBODY_UID, PYTHON, "-c", code, str(m.sub / "events")),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == ["0"], "nothing to read yet"
        assert proc.stdout.readline().split() == [str(errno.EAGAIN)]
        assert metric(m, "mlfs_event_reads_refused_total") == 1
        assert write_errno(m.sub / "control", b"prepare_dataset\n") == 0
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["1", "1"], "the poller got the portion line"
        assert proc.wait(timeout=10) == 0
    finally:
        end([proc])
        m.kill(signal.SIGTERM)


HOLDER = """
import os, sys
fds = []
try:
    while True:
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
except OSError as exc:
    print(len(fds), exc.errno, flush=True)
sys.stdin.read()  # hold them until the test closes stdin
"""


def hold(uid: int, path) -> tuple[subprocess.Popen, list[int]]:
    """A process of `uid` opening `path` until refused, holding what it got."""
    proc = subprocess.Popen(as_uid(uid, PYTHON, "-c", HOLDER, str(path)), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return proc, [int(x) for x in proc.stdout.readline().split()]


def daemon_descriptors(m: Mount) -> int:
    return len(os.listdir(f"/proc/{m.pid}/fd"))


def test_nobody_holding_many_opens_costs_the_daemon_no_descriptors_and_root_stays_served(
        limited):
    """Red-team pass 2: 1,008 opens of one portion by nobody took the daemon's 1,024
    descriptors; root's recommend and the store got EMFILE and every model went to
    emergency.  Now a portion is one mapping shared by its opens, and every uid but root
    is held to handles_per_uid (EMFILE) and all of them to handles (ENFILE)."""
    model = new_model(limited.sub, "served")
    sh(f"echo prepare_dataset > {limited.sub}/control")
    portion = wait_for(lambda: sorted((limited.sub / "dataset").glob("*.parquet")),
                       what="a portion")[0]
    before = daemon_descriptors(limited)
    holders = []
    try:
        proc, got = hold(NOBODY_UID, portion)
        holders.append(proc)
        assert got == [20, errno.EMFILE]
        assert daemon_descriptors(limited) <= before + 1, "one mapping, not 20 descriptors"
        proc, got = hold(OTHER_UIDS[0], limited.mountpoint / "metrics")
        holders.append(proc)
        assert got == [10, errno.ENFILE], "30 for every uid but root together"
        assert metric(limited, "mlfs_file_opens_refused_total") == 2
        assert write_errno(model / "recommend", "read_ahead_kb=512\n") == 0
        assert (model / "mode").read_text().strip() != "emergency"
        fds = [os.open(portion, os.O_RDONLY) for _ in range(40)]  # root: no limit
        for fd in fds:
            os.close(fd)
    finally:
        for proc in holders:
            proc.stdin.close()
            proc.wait(timeout=20)
    proc, got = hold(NOBODY_UID, portion)
    proc.stdin.close()
    proc.wait(timeout=20)
    assert got == [20, errno.EMFILE], "closing gives the slots back"
