"""The trainer worker on the real daemon.

Its loop against a fake tree of files and FIFOs: tests/core/test_trainer_worker.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading

import lightgbm as lgb
from mlfs.trainers.worker import run_worker

from tests.harness import wait_for


def test_worker_on_a_real_mount(mount) -> None:
    """The whole loop on the real daemon: every input the worker writes is accepted,
    its policy loads, and it re-creates its proxy after an rmdir."""
    sub = mount.sub
    model_dir = sub / "models" / "lgbm"
    stop = threading.Event()
    result: dict = {}

    def target() -> None:
        result.update(run_worker(str(mount.mountpoint), "sim.readahead", "lgbm", stop=stop,
                                 max_seconds=90, log=logging.getLogger("test.train")))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_for(lambda: model_dir.is_dir() and (model_dir / "policy").read_text(), 45,
                 what="a policy on the mount")
        info = json.loads((sub / "info").read_text())
        names = lgb.Booster(model_str=(model_dir / "policy").read_text()).feature_name()
        assert names == list(info["features"]) + ["knob_read_ahead_kb"]
        os.rmdir(model_dir)
        wait_for(lambda: model_dir.is_dir()
                 and (model_dir / "state").read_text() in ("started\n", "running\n"), 15,
                 what="the proxy re-created and started")
        wait_for(lambda: (model_dir / "policy").read_text(), 20, what="the policy re-uploaded")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert result["fits"] >= 1 and result["policies"] >= 2
    assert result["recommendations"] >= 1
    assert result["rejected"] == 0 and result["policy_rejected"] == 0, result
    assert (model_dir / "errors").read_text() == ""
