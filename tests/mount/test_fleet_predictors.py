"""`mlfs fleet train` of a predictor: sim.disks' drive-days from two hosts, trained on a
real Dask scheduler and workers, calibrated, and its stages and dashboard shown.

A module of its own (the knob rounds are tests/mount/test_fleet_train.py), so that the
two run on different pytest-xdist workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import lightgbm
import numpy as np
import pyarrow.parquet as pq
import pytest

from mlfs.base.verifier import verify
from tests.dask_cluster import dask_cluster, free_port
from tests.harness import (
    REPO,
    Mount,
    fleet_push_once,
    mlfs_command,
    new_mount_root,
    sim_disks_config,
    wait_for,
)

pytestmark = pytest.mark.mount


#: days of 1,000 drives each host ships (about 33 failures over both hosts); the hosts
#: run ~50 days a second and seal a record portion a second, so this is ~8 portions
DISK_DAYS = 400


def days_sealed(mount: Mount) -> int:
    """The newest day in the host's sealed record portions (0 before the first)."""
    portions = sorted((mount.mountpoint / "sim.disks" / "records").glob("*.parquet"))
    if not portions:
        return 0
    return pq.read_table(portions[-1], columns=["tick"])["tick"].to_numpy().max()


@pytest.fixture(scope="module")
def disks_store():
    """Two sim.disks hosts (seeds 1 and 2, 1,000 drives) that ran `DISK_DAYS` days and
    pushed their records once; the mounts are gone."""
    root = new_mount_root()
    store = root / "store"
    mounts = [Mount(root, config=sim_disks_config(seed=i, drives=1000), name=f"d{i}")
              for i in (1, 2)]
    try:
        for m in mounts:
            m.start()
        wait_for(lambda: min(days_sealed(m) for m in mounts) >= DISK_DAYS, timeout=120,
                 what=f"{DISK_DAYS} days sealed on each host")
        for m in mounts:
            fleet_push_once(m, store, timeout=120)
        info = json.loads((mounts[0].mountpoint / "sim.disks" / "info").read_text())
    finally:
        for m in mounts:
            m.kill(signal.SIGTERM)
    yield store, info
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def new_host_training(seed: int, store: Path, key: Path, log_path: Path,
                      seconds: int) -> Iterator[tuple[Mount, subprocess.Popen]]:
    """A new sim.disks host of 200 drives (its first failure far off) with `mlfs train
    --fleet STORE --trusted-key KEY.pub` running on it, its output in `log_path`; both
    ended, the trainer by its pid, when the block leaves."""
    from mlfs.client import end_process

    root = new_mount_root()
    host = Mount(root, config=sim_disks_config(seed=seed, drives=200), name=f"new{seed}")
    trainer = None
    try:
        host.start()
        with open(log_path, "wb") as log:
            trainer = subprocess.Popen(
                mlfs_command("train", str(host.mountpoint), "sim.disks", "--fleet", str(store),
                             "--trusted-key", f"{key}.pub", "--max-seconds", str(seconds)),
                stdout=log, stderr=log, cwd=REPO)
        yield host, trainer
    finally:
        if trainer is not None:
            end_process(trainer)
        host.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def stage_lines(stderr: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in stderr.splitlines()
            if re.match(r"mlfs fleet train [0-9.]+ s: ", line)]


def test_a_fleet_predictor_is_trained_on_real_workers_calibrated_and_says_its_stages(
        disks_store, tmp_path):
    from mlfs.base.verifier import gives_probability
    from mlfs.core.models.kinds.predictor.inputs import PredictionPolicy

    store, info = disks_store
    with dask_cluster(tmp_path) as address:
        done = subprocess.run(
            mlfs_command("fleet", "train", "--store", str(store), "--subsystem", "sim.disks",
                         "--scheduler", address, "--folds", "1", "--json"),
            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    card = json.loads(done.stdout)
    assert card["kind"] == "predictor" and card["target"] == "failure"
    assert len(card["hosts"]) == 2 and card["positives"] >= 20
    assert 0 < card["negative_rate"] < 1
    assert card["validation"]["log_loss"] > 0
    assert list(card["validation"]["log_loss_per_host"]) == sorted(card["hosts"])[:1]
    text = (store / "policies" / "sim.disks" / f"{card['version']:010d}.txt").read_text()
    assert gives_probability(verify(text))
    # a mount's proxy takes it, window features and all
    policy = PredictionPolicy(text.encode(), info["records"])
    assert policy.windows == card["window_features"] and "errors_delta_1d__first60" in \
        policy.windows
    # calibrated: the fleet-wide down-sampling is undone in the first tree, so the mean
    # probability is the positive rate, not about 1/51
    rows = pq.read_table(sorted((store / "subsystem=sim.disks").glob(
        "host=*/kind=records/*.parquet"))[-1]).to_pandas()
    columns = {n: rows[n].to_numpy() for n in rows.columns}
    from mlfs.abi import window_features
    columns.update(window_features(columns["drive_id"], columns["tick"], columns,
                                   policy.windows))
    p = lightgbm.Booster(model_str=text).predict(
        np.column_stack([columns[n] for n in policy.feature_names]))
    assert p.mean() < 0.01
    lines = stage_lines(done.stderr)
    assert lines[0].startswith(f"cluster: {address}")
    portions = [line for line in lines if line.startswith("portions read ")]
    total = portions[-1].split("/")[1]
    assert portions[-1] == f"portions read {total}/{total}" and int(total) >= 2 * 2
    rest = [line.split(":")[0] for line in lines[len(portions) + 1:]]
    assert rest == ["alignment", "fold 1/1", "fit"], lines


def test_dashboard_serves_http_on_the_address_given_while_training(disks_store):
    store, _ = disks_store
    port = free_port()
    trainer = subprocess.Popen(
        mlfs_command("fleet", "train", "--store", str(store), "--subsystem", "sim.disks",
                     "--folds", "1", "--dashboard", f"127.0.0.1:{port}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        def status() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status",
                                            timeout=5) as answer:
                    return answer.read().decode() if answer.status == 200 else None
            except OSError:
                assert trainer.poll() is None, "fleet train ended before its dashboard served"
                return None

        page = wait_for(status, timeout=120, interval=0.2, what="the dashboard's /status")
        assert "bokeh" in page.lower()
        out, err = trainer.communicate(timeout=600)
    finally:
        if trainer.poll() is None:
            os.kill(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert trainer.returncode == 0, err[-3000:]
    assert f"dashboard http://127.0.0.1:{port}/status" in stage_lines(err)[0]
    assert out.startswith("mlfs fleet train: published sim.disks policy ")


def test_a_new_host_starts_from_the_signed_fleet_predictor(disks_store, tmp_path):
    """`mlfs train --fleet` on a predictor subsystem: the fleet predictor a trusted key
    signed is the new host's policy before it has seen a failure of its own."""
    store, _ = disks_store
    key = tmp_path / "fleet.key"
    made = subprocess.run(mlfs_command("fleet", "keygen", str(key)), capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert made.returncode == 0, made.stderr
    done = subprocess.run(
        mlfs_command("fleet", "train", "--store", str(store), "--subsystem", "sim.disks",
                     "--folds", "0", "--key", str(key), "--json"),
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    card = json.loads(done.stdout)
    expected = (store / "policies" / "sim.disks" / f"{card['version']:010d}.txt").read_text()
    log_path = tmp_path / "train.log"
    with new_host_training(7, store, key, log_path, 120) as (host, _):
        policy = host.mountpoint / "sim.disks" / "models" / "lgbm" / "policy"
        wait_for(lambda: policy.exists() and policy.read_text() == expected, timeout=120,
                 interval=0.05, what="the fleet predictor as the new host's policy")
    log = log_path.read_text()
    assert f"starting from fleet policy {card['version']} " in log
    assert "the fleet predictor uploaded as the policy" in log


def test_a_fleet_policy_the_proxy_refuses_leaves_the_trainer_training_alone(tmp_path):
    """A signed fleet policy that is no predictor (a regression, a knob model's kind) is
    refused by the new host's proxy: the trainer says so in one line and trains alone."""
    from mlfs.fleet.signing import keygen
    from mlfs.fleet.store import Store
    from mlfs.fleet.train import publish

    rng = np.random.default_rng(0)
    x = rng.random((200, 2))
    regression = lightgbm.train(
        {"objective": "regression", "verbose": -1, "num_leaves": 4},
        lightgbm.Dataset(x, label=x[:, 0], feature_name=["read_latency_ms", "errors"]),
        num_boost_round=3).model_to_string()
    store = tmp_path / "store"
    key = tmp_path / "fleet.key"
    keygen(key)
    card = publish(Store(str(store)), "sim.disks", regression, {"kind": "knobs"}, key)
    log_path = tmp_path / "train.log"
    with new_host_training(8, store, key, log_path, 60) as (host, trainer):
        wait_for(lambda: "the fleet predictor was refused" in log_path.read_text(),
                 timeout=60, what="the trainer's line on the refused fleet policy")
        errors = (host.mountpoint / "sim.disks" / "models" / "lgbm" / "errors").read_text()
        assert trainer.poll() is None  # still training, alone
    log = log_path.read_text()
    assert f"starting from fleet policy {card['version']} " in log
    assert "Traceback" not in log
    assert "regression" in errors  # the proxy's reason, in the model's errors file
