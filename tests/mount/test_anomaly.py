"""The anomaly kind end to end on a real mount: sim.disks' drive-days, `mlfs train` (a
subprocess) fitting an isolation forest and uploading it as JSON, the forest scored by
the daemon on every tick, `anomaly` events as each mode allows, judged feedback rows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pyarrow.dataset as ds
import pytest

from tests.harness import EventStream, Mount, sh, sim_disks_config, wait_for, write_errno

DISKS = sim_disks_config(seed=11, drives=2000)


@pytest.fixture
def disks(mount_root):
    mount = Mount(mount_root, DISKS)
    mount.start()
    try:
        yield mount
    finally:
        mount.kill(signal.SIGTERM)


def test_mlfs_train_fits_a_forest_and_its_anomalies_follow_the_mode(disks):
    sub = disks.mountpoint / "sim.disks"
    info = json.loads((sub / "info").read_text())
    assert "anomaly" in info["kinds"]
    model = sub / "models" / "iso"
    assert sh(f"mkdir {model} && echo anomaly > {model}/kind").returncode == 0
    assert (model / "kind").read_text() == "anomaly\n"
    assert sh(f"echo learning > {model}/mode").returncode == 0
    events = EventStream(sub / "events")
    done = subprocess.run([sys.executable, "-m", "mlfs", "train", str(disks.mountpoint),
                           "sim.disks", "--model", "iso", "--max-seconds", "20"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "forest uploaded" in done.stderr
    policy = json.loads((model / "policy").read_text())
    assert policy["format"] == "mlfs.isolation_forest" and len(policy["trees"]) == 100
    assert (model / "state").read_text() == "running\n"
    events.wait_for(lambda e: e["event"] == "policy" and e.get("status") == "loaded",
                    what="the forest loaded")
    # learning: the model is shadowed; its anomalies are judged (feedback) but not raised
    assert sh(f"echo prepare_dataset > {sub}/control").returncode == 0
    wait_for(lambda: any(r["model_alert"] for r in _feedback(model)),
             what="a judged row the shadowed model flagged")
    events.read()
    assert not [e for e in events.seen
                if e["event"] == "anomaly" and e["source"] == "model"], \
        "a shadowed model raised an anomaly"
    # collaboration: the model's anomalies are raised beside the rule's
    assert sh(f"echo collaboration > {model}/mode").returncode == 0
    raised = events.wait_for(lambda e: e["event"] == "anomaly" and e["source"] == "model",
                             what="the model's anomaly in collaboration")
    assert raised["mode"] == "collaboration" and raised["model"] == "iso"
    assert 0.0 < raised["p"] <= 1.0 and raised["target"] == "failure"
    # recommendation pinned by hand: the model's anomalies, the rule's beside them while
    # the model has not beaten the rule since the pin (tests/mount/test_predictors.py)
    assert sh(f"echo recommendation > {model}/mode").returncode == 0
    events.wait_for(lambda e: e["event"] == "anomaly" and e["mode"] == "recommendation"
                    and e["source"] == "model", what="the model's anomaly in recommendation")
    assert all(e["source"] == "rule" for e in events.seen
               if e["event"] == "anomaly" and e["mode"] == "learning")
    assert "source=model" in (model / "anomalies").read_text()
    rows = _feedback(model)
    assert {"p", "outcome", "model_alert", "rule_alert"} <= set(rows[0])
    assert any(r["outcome"] == 1 for r in rows) or any(r["model_alert"] for r in rows)


def _feedback(model) -> list[dict]:
    if not list((model / "feedback").glob("*.parquet")):
        return []
    return ds.dataset(str(model / "feedback"), format="parquet").to_table().to_pylist()


def test_a_level_is_one_line_and_a_forest_is_checked_whole(disks, mount_root):
    sub = disks.mountpoint / "sim.disks"
    model = sub / "models" / "lv"
    assert sh(f"mkdir {model} && echo anomaly > {model}/kind").returncode == 0
    assert (model / "kind").read_text() == "anomaly\n"
    assert sh(f"echo start > {model}/control").returncode == 0
    assert sh(f"echo alert_score=0.7 ttl=50 > {model}/recommend").returncode == 0
    for bad, reason in [("alert_score=1.5", "not an anomaly score in (0, 1]"),
                        ("alert_score=x", "not a number"),
                        ("drive_id=5 target=failure p=0.9", "is not alert_score="),
                        ("alert_score=0.5 ttl=0", "not a tick count")]:
        assert write_errno(model / "recommend", bad + "\n") == 22, bad
        assert reason in (model / "errors").read_text().splitlines()[-1], bad
    # a pickle, a LightGBM text and a forest naming a column the records lack: EINVAL
    (mount_root / "bad.json").write_text(json.dumps(
        {"format": "mlfs.isolation_forest", "version": 1, "features": ["colour"],
         "samples": 2, "alert_score": 0.5,
         "trees": [{"feature": [0, -1, -1], "threshold": [1.0, 0, 0], "left": [1, -1, -1],
                    "right": [2, -1, -1], "size": [2, 1, 1]}]}))
    (mount_root / "pickle.bin").write_bytes(b"\x80\x04\x95cos\nsystem\n.")
    for name, reason in [("bad.json", "not a numeric record field"),
                         ("pickle.bin", "not ASCII")]:
        assert sh(f"cat {mount_root}/{name} > {model}/policy").returncode != 0
        assert reason in (model / "errors").read_text().splitlines()[-1]
    assert (model / "policy").read_text() == ""
