"""The trainer worker on the real daemon.

Its loop against a fake tree of files and FIFOs: tests/unit/test_trainer_worker.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading

import lightgbm as lgb
from mlfs.trainers.knob.worker import run_worker

from tests.harness import REPO, mlfs_command, wait_for

#: how long a wait may last before the test calls the worker or the mount broken: never
#: a measure of speed (tests stop the worker with `stop`, in a `finally`)
BROKEN_SECONDS = 120.0


def test_worker_on_a_real_mount(mount) -> None:
    """The whole loop on the real daemon: every input the worker writes is accepted,
    its policy loads, and it re-creates its proxy after an rmdir."""
    sub = mount.sub
    model_dir = sub / "models" / "lgbm"
    stop = threading.Event()
    result: dict = {}

    def target() -> None:
        result.update(run_worker(str(mount.mountpoint), "sim.readahead", "lgbm", stop=stop,
                                 log=logging.getLogger("test.train")))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_for(lambda: model_dir.is_dir() and (model_dir / "policy").read_text(), BROKEN_SECONDS,
                 what="a policy on the mount")
        info = json.loads((sub / "info").read_text())
        names = lgb.Booster(model_str=(model_dir / "policy").read_text()).feature_name()
        assert names == list(info["features"]) + ["knob_read_ahead_kb"]
        os.rmdir(model_dir)
        wait_for(lambda: model_dir.is_dir()
                 and (model_dir / "state").read_text() in ("started\n", "running\n"),
                 BROKEN_SECONDS,
                 what="the proxy re-created and started")
        wait_for(lambda: (model_dir / "policy").read_text(),
                 BROKEN_SECONDS, what="the policy re-uploaded")
    finally:
        stop.set()
        thread.join(BROKEN_SECONDS)
    assert not thread.is_alive()
    assert result["fits"] >= 1 and result["policies"] >= 2
    assert result["recommendations"] >= 1
    assert result["rejected"] == 0 and result["policy_rejected"] == 0, result
    assert (model_dir / "errors").read_text() == ""


def test_a_worker_given_some_features_uploads_a_policy_on_those_alone(mount) -> None:
    """`features`: the model sees only those; the proxy loads and runs such a policy."""
    sub = mount.sub
    model_dir = sub / "models" / "few"
    info = json.loads((sub / "info").read_text())
    chosen = list(info["features"])[:2]
    stop = threading.Event()
    result: dict = {}

    def target() -> None:
        result.update(run_worker(str(mount.mountpoint), "sim.readahead", "few", stop=stop,
                                 log=logging.getLogger("test.train"),
                                 features=list(reversed(chosen))))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_for(lambda: model_dir.is_dir() and (model_dir / "policy").read_text(), BROKEN_SECONDS,
                 what="a policy on the mount")
        names = lgb.Booster(model_str=(model_dir / "policy").read_text()).feature_name()
        assert names == chosen + ["knob_read_ahead_kb"]  # in info order, whatever was asked
        assert (model_dir / "state").read_text() == "running\n"
    finally:
        stop.set()
        thread.join(BROKEN_SECONDS)
    assert not thread.is_alive()
    assert result["policies"] >= 1 and result["policy_rejected"] == 0, result
    assert (model_dir / "errors").read_text() == ""


def test_train_with_a_feature_the_subsystem_lacks_exits_2_with_one_line(mount) -> None:
    real = next(iter(json.loads((mount.sub / "info").read_text())["features"]))
    done = subprocess.run(mlfs_command("train", str(mount.mountpoint), "sim.readahead",
                                       "--features", f"{real},no_such_feature"),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_feature" in lines[0], lines
    assert f" {real}," not in lines[0]  # names only what is missing
