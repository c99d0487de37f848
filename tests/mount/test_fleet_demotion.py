"""A fleet policy is checked on every host: bad here, contained here, kept elsewhere.

Two real mounts as hosts with different workloads (sim.readahead phases: host A
streams sequentially, host B reads 32 KiB records every 512 KiB).  A deliberately
bad fleet policy always picks read_ahead_kb=32: the best value on B (325 MiB/s
against the default 128's 240) and a third of the default on A (325 against
960).  Each host pulls it with `mlfs train --fleet`; both start in collaboration
with automatic switching, and each host's own proxy measures it: on A the safe set
(mlfs/core/models/safe_set.py) never lets it run 32 KiB, in any mode (the step on the way,
64 KiB, loses there), so it runs the default (a loss it did run may demote it); B
promotes it to recommendation.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import lightgbm as lgb
import numpy as np
import pytest
from mlfs.trainers.knob.learner import KnobLearner

from mlfs.abi import candidate_values
from mlfs.fleet.demo import demo_key
from mlfs.fleet.store import Store
from mlfs.fleet.train import publish
from tests.harness import REPO, EventStream, Mount, mlfs_command, read_rows, wait_for

pytestmark = pytest.mark.mount

CONFIG = """
[mount]
allow_other = true

[store]
seal_seconds = 0.5
feedback_seal_seconds = 0.5
journal_seal_seconds = 0.5

[modes]
window_ticks = 200
min_ml_ticks = 10
min_dwell_ticks = 20
silence_seconds = 600.0

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = {seed}
tick_seconds = 0.01
phases = ["{phase}"]
"""

BAD_KB = 32


def always(info: dict, value: int) -> str:
    """A valid policy with the local learner's columns that predicts the best
    objective for read_ahead_kb=value whatever the features say."""
    columns = KnobLearner(info).columns
    knob = candidate_values(info["knobs"]["read_ahead_kb"])
    rng = np.random.default_rng(0)
    X = rng.normal(size=(len(knob) * 40, len(columns)))
    X[:, columns.index("knob_read_ahead_kb")] = np.repeat(knob, 40)
    y = np.where(X[:, columns.index("knob_read_ahead_kb")] == value, 1000.0, 10.0)
    booster = lgb.train({"objective": "regression", "num_leaves": 4, "min_data_in_leaf": 5,
                         "verbose": -1}, lgb.Dataset(X, y, feature_name=columns),
                        num_boost_round=5)
    # as a booster read from text writes itself (what the trainer uploads)
    return lgb.Booster(model_str=booster.model_to_string()).model_to_string()


def pull(m: Mount, store, text: str) -> str:
    """`mlfs train --fleet` until the fleet policy is the local model's; the policy
    the host runs once the trainer ended."""
    with open(m.root / f"{m.mountpoint.name}-train.log", "ab") as log:
        worker = subprocess.Popen(
            mlfs_command("train", str(m.mountpoint), "sim.readahead", "--fleet", str(store),
                         "--explore-ticks", "1", "--trusted-key", f"{demo_key(store)}.pub"),
            stdout=log, stderr=log, cwd=REPO)
    policy = m.sub / "models" / "lgbm" / "policy"

    def uploaded() -> bool:
        if policy.exists() and policy.read_text() == text:
            return True
        assert "starting from fleet policy" in log_path.read_text() or worker.poll() is None
        return False

    log_path = m.root / f"{m.mountpoint.name}-train.log"
    try:
        # an upper bound, ~30 s here at load 8: on a loaded machine the daemon's
        # check of a policy (a subprocess importing LightGBM, 20 s budget) can time
        # out, and the trainer uploads it again 30 s later
        wait_for(uploaded, timeout=300, interval=0.01,
                 what=f"the fleet policy uploaded to {m.mountpoint.name}")
    except BaseException:
        print(log_path.read_text()[-3000:])
        print((m.sub / "models" / "lgbm" / "errors").read_text()[-2000:])
        raise
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    return policy.read_text()


def decided_efficiency(event: dict) -> float:
    """The efficiency a `mode` event's switch was decided on (its `why`)."""
    return float(re.search(r"efficiency (\d+\.\d+)", event["why"]).group(1))


def test_a_bad_fleet_policy_is_contained_on_one_host_while_another_keeps_it(
        mount_root, tmp_path):
    store = tmp_path / "store"
    a = Mount(mount_root, config=CONFIG.format(seed=5, phase="sequential"), name="a")
    b = Mount(mount_root, config=CONFIG.format(seed=6, phase="strided"), name="b")
    events = events_b = None
    try:
        a.start()
        b.start()
        info = json.loads((a.sub / "info").read_text())
        text = always(info, BAD_KB)
        card = publish(Store(str(store)), "sim.readahead", text,
                       {"rows": 0, "hosts": {}, "note": f"always read_ahead_kb={BAD_KB}"},
                       key=demo_key(store))
        running = {m: pull(m, store, text) for m in (a, b)}
        events = EventStream(a.sub / "events")  # from here on: A's demotion is in it
        events_b = EventStream(b.sub / "events")
        for m in (a, b):
            model = m.sub / "models" / "lgbm"
            (model / "mode").write_text("collaboration\n")
            (model / "mode").write_text("auto\n")
            assert (model / "mode_switching").read_text() == "auto\n"
        mode = {m: m.sub / "models" / "lgbm" / "mode" for m in (a, b)}
        # A's next tick on: decided in collaboration (the metric may lag by a tick)
        switched = 1 + next(int(line.rsplit(" ", 1)[1]) for line
                            in (a.mountpoint / "metrics").read_text().splitlines()
                            if line.startswith("mlfs_tick{"))

        def policy_ticks_on_a() -> list[dict]:
            rows = read_rows(a.sub / "models" / "lgbm" / "feedback")
            return [r for r in rows if r["tick"] >= switched and r["source"] == "policy"]

        wait_for(lambda: mode[b].read_text() == "recommendation\n"
                 and len(policy_ticks_on_a()) >= 200,
                 timeout=120, what="B promoted, 200 policy ticks on A")
        promoted = events_b.wait_for(lambda e: e.get("event") == "mode" and e.get("to") ==
                                     "recommendation", what="B's promotion")
        # the efficiency each switch was decided on, from its event (the files show the
        # new mode's own evidence from the switch on, so they start again at nan)
        assert 1.05 < decided_efficiency(promoted)
        # on A the safe set never lets the policy run 32 KiB, in any mode (two steps from
        # the default, through 64 KiB, which loses there): contained.  A demotion is
        # decided on a loss it did run.  Overruled to the default, its ticks ran the
        # default: a model with no effect, which the anytime test promotes at most at
        # its error rate (5 %; it did once in CI), so A's mode is not asserted
        ran = policy_ticks_on_a()
        assert BAD_KB not in {r["knob_read_ahead_kb"] for r in ran}, (
            switched, [(r["tick"], r["knob_read_ahead_kb"]) for r in ran][:40])
        demoted = [e for e in events.read() if e.get("event") == "mode"
                   and e.get("to") == "learning" and e.get("model") == "lgbm"]
        assert all(decided_efficiency(e) < 0.97 for e in demoted), demoted
        # the host changed its mode, not the policy; the fleet's copy is untouched
        for m in (a, b):
            assert (m.sub / "models" / "lgbm" / "policy").read_text() == running[m]
        folder = store / "policies" / "sim.readahead"
        assert (folder / f"{card['version']:010d}.txt").read_text() == text
        # the fleet-wide report, from the store alone: same policy, each host's verdict
        for m in (a, b):
            done = subprocess.run(
                mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                             "--state-dir", str(m.state_dir), "--once"),
                capture_output=True, text=True, timeout=120, cwd=REPO)
            assert done.returncode == 0, done.stderr
        done = subprocess.run(mlfs_command("fleet", "report", "--store", str(store), "--json"),
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr
        report = {r["host"]: r for r in json.loads(done.stdout)["rows"]}
        hosts = {m: (m.mountpoint / "host").read_text().strip() for m in (a, b)}
        # each host's verdict as its own proxy decided it (A's: contained above)
        assert report[hosts[a]]["mode"] in ("learning", "collaboration", "recommendation",
                                            "emergency")
        assert report[hosts[b]]["mode"] == "recommendation"
        for m in (a, b):
            row = report[hosts[m]]
            assert row["rows"] > 0 and row["model"] == "lgbm"
            if running[m] == text:  # not yet boosted on local residuals
                assert row["policy"] == f"fleet {card['version']}"
        summary = json.loads(done.stdout)["subsystems"]["sim.readahead"]
        assert summary["hosts"] == 2 and summary["modes"]["recommendation"] >= 1
    finally:
        for stream in (events, events_b):
            if stream is not None:
                stream.close()
        a.kill(signal.SIGTERM)
        b.kill(signal.SIGTERM)
