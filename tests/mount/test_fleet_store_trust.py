"""The fleet store trusts nothing it did not check: a cloned host id is refused before it
writes, damaged manifests are ignored, rows under another host's name are not read."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

from mlfs.fleet.manifest import consistent, objects
from mlfs.fleet.store import Store
from tests.harness import FAST_CONFIG, Mount, mlfs_command, sh, wait_for

SAME_ID = FAST_CONFIG.replace("[mount]\n", '[mount]\nhost_id = "cloned"\n')


def push(m: Mount, store) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command("fleet", "push", str(m.mountpoint), "--store",
                                       str(store), "--state-dir", str(m.state_dir), "--once"),
                          capture_output=True, text=True, timeout=120)


def sealed(m: Mount) -> None:
    assert sh(f"echo prepare_dataset > {m.sub}/control").returncode == 0
    wait_for(lambda: list((m.sub / "dataset").glob("*.parquet")), what="a portion")


def test_a_second_state_directory_pushing_as_the_same_host_is_refused(mount_root):
    store = mount_root / "store"
    a, b = Mount(mount_root, SAME_ID, name="a"), Mount(mount_root, SAME_ID, name="b")
    try:
        for m in (a, b):
            m.start()
            sealed(m)
        assert push(a, store).returncode == 0
        before = {p: p.read_bytes() for p in store.rglob("*.parquet")}
        manifest = (store / "manifests" / "cloned.json").read_bytes()
        done = push(b, store)
        assert done.returncode == 2 and done.stderr.count("\n") == 1
        assert "host id cloned is claimed in the store" in done.stderr
        assert {p: p.read_bytes() for p in store.rglob("*.parquet")} == before
        assert (store / "manifests" / "cloned.json").read_bytes() == manifest
        assert push(a, store).returncode == 0  # the claim's owner goes on
    finally:
        for m in (a, b):
            m.kill(signal.SIGTERM)


def test_damaged_manifests_and_rows_under_another_hosts_name_are_ignored(mount_root):
    store = mount_root / "store"
    m = Mount(mount_root)
    try:
        m.start()
        sealed(m)
        # a second portion: the victim's manifest then names an object the copy under
        # host=evil lacks, which `fleet status` once opened and died on (ENOENT)
        assert sh(f"echo prepare_dataset > {m.sub}/control").returncode == 0
        wait_for(lambda: len(list((m.sub / "dataset").glob("*.parquet"))) >= 2,
                 what="a second portion")
        assert push(m, store).returncode == 0
    finally:
        m.kill(signal.SIGTERM)
    victim = json.loads(next((store / "manifests").glob("*.json")).read_text())["host_id"]
    good = objects(Store(str(store)), "sim.readahead", "dataset")
    assert good
    manifests = store / "manifests"
    (manifests / "broken.json").write_text("{not json")
    (manifests / "letters.json").write_text(json.dumps(
        {"host_id": "letters", "sources": {"x": {"subsystem": "sim.readahead",
                                                 "kind": "dataset", "ranges": [["a", 3]]}}}))
    (manifests / "huge.json").write_text(json.dumps(
        {"host_id": "huge", "sources": {"x": {"subsystem": "sim.readahead", "kind": "dataset",
                                              "ranges": [[0, 10000000000]]}}}))
    (manifests / "escape.json").write_text(json.dumps(
        {"host_id": "escape", "sources": {"x": {"subsystem": "../../etc", "kind": "dataset",
                                                "ranges": [[1, 1]]}}}))
    # a victim's portion copied under host=evil with the victim's rows and a huge objective
    evil = store / "subsystem=sim.readahead" / "host=evil" / "kind=dataset"
    evil.mkdir(parents=True)
    source = next(p for p in store.rglob("*.parquet") if "host=" + victim in str(p))
    table = pq.read_table(source)
    table = table.set_column(table.schema.get_field_index("objective"), "objective",
                             pa.array([1e12] * table.num_rows))
    pq.write_table(table, evil / "0000000001.parquet")
    shutil.copy(manifests / f"{victim}.json", manifests / "evil.json")
    body = json.loads((manifests / "evil.json").read_text())
    (manifests / "evil.json").write_text(json.dumps(dict(body, host_id="evil")))
    listed = objects(Store(str(store)), "sim.readahead", "dataset")  # never crashes
    assert any("host=evil" in p for p in listed)
    kept = consistent(Store(str(store)), listed)
    assert not any("host=evil" in p for p in kept) and set(good) <= set(kept)
    done = subprocess.run(mlfs_command("fleet", "status", "--store", str(store), "--json"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
