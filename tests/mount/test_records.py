"""Record datasets through a real mount: many rows per tick, sealed, read by DuckDB and
pyarrow, and nothing lost across a SIGKILL."""

from __future__ import annotations

import json
import os
import signal

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from tests.harness import Mount, sh, wait_for

DISKS_CONFIG = """
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0

[[subsystem]]
backend = "sim.disks"
name = "sim.disks"
seed = 4
drives = 300
tick_seconds = 0.05
"""


def _records(mount: Mount):
    return ds.dataset(str(mount.mountpoint / "sim.disks" / "records"), format="parquet")


def test_a_record_source_publishes_one_row_per_drive_and_day(mount_root):
    mount = Mount(mount_root, DISKS_CONFIG)
    mount.start()
    try:
        sub = mount.mountpoint / "sim.disks"
        info = json.loads((sub / "info").read_text())
        assert info["records"]["drive_id"] == "uint32" and info["records_lost"] == 0
        assert sh(f"echo prepare_dataset > {sub}/control").returncode == 0
        wait_for(lambda: list((sub / "records").glob("*.parquet")), what="a records portion")
        table = _records(mount).to_table()
        assert table.num_rows >= 300 and table.num_rows % 300 == 0
        per_tick = duckdb.sql(
            f"SELECT tick, count(*) AS n, count(DISTINCT drive_id) AS d FROM "
            f"'{sub}/records/*.parquet' GROUP BY tick").fetchall()
        assert all(n == 300 and d == 300 for _, n, d in per_tick)
        seq = sorted(table.column("record_seq").to_pylist())
        assert seq == list(range(len(seq)))
    finally:
        mount.kill(signal.SIGTERM)


def test_records_pending_at_a_sigkill_come_back_numbered_after_the_last(mount_root):
    mount = Mount(mount_root, DISKS_CONFIG.replace("seal_seconds = 1.0", "seal_seconds = 3600"))
    mount.start()
    try:
        sub = mount.mountpoint / "sim.disks"
        wait_for(lambda: json.loads((sub / "info").read_text()) and
                 any(mount.state_dir.glob("sim.disks/records/wal.*.arrows")),
                 what="records in the write-ahead file")
        wait_for(lambda: sum(p.stat().st_size for p in
                             mount.state_dir.glob("sim.disks/records/wal.*.arrows")) > 50_000,
                 what="a few ticks of records written ahead")
        os.kill(mount.pid, signal.SIGKILL)
        wait_for(lambda: not mount.alive(), what="the daemon gone")
        # what the killed daemon left: each write-ahead file one Arrow IPC stream, a batch
        # per tick appended flush after flush (at most its last message torn by the kill)
        batches = 0
        for wal in mount.state_dir.glob("sim.disks/records/wal.*.arrows"):
            try:
                for batch in pa.ipc.open_stream(wal.read_bytes()):
                    assert batch.num_rows == 300
                    batches += 1
            except pa.ArrowInvalid:
                pass  # a torn last message: the write the kill interrupted
        assert batches >= 2
        mount.pid = None
        mount.clear_mount()  # what the kill left mounted ("already mounted" otherwise)
        mount.start()
        assert sh(f"echo prepare_dataset > {sub}/control").returncode == 0
        wait_for(lambda: list((sub / "records").glob("*.parquet")), what="a records portion")
        table = _records(mount).to_table()
        seq = sorted(table.column("record_seq").to_pylist())
        assert seq == list(range(len(seq)))  # nothing lost, nothing numbered twice
        assert len(seq) >= 300 * 3
    finally:
        mount.kill(signal.SIGTERM)
