"""The fleet on a store that is not a directory, and the pusher as its unit runs it.

* S3 against a real moto server on this machine: two mounts push, a real `dask
  scheduler` and workers train and publish a signed policy into the bucket, `fleet
  status` and `fleet report` read it, and a third mount pulls the policy from it.
* `mlfs fleet push --once` under `setpriv --bounding-set=-all` (what
  mlfs-fleet-push@.service allows: uid 0, no capability) ships a real mount.
* Red-team F11 end to end: links another store writer planted at a manifest's old
  temporary name and at the status object never make the root pusher write through.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid

import pytest

from mlfs.client import end_process
from mlfs.fleet.signing import keygen
from mlfs.fleet.store import Store
from tests.dask_cluster import dask_cluster
from tests.harness import (
    FAST_CONFIG,
    REPO,
    Mount,
    exploring_mounts,
    mlfs_command,
    wait_for,
)
from tests.moto_s3 import new_bucket

pytestmark = pytest.mark.mount

#: a policy upload's upper bound (the daemon checks a policy importing LightGBM in a
#: subprocess; slow on a shared machine), as in test_fleet_train.py
UPLOAD_SECONDS = 300


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command(*args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_push_train_report_and_pull_round_trip_on_s3(s3_endpoint, mount_root, tmp_path):
    url = new_bucket(f"fleet-{uuid.uuid4().hex[:12]}") + "/fleet"
    key = tmp_path / "fleet.key"
    keygen(key)
    hosts = []
    with exploring_mounts(mount_root, (1, 2)) as mounts:
        for m in mounts:
            done = run("fleet", "push", str(m.mountpoint), "--store", url, "--state-dir",
                       str(m.state_dir), "--once", timeout=120)
            assert done.returncode == 0, done.stderr
            hosts.append((m.mountpoint / "host").read_text().strip())
    store = Store(url)
    assert sorted(store.list("claims/")) == sorted(f"claims/{h}.json" for h in hosts)
    assert sorted(store.list("manifests/")) == sorted(f"manifests/{h}.json" for h in hosts)
    status = json.loads(run("fleet", "status", "--store", url, "--json").stdout)
    assert sorted(status["subsystems"]["sim.readahead"]) == sorted(hosts)

    with dask_cluster(tmp_path) as address:
        done = run("fleet", "train", "--store", url, "--subsystem", "sim.readahead", "--json",
                   "--key", str(key), "--scheduler", address)
    assert done.returncode == 0, done.stderr[-3000:]
    card = json.loads(done.stdout)
    assert card["version"] == 1 and sorted(card["hosts"]) == sorted(hosts)
    text = store.get("policies/sim.readahead/0000000001.txt").decode()
    assert json.loads(store.get("policies/sim.readahead/0000000001.json")) == card

    report = run("fleet", "report", "--store", url, "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["subsystems"]["sim.readahead"]["hosts"] == 2

    m = Mount(mount_root, config=FAST_CONFIG.replace("seed = 1", "seed = 3"), name="new")
    worker = None
    try:
        m.start()
        with open(tmp_path / "new-train.log", "ab") as log:
            worker = subprocess.Popen(
                mlfs_command("train", str(m.mountpoint), "sim.readahead", "--fleet", url,
                             "--trusted-key", f"{key}.pub", "--max-seconds",
                             str(UPLOAD_SECONDS)),
                stdout=log, stderr=log, cwd=REPO)
        policy = m.sub / "models" / "lgbm" / "policy"
        wait_for(lambda: policy.exists() and policy.read_text() == text,
                 timeout=UPLOAD_SECONDS, interval=0.05,
                 what="the fleet policy from S3 uploaded to the local model")
    finally:
        if worker is not None:
            end_process(worker)
        m.kill(signal.SIGTERM)
    assert "starting from fleet policy 1 " in (tmp_path / "new-train.log").read_text()


def test_the_pusher_ships_with_no_capability_as_its_unit_runs_it(mount_root, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop capabilities")
    store = tmp_path / "store"
    m = Mount(mount_root)
    try:
        m.start()
        wait_for(lambda: len(list((m.sub / "dataset").glob("*.parquet"))) >= 2, timeout=60,
                 what="two portions")
        done = subprocess.run(
            ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
             *mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                           "--state-dir", str(m.state_dir), "--once")],
            capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr
    finally:
        m.kill(signal.SIGTERM)
    assert list(store.glob("subsystem=sim.readahead/host=*/kind=dataset/*.parquet"))


def test_links_planted_in_the_store_never_make_the_root_pusher_write_through(
        mount_root, tmp_path):
    store = tmp_path / "store"
    victims = {name: tmp_path / f"victim-{name}" for name in ("temp", "status")}
    for victim in victims.values():
        victim.write_text("root's file\n")
        victim.chmod(0o600)
    m = Mount(mount_root)
    try:
        m.start()
        host = (m.mountpoint / "host").read_text().strip()
        (store / "manifests").mkdir(parents=True)
        (store / "status").mkdir()
        os.symlink(victims["temp"], store / "manifests" / f".{host}.json.tmp")
        os.symlink(victims["status"], store / "status" / f"{host}.json")
        wait_for(lambda: len(list((m.sub / "dataset").glob("*.parquet"))) >= 2, timeout=60,
                 what="two portions")
        done = run("fleet", "push", str(m.mountpoint), "--store", str(store), "--state-dir",
                   str(m.state_dir), "--once", timeout=120)
    finally:
        m.kill(signal.SIGTERM)
    for victim in victims.values():
        assert victim.read_text() == "root's file\n"
        assert oct(victim.stat().st_mode)[-3:] == "600"
    assert done.returncode == 0, done.stderr  # the portions and the manifest shipped
    assert f"status/{host}.json is a symbolic link: refused" in done.stderr  # logged
    manifest = store / "manifests" / f"{host}.json"
    assert not manifest.is_symlink() and json.loads(manifest.read_text())["host_id"] == host
