"""The anomaly kind across a fleet: two sim.disks hosts push their records, one forest is
trained from both on a real Dask scheduler and workers, published signed, and a new
host's `mlfs train --kind anomaly --fleet` starts from it (push, train, pull)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from mlfs.core.models.kinds.anomaly.forest import verify_forest
from tests.dask_cluster import dask_cluster
from tests.harness import REPO, Mount, mlfs_command, new_mount_root, sim_disks_config, wait_for
from tests.mount.test_fleet_predictors import disks_store  # noqa: F401  (the pushed hosts)

pytestmark = pytest.mark.mount


def test_a_fleet_forest_is_trained_on_workers_and_a_new_host_starts_from_it(
        disks_store, tmp_path):  # noqa: F811
    from mlfs.client import end_process
    from mlfs.fleet.signing import keygen

    store, info = disks_store
    assert "anomaly" in info["kinds"]
    key = tmp_path / "fleet.key"
    keygen(key)
    with dask_cluster(tmp_path) as address:  # the operator's command line, --kind anomaly
        done = subprocess.run(
            mlfs_command("fleet", "train", "--store", str(store), "--subsystem", "sim.disks",
                         "--kind", "anomaly", "--scheduler", address, "--folds", "1",
                         "--key", str(key), "--json", "--quiet"),
            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    card = json.loads(done.stdout)
    refused = subprocess.run(  # a kind the hosts do not serve: one line, nothing published
        mlfs_command("fleet", "train", "--store", str(store), "--subsystem", "sim.disks",
                     "--kind", "knob", "--quiet"),
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "mlfs fleet train: sim.disks: the subsystem serves predictor, anomaly, not knob"]
    assert card["kind"] == "anomaly" and card["target"] == "failure"
    assert len(card["hosts"]) == 2 and card["judged"]["events"] >= 3
    assert list(card["validation"]["per_host"]) == sorted(card["hosts"])[:1]
    text = (store / "policies" / "sim.disks" / f"{card['version']:010d}.txt").read_text()
    forest = verify_forest(text.encode())  # what the daemon runs
    assert forest.alert_score == card["alert_score"] and forest.trees == 100
    # pull: a new host's trainer installs the signed fleet forest before its own
    root = new_mount_root()
    host = Mount(root, config=sim_disks_config(seed=9, drives=200), name="new9")
    log_path = tmp_path / "train.log"
    trainer = None
    try:
        host.start()
        with open(log_path, "wb") as log:
            trainer = subprocess.Popen(
                mlfs_command("train", str(host.mountpoint), "sim.disks", "--kind", "anomaly",
                             "--model", "iso", "--fleet", str(store), "--trusted-key",
                             f"{key}.pub", "--max-seconds", "120"),
                stdout=log, stderr=log, cwd=REPO)
        policy = Path(host.mountpoint / "sim.disks" / "models" / "iso" / "policy")
        wait_for(lambda: policy.exists() and policy.read_text() == text, timeout=120,
                 what="the fleet forest as the new host's policy")
        assert (policy.parent / "kind").read_text() == "anomaly\n"
    finally:
        if trainer is not None:
            end_process(trainer)
        host.kill(signal.SIGTERM)
    logged = log_path.read_text()
    assert f"starting from fleet policy {card['version']} " in logged
    assert "refused" not in logged and "Traceback" not in logged
    json.dumps(card)  # the card is plain JSON


def test_a_forest_card_is_refused_unless_the_forest_verifies(tmp_path):
    """publish verifies by the card's kind: a broken forest is never published."""
    from mlfs.base.errors import Refused
    from mlfs.fleet.store import Store
    from mlfs.fleet.train import publish

    with pytest.raises(Refused):
        publish(Store(str(tmp_path / "store")), "sim.disks", '{"format": "x"}',
                {"kind": "anomaly"})
    assert not (tmp_path / "store" / "policies").exists()
