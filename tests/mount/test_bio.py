"""linux.bio on a real mount: every request fio makes on a loop device is one record."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from mlfs.backends.linux.bio import unavailable

from tests.harness import Mount, sh, wait_for


def device_reads(device: str) -> int:
    """Reads the block layer has completed on `device` (/sys/block/<dev>/stat)."""
    with open(f"/sys/block/{device}/stat") as stat:
        return int(stat.read().split()[0])

CONFIG = """
[mount]
allow_other = true

[store]
seal_seconds = 1.0

[[subsystem]]
backend = "linux.bio"
device = "{device}"
tick_seconds = 0.2
"""


def test_every_request_of_a_fio_run_is_one_record_with_its_latency(mount_root, loop):
    why = unavailable()
    if why:
        pytest.skip(why)
    if shutil.which("fio") is None:
        pytest.skip("fio is missing (bash .ci/setup installs it)")
    m = Mount(mount_root, CONFIG.format(device=loop))
    m.start()
    try:
        sub = m.mountpoint / "linux.bio"
        assert json.loads((sub / "info").read_text())["records"]["latency_us"] == "float64"
        out = mount_root / "fio.json"
        before = device_reads(loop)
        subprocess.run(["fio", "--name=r", f"--filename=/dev/{loop}", "--rw=randread",
                        "--bs=4k", "--iodepth=32", "--ioengine=libaio", "--direct=1",
                        "--number_ios=3000", "--output-format=json", f"--output={out}"],
                       check=True, capture_output=True, timeout=120)
        total = json.loads(out.read_text())["jobs"][0]["read"]["total_ios"]
        assert total == 3000
        completed = device_reads(loop) - before  # the block layer's own count
        assert completed == total  # random 4 KiB reads: nothing merged

        def lost() -> int:
            return json.loads((sub / "info").read_text())["records_lost"]

        def rows():
            assert sh(f"echo prepare_dataset > {sub}/control").returncode == 0
            if not list((sub / "records").glob("*.parquet")):
                return None
            return ds.dataset(str(sub / "records"), format="parquet").to_table()

        # every request is a record, or counted lost: the kernel now and then completes
        # one without running the capture's program (linux.bio's docstring)
        table = wait_for(lambda: (t := rows()) is not None
                         and t.num_rows + lost() >= total and t,
                         timeout=30, what="every request as a record or counted lost")
        reads = table.filter(pc.equal(table.column("op"), "read"))
        assert reads.num_rows + lost() == completed  # exact: none missed, none twice
        assert reads.num_rows >= total - 64  # the kernel's misses are rare
        assert set(reads.column("device").to_pylist()) == {loop}
        assert set(reads.column("bytes").to_pylist()) == {4096}
        assert pc.min(reads.column("latency_us")).as_py() > 0
        assert pc.max(reads.column("queue_depth")).as_py() > 0  # iodepth 32 queues
    finally:
        m.kill(signal.SIGTERM)
    assert m.pid is None or not m.alive()
