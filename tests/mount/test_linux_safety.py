"""A real Linux backend through a real mount: what is changed is put back.

A mount serves `linux.block` on a loop device made for the test, with
read_ahead_kb allowed; a model's recommendation reaches the device's queue;
stopping the model restores the original; the daemon killed with SIGKILL
leaves it, and the next mount (observe-only this time: recovery must not
depend on being allowed to apply) restores it before it is ready; `mlfs
umount` and SIGTERM restore it too.  Nothing outside the loop device
is written.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.harness import APPLY, BLOCK_CONFIG, Mount, ledger, read_ahead, recommend, sh, wait_for


def test_sigkill_then_next_mount_restores_the_original(mount_root: Path, loop: str) -> None:
    original = read_ahead(loop)
    m = Mount(mount_root, BLOCK_CONFIG.format(device=loop, apply=APPLY))
    m.start()
    try:
        recommend(m, loop, 1024)
        wait_for(lambda: read_ahead(loop) == "1024", what="the recommendation applied")
        [entry] = ledger(m)
        assert entry["original"] == original
        m.kill(signal.SIGKILL)  # no restore, no seal
        assert [e["original"] for e in ledger(m)] == [original]

        again = Mount(mount_root, BLOCK_CONFIG.format(device=loop, apply=""))
        again.start()
        try:
            assert read_ahead(loop) == original  # restored before the mount was ready
            assert ledger(again) == []
            info = json.loads((again.mountpoint / f"linux.block.{loop}" / "info").read_text())
            assert "observe-only" in info["description"]
        finally:
            again.kill(signal.SIGTERM)
        assert read_ahead(loop) == original
    finally:
        m.kill(signal.SIGTERM)


@pytest.mark.parametrize("ending", ["umount", "sigterm"])
def test_stop_and_unmount_restore_the_original(mount_root: Path, loop: str,
                                               ending: str) -> None:
    original = read_ahead(loop)
    m = Mount(mount_root, BLOCK_CONFIG.format(device=loop, apply=APPLY))
    m.start()
    try:
        model = recommend(m, loop, 2048)
        wait_for(lambda: read_ahead(loop) == "2048", what="the recommendation applied")
        assert sh(f"echo stop > {model}/control").returncode == 0
        # release() restores at once; a tick already past its decision may still
        # write the old recommendation once, and the next (default) tick undoes it
        wait_for(lambda: read_ahead(loop) == original, what="restored on stop")

        done = sh(f"echo start > {model}/control && echo read_ahead_kb=2048 > {model}/recommend")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: read_ahead(loop) == "2048", what="applied again after start")
        if ending == "umount":
            done = m.umount()
            assert done.returncode == 0, done.stdout + done.stderr
        else:
            m.kill(signal.SIGTERM)
        assert read_ahead(loop) == original
        assert ledger(m) == []
    finally:
        m.kill(signal.SIGTERM)
    assert not os.path.ismount(m.mountpoint)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet: either way it runs no more."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_traced_device_serves_request_features_and_its_tracer_dies_with_the_daemon(
        mount_root: Path, loop: str) -> None:
    from mlfs.backends.blktrace import TRACE_FEATURES, tracer_unavailable

    why = tracer_unavailable()
    if why:
        pytest.skip(f"block tracepoints: {why}")
    import duckdb

    config = BLOCK_CONFIG.format(device=loop, apply="tracepoints = true")
    m = Mount(mount_root, config)
    m.start()
    try:
        sub = m.mountpoint / f"linux.block.{loop}"
        info = json.loads((sub / "info").read_text())
        assert set(TRACE_FEATURES) <= set(info["features"])
        assert "traced" in info["description"]
        [tracer] = [p for p in children(m.pid)
                    if Path(f"/proc/{p}/comm").read_text().strip() == "blkreq"]
        # a sequential stream of direct reads, for a few ticks
        done = sh(f"dd if=/dev/{loop} of=/dev/null bs=64k count=1024 iflag=direct status=none")
        assert done.returncode == 0, done.stderr

        def sequential_rows() -> int:
            if not any((sub / "dataset").glob("*.parquet")):
                return 0
            [(count,)] = duckdb.sql(
                f"SELECT count(*) FROM '{sub}/dataset/*.parquet' "
                "WHERE trace_seq_share > 0.9 AND trace_read_kb BETWEEN 60 AND 68").fetchall()
            return count

        wait_for(lambda: sequential_rows() > 0,
                 what="a sealed row with the dd stream's trace features")
        m.kill(signal.SIGKILL)
        wait_for(lambda: ended(tracer), what="the capture ended with its daemon")
    finally:
        m.kill(signal.SIGTERM)
