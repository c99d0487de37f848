"""The proxy's side of the learning loop, through a real mount.

Efficiency and feedback on a scripted run whose answer we know; demotion of a
model that recommends badly; emergency when the trainer goes silent; policies
checked before use (a bad one refused, a good one run in-process).
"""

from __future__ import annotations

import errno
import json
import os
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness import Mount, sh, wait_for

LOOP_CONFIG = """
[store]
seal_seconds = 0.5
feedback_seal_seconds = 0.5
journal_seal_seconds = 0.5

[modes]
window_ticks = 200
min_ml_ticks = 10
min_dwell_ticks = 20
emergency_cooldown_ticks = 100000
silence_seconds = {silence}
collapse_below = {collapse}

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 3
tick_seconds = 0.01
"""


@pytest.fixture
def loop_mount(mount_root, request):
    settings = getattr(request, "param", {})
    config = LOOP_CONFIG.format(silence=settings.get("silence", 600.0),
                                collapse=settings.get("collapse", 0.5))
    m = Mount(mount_root, config)
    m.start()
    try:
        yield m
    finally:
        m.kill(signal.SIGTERM)


def _table(directory) -> pa.Table:
    files = sorted(directory.glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


def _model(m: Mount, name: str = "m"):
    model = m.sub / "models" / name
    done = sh(f"mkdir {model} && echo start > {model}/control")
    assert done.returncode == 0, done.stderr
    return model


def test_feedback_rows_carry_expected_observed_baseline_and_error(loop_mount):
    model = _model(loop_mount)
    sh(f"echo collaboration > {model}/mode && "
       f"echo 'read_ahead_kb=1024 expect=500' > {model}/recommend")
    wait_for(lambda: len(list((model / "feedback").glob("*.parquet"))) >= 2, what="feedback")
    sh(f"echo prepare_dataset > {model}/control")
    feedback = _table(model / "feedback").to_pandas()
    dataset = _table(loop_mount.sub / "dataset").to_pandas().set_index("tick")
    assert len(feedback) >= 10
    assert set(feedback["source"]) == {"recommendation"}
    assert (feedback["knob_read_ahead_kb"] == 1024).all()
    assert (feedback["expected"] == 500.0).all()
    joined = feedback.merge(dataset[["objective", "controller"]], left_on="tick",
                            right_index=True, how="inner")
    assert len(joined) == len(feedback)
    # observed is the tick's objective, and the tick was recorded as an ML tick
    assert np.allclose(joined["observed"], joined["objective"])
    assert set(joined["controller"]) == {"ml"}
    assert np.allclose(feedback["error"], feedback["observed"] - 500.0)
    # baseline: mean of the model's default ticks bracketing the ML tick
    ticks = dataset[dataset["model"] == "m"]
    defaults = ticks[ticks["controller"] == "default"]["objective"]
    checked = 0
    for row in feedback.itertuples():
        before = defaults[defaults.index < row.tick].tail(1)
        after = defaults[defaults.index > row.tick].head(1)
        if len(before) and len(after):
            assert row.baseline == pytest.approx((before.iloc[0] + after.iloc[0]) / 2)
            assert row.efficiency == pytest.approx(row.observed / row.baseline)
            checked += 1
    assert checked >= 10
    efficiency = float((model / "efficiency").read_text())
    assert efficiency > 0


def test_collaboration_interleaves_ml_and_default_ticks_one_to_one(loop_mount):
    model = _model(loop_mount)
    sh(f"echo collaboration > {model}/mode && echo 'read_ahead_kb=512' > {model}/recommend")
    wait_for(lambda: len(list((loop_mount.sub / "dataset").glob("*.parquet"))) >= 2,
             what="two portions")
    rows = _table(loop_mount.sub / "dataset").to_pandas()
    rows = rows[(rows["model"] == "m") & (rows["mode"] == "collaboration")]
    controllers = rows["controller"].tolist()[5:105]
    assert len(controllers) >= 40
    assert abs(controllers.count("ml") - controllers.count("default")) <= 1
    assert all(a != b for a, b in zip(controllers, controllers[1:], strict=False))


@pytest.mark.parametrize("loop_mount", [{"collapse": 0.6}], indirect=True)
def test_a_model_that_recommends_badly_is_demoted_and_the_default_runs(loop_mount):
    model = _model(loop_mount)
    events = open(loop_mount.sub / "events", "rb")  # noqa: SIM115 - read below
    try:
        sh(f"echo 'read_ahead_kb=0' > {model}/recommend")  # ~20x worse than 128 when sequential
        wait_for(lambda: (model / "mode").read_text() == "emergency\n", timeout=30,
                 what="demotion to emergency")
        line = b""
        while b'"event":"mode"' not in line:
            line = events.readline()
        event = json.loads(line)
        assert event["to"] == "emergency" and "collapsed" in event["why"]
    finally:
        events.close()
    sh(f"echo prepare_dataset > {loop_mount.sub}/control")
    # after the switch every tick is the default algorithm's
    wait_for(lambda: len(list((loop_mount.sub / "dataset").glob("*.parquet"))) >= 1)
    sh(f"echo prepare_dataset > {loop_mount.sub}/control")
    rows = _table(loop_mount.sub / "dataset").to_pandas()
    after = rows[rows["mode"] == "emergency"]
    assert len(after) > 0
    assert set(after["controller"]) == {"default"}
    assert set(after["knob_read_ahead_kb"]) == {128}


@pytest.mark.parametrize("loop_mount", [{"silence": 1.0}], indirect=True)
def test_a_silent_trainer_leads_to_emergency_and_a_recommendation_brings_it_back(loop_mount):
    model = _model(loop_mount)
    wait_for(lambda: (model / "mode").read_text() == "emergency\n",
             what="emergency after silence")
    assert (model / "mode_switching").read_text() == "auto\n"
    done = sh(f"echo 'read_ahead_kb=256' > {model}/recommend")
    assert done.returncode == 0, done.stderr
    assert (model / "mode").read_text() == "learning\n"


def test_a_malformed_policy_is_refused_and_the_daemon_keeps_serving(loop_mount):
    model = _model(loop_mount)
    for bad in (b"not a model\n", b"tree\nversion=v4\nnum_class=1\ngarbage\x01\n",
                b"\xff\xfe" * 100):
        fd = os.open(model / "policy", os.O_WRONLY | os.O_TRUNC)
        with pytest.raises(OSError) as caught:
            os.write(fd, bad)
            os.close(fd)
        if caught.value.errno != errno.EINVAL:
            raise caught.value
        try:
            os.close(fd)
        except OSError:
            pass
    assert loop_mount.alive()
    assert (model / "policy").read_bytes() == b""
    errors = (model / "errors").read_text().splitlines()
    assert len(errors) == 3 and all(" policy " in line for line in errors)
    assert (loop_mount.sub / "info").read_text().startswith("{")


def _train_policy(table: pa.Table, columns: list[str]) -> str:
    import lightgbm as lgb

    frame = table.to_pandas()
    data = lgb.Dataset(frame[columns].to_numpy(float), label=frame["objective"].to_numpy(),
                       feature_name=columns, params={"verbose": -1})
    booster = lgb.train({"objective": "regression", "verbose": -1, "num_leaves": 7,
                         "min_data_in_leaf": 5}, data, num_boost_round=20)
    return booster.model_to_string()


def test_a_valid_policy_is_loaded_run_in_process_and_read_back(loop_mount):
    model = _model(loop_mount)
    sh(f"echo collaboration > {model}/mode")
    for value in (0, 64, 512, 4096):
        sh(f"echo 'read_ahead_kb={value} ttl=4' > {model}/recommend")
        wait_for(lambda v=value: (loop_mount.sub / "knobs/read_ahead_kb").read_text()
                 == f"{v}\n", interval=0.002, what=f"{value} applied")
    sh(f"echo prepare_dataset > {loop_mount.sub}/control")
    table = _table(loop_mount.sub / "dataset")
    text = _train_policy(table, ["sequential_ratio", "mem_pressure", "knob_read_ahead_kb"])
    with open(model / "policy", "w") as fh:
        fh.write(text)
    assert (model / "policy").read_text() == text
    wait_for(lambda: _policy_rows(model) > 0, timeout=20, what="feedback from the policy")
    metrics = (loop_mount.mountpoint / "metrics").read_text()
    assert 'mlfs_model_policy_loaded{subsystem="sim.readahead",model="m"} 1' in metrics
    assert "mlfs_model_policy_inference_seconds" in metrics
    done = sh(f": > {model}/policy")
    assert done.returncode == 0
    assert (model / "policy").read_bytes() == b""


def _policy_rows(model) -> int:
    table = _table(model / "feedback")
    if table is None:
        return 0
    return sum(1 for s in table.column("source").to_pylist() if s == "policy")


def test_a_policy_using_columns_the_subsystem_lacks_is_refused(loop_mount):
    model = _model(loop_mount)
    import lightgbm as lgb

    x = np.random.default_rng(0).random((100, 2))
    data = lgb.Dataset(x, label=x[:, 0], feature_name=["no_such_feature", "knob_read_ahead_kb"],
                       params={"verbose": -1})
    text = lgb.train({"verbose": -1}, data, num_boost_round=3).model_to_string()
    with pytest.raises(OSError) as caught, open(model / "policy", "w") as fh:
        fh.write(text)
    assert caught.value.errno == errno.EINVAL
    assert "no_such_feature" in (model / "errors").read_text()
