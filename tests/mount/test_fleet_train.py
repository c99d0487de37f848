"""`mlfs fleet train`: rows pushed by real mounts, trained on LocalCluster and on a real
`dask scheduler` / `dask worker` cluster (separate processes on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlfs.trainers.learner import KnobLearner

from mlfs.core.verifier import verify
from tests.conftest import FAST_CONFIG, REPO, Mount, fuse_unavailable, mlfs_command, wait_for

pytestmark = pytest.mark.mount

DASK = str(Path(sys.executable).with_name("dask"))


@pytest.fixture(scope="module")
def fleet_store():
    """Two hosts (seeds 1 and 2) ran ~6 s each and pushed once; the mounts are gone."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mlfs-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    store = root / "store"
    hosts = []
    mounts = [Mount(root, config=FAST_CONFIG.replace("seed = 1", f"seed = {i}"), name=f"h{i}")
              for i in (1, 2)]
    try:
        for m in mounts:
            m.start()
        for m in mounts:
            wait_for(lambda m=m: len(list((m.sub / "dataset").glob("*.parquet"))) >= 5,
                     timeout=60, what="5 portions")
            done = subprocess.run(
                mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                             "--state-dir", str(m.state_dir), "--once"),
                capture_output=True, text=True, timeout=60, cwd=REPO)
            assert done.returncode == 0, done.stderr
            hosts.append((m.mountpoint / "host").read_text().strip())
        info = json.loads((mounts[0].sub / "info").read_text())
    finally:
        for m in mounts:
            m.kill(signal.SIGTERM)
    yield store, hosts, info
    shutil.rmtree(root, ignore_errors=True)


def train(store: Path, *extra: str) -> dict:
    done = subprocess.run(
        mlfs_command("fleet", "train", "--store", str(store), "--subsystem", "sim.readahead",
                     "--json", *extra),
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def check_published(store: Path, card: dict, hosts: list[str], info: dict) -> None:
    folder = store / "policies" / "sim.readahead"
    text = (folder / f"{card['version']:010d}.txt").read_text()
    assert json.loads((folder / f"{card['version']:010d}.json").read_text()) == card
    assert hashlib.sha256(text.encode()).hexdigest() == card["sha256"]
    verify(text)  # the daemon's own check
    columns = KnobLearner(info).columns  # the local learner's columns, in its order
    assert f"feature_names={' '.join(columns)}\n" in text
    assert sorted(card["hosts"]) == sorted(hosts) and card["rows"] == sum(card["hosts"].values())
    assert card["rows"] > 200
    # validation on machines the model never saw: one error per held-out host
    assert sorted(card["validation"]["mae_per_host"]) == sorted(hosts)
    assert card["validation"]["mae"] > 0
    assert set(card["feature_importance_gain"]) == set(columns)
    assert card["time_range"][0] < card["time_range"][1]


def test_local_cluster_publishes_a_verified_policy_and_its_card(fleet_store):
    store, hosts, info = fleet_store
    card = train(store)
    assert card["scheduler"].startswith("LocalCluster")
    check_published(store, card, hosts, info)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_scheduler_and_worker_processes_train_and_publish_the_next_version(
        fleet_store, tmp_path):
    store, hosts, info = fleet_store
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    log = open(tmp_path / "dask.log", "ab")  # noqa: SIM115  (closed in finally)
    # the scheduler and workers unpickle mlfs's functions: this checkout's mlfs, as a
    # real cluster needs mlfs installed on every worker (docs/fleet.md)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        procs.append(subprocess.Popen(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            stdout=log, stderr=log, cwd=REPO, env=env))
        for _ in range(2):
            procs.append(subprocess.Popen(
                [DASK, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                 "--host", "127.0.0.1"], stdout=log, stderr=log, cwd=REPO, env=env))
        wait_for(lambda: (tmp_path / "dask.log").read_text().count(
            "Register worker") >= 2, timeout=60, what="two workers registered")
        before = len(list((store / "policies" / "sim.readahead").glob("*.json"))) \
            if (store / "policies").exists() else 0
        card = train(store, "--scheduler", address)
        assert card["scheduler"] == address and card["version"] == before + 1
        check_published(store, card, hosts, info)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
