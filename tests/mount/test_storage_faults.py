"""Storage faults on a real mount: a full state dir, few descriptors, damage.

Each test makes the fault for real (a small tmpfs filled with a file, a low
RLIMIT_NOFILE set on the running daemon with prlimit, bytes planted in the
state dir while unmounted) and checks what issue 10 promises: the daemon
stays up, writers get the errno, nothing acknowledged is lost.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.harness import EventStream, Mount, fill, new_model, tmpfs, wait_for, write_errno

MODEL_DIR = Path("sim.readahead/models")


def version_answers(m: Mount) -> bool:
    return m.alive() and (m.mountpoint / "version").read_text().strip() != ""


def journal_rows(m: Mount, model: str) -> list[dict]:
    rows: list[dict] = []
    directory = m.state_dir / MODEL_DIR / model / "recommendations"
    for portion in sorted(directory.glob("*.parquet")):
        rows += pq.read_table(portion).to_pylist()
    return rows


@pytest.fixture
def small_state_dir(mount_root):
    """A 2 MiB tmpfs as the state dir of `Mount(mount_root)`."""
    with tmpfs(mount_root / "mnt-state", "2m") as state:
        yield state


def test_a_full_state_dir_is_a_critical_state_not_a_crash_and_loses_nothing(
        small_state_dir, mount_root):
    m = Mount(mount_root).start()
    try:
        model = new_model(m.sub, "full")
        acknowledged: list[str] = []
        refused: list[int] = []

        def recommend(n: int) -> int:
            line = f"read_ahead_kb={64 + n % 512} expect={1000 + n}"
            code = write_errno(model / "recommend", (line + "\n").encode())
            if code == 0:
                acknowledged.append(line)
            else:
                refused.append(code)
            return code

        with EventStream(m.sub / "events") as events:
            for n in range(20):
                assert recommend(n) == 0
                assert write_errno(m.sub / "objective", b"1.5\n") == 0
            filler = fill(small_state_dir)
            n = 20
            # the seal loop finds the full disk within ~50 ms; every writer hears it
            deadline = time.monotonic() + 10
            while recommend(n) != errno.ENOSPC:
                assert time.monotonic() < deadline, f"no ENOSPC, got {refused}"
                n += 1
                time.sleep(0.02)
            emergency = events.wait_for(
                lambda e: e.get("event") == "emergency" and "storage" in e.get("why", ""),
                what="an emergency event naming storage")
            assert "ENOSPC" in emergency["why"]
            assert write_errno(model / "control", b"prepare_dataset\n") == errno.ENOSPC
            assert write_errno(m.sub / "control", b"prepare_dataset\n") == errno.ENOSPC
            for _ in range(20):  # writers and the reader go on; the daemon stays up
                n += 1
                assert recommend(n) in (0, errno.ENOSPC)
                write_errno(m.sub / "objective", b"2.5\n")
                assert version_answers(m)
                time.sleep(0.05)
            assert (model / "mode").read_text().strip() == "emergency"

            filler.unlink()  # space returns: everything resumes by itself
            events.wait_for(lambda e: e.get("event") == "mode" and e.get("from") == "emergency",
                            timeout=30, what="the model leaving emergency")
            wait_for(lambda: recommend(n + 1) == 0, what="recommend accepted again")
            assert write_errno(m.sub / "control", b"prepare_dataset\n") == 0
        assert m.alive()
        assert refused.count(errno.ENOSPC) >= 1
        assert set(refused) <= {errno.ENOSPC, errno.EBUSY}, refused
    finally:
        m.umount()
    m.start()  # replay from the write-ahead files, then seal at umount
    m.umount()
    rows = journal_rows(m, "full")
    accepted = [r["line"] for r in rows if r["status"] == "accepted"]
    assert sorted(accepted) == sorted(acknowledged), "an acknowledged recommendation is lost"
    seqs = [r["seq"] for r in rows]
    assert len(seqs) == len(set(seqs)), "a journal row was sealed twice"


def test_a_ttl_that_cannot_be_sealed_is_refused_at_write_time(shared_mount, shared_models):
    model = shared_models("bigttl")
    line = b"read_ahead_kb=512 ttl=99999999999999999999999\n"
    assert write_errno(model / "recommend", line) == errno.EINVAL
    assert "ttl" in (model / "errors").read_text()
    assert write_errno(model / "recommend", b"read_ahead_kb=512 expect=1_000\n") == errno.EINVAL
    assert write_errno(model / "recommend", b"read_ahead_kb=512 ttl=1000000000\n") == 0
    assert write_errno(model / "control", b"prepare_dataset\n") == 0
    assert shared_mount.alive()


def test_refused_objective_writes_are_counted_and_logged(shared_mount):
    log = shared_mount.state_dir / "mlfs.log"
    assert write_errno(shared_mount.sub / "objective", b"1_000\n") == errno.EINVAL
    assert write_errno(shared_mount.sub / "objective", b"1000\n") == 0
    wait_for(lambda: "objective refused" in log.read_text() and "1_000" in log.read_text(),
             what="a log line for the refused objective")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def nofile(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no Max open files line")


def test_few_file_descriptors_give_a_clear_errno_and_nothing_half_created(mount):
    m = mount
    model = new_model(m.sub, "first")
    assert write_errno(model / "recommend", b"read_ahead_kb=256\n") == 0
    time.sleep(0.3)
    limit = fd_count(m.pid)  # not one descriptor to spare
    soft, hard = nofile(m.pid)  # only the soft limit: raising a hard one back needs a cap
    subprocess.run(["prlimit", "--pid", str(m.pid), f"--nofile={limit}:{hard}"], check=True)
    try:
        codes = []
        for i in range(5):
            try:
                (m.sub / "models" / f"late{i}").mkdir()
                codes.append(0)
            except OSError as exc:
                codes.append(exc.errno)
        assert errno.EIO not in codes and codes.count(errno.EMFILE) >= 1, codes
        assert write_errno(m.sub / "control", b"prepare_dataset\n") == errno.EMFILE
        assert version_answers(m)
        created = {f"late{i}" for i, code in enumerate(codes) if code == 0}
    finally:
        subprocess.run(["prlimit", "--pid", str(m.pid), f"--nofile={soft}:{hard}"], check=True)
    wait_for(lambda: write_errno(m.sub / "control", b"prepare_dataset\n") == 0,
             what="sealing to work again")
    assert (model / "state").read_text().strip() in ("started", "running")
    m.umount()
    m.start()
    assert sorted(os.listdir(m.sub / "models")) == sorted({"first"} | created)
    assert not [p for p in (m.state_dir / MODEL_DIR).iterdir() if p.name.startswith(".")]


def test_damaged_write_ahead_lines_and_counter_do_not_stop_the_mount(mount):
    m = mount
    model = new_model(m.sub, "dmg")
    assert write_errno(model / "recommend", b"read_ahead_kb=256\n") == 0
    assert write_errno(model / "control", b"prepare_dataset\n") == 0
    m.umount()
    dataset = m.state_dir / "sim.readahead" / "dataset"
    journal = m.state_dir / MODEL_DIR / "dmg" / "recommendations"
    (dataset / "wal.999.jsonl").write_bytes(b'[1,2,3]\n{"tick":"abc"}\n')
    (journal / "wal.999.jsonl").write_bytes(b'{"seq":"x"}\n')
    (dataset / "next_portion").write_bytes(b"\xffgarbage")
    m.start()
    assert version_answers(m)
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    assert (dataset / "quarantine" / "wal.999.jsonl").read_bytes() == \
        b'[1,2,3]\n{"tick":"abc"}\n'
    assert (journal / "quarantine" / "wal.999.jsonl").read_bytes() == b'{"seq":"x"}\n'
    log = (m.state_dir / "mlfs.log").read_text()
    assert "quarantined" in log and "next_portion" in log
    assert (dataset / "next_portion.damaged").exists()
    assert write_errno(model / "control", b"prepare_dataset\n") == 0
    numbers = sorted(int(p.name[:10]) for p in dataset.glob("*.parquet"))
    assert numbers == sorted(set(numbers)) and numbers


def test_idle_models_hold_no_file_descriptors(mount_root):
    """1,000 models by mkdir: the daemon's descriptors do not grow with them.

    (Before: 2 per model.)  The state dir is a tmpfs, so the mkdirs' fsyncs
    cost nothing; tests/bench/idle_models.py measures CPU and descriptors with
    2,000 and 3,000 models on disk.
    """
    with tmpfs(mount_root / "mnt-state", "256m"):
        m = Mount(mount_root).start()
        try:
            before = fd_count(m.pid)
            for i in range(1000):
                (m.sub / "models" / f"idle{i}").mkdir()
            time.sleep(0.5)
            after = fd_count(m.pid)
            assert after <= before + 16, f"{before} descriptors before, {after} with 1,000"
            assert version_answers(m)
        finally:
            m.umount()


def test_mkdir_beyond_max_models_gets_enospc(mount_root):
    from tests.harness import FAST_CONFIG

    m = Mount(mount_root, FAST_CONFIG.replace("[mount]\n", "[mount]\nmax_models = 3\n"))
    m.start()
    try:
        for name in ("a", "b", "c"):
            (m.sub / "models" / name).mkdir()
        with pytest.raises(OSError) as refused:
            (m.sub / "models" / "d").mkdir()
        assert refused.value.errno == errno.ENOSPC
        os.rmdir(m.sub / "models" / "a")
        (m.sub / "models" / "d").mkdir()  # room again after an rmdir
        assert sorted(os.listdir(m.sub / "models")) == ["b", "c", "d"]
    finally:
        m.umount()
