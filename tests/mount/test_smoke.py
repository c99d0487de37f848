"""The mount answers the basic contract through real shell commands."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.harness import sh, wait_for


def test_version_info_and_layout_match_the_contract(mount):
    root = mount.mountpoint
    assert (root / "version").read_text().startswith("mlfs ")
    info = json.loads((mount.sub / "info").read_text())
    assert info["objective"]["goal"] == "max"
    assert set(info["knobs"]) == {"read_ahead_kb"}
    assert sorted(p.name for p in mount.sub.iterdir()) == [
        "control", "dataset", "events", "features", "info", "knobs", "models",
        "objective"]


def test_echo_recommendation_then_prepare_dataset_gives_a_readable_portion(mount):
    sub = mount.sub
    done = sh(f"mkdir {sub}/models/lgbm && echo start > {sub}/models/lgbm/control && "
              f"echo read_ahead_kb=512 > {sub}/models/lgbm/recommend && "
              f"echo prepare_dataset > {sub}/control")
    assert done.returncode == 0, done.stderr
    portions = sorted((sub / "dataset").glob("*.parquet"))
    assert portions, "prepare_dataset returned before the portion was visible"
    table = pq.read_table(portions[-1])
    assert table.num_rows > 0
    wait_for(lambda: (sub / "models/lgbm/state").read_text() == "running\n",
             what="model running after an ML tick")
