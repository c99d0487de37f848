"""Bounded fits (trainers/fitting.py): the deadline callback, the row budget, and the
child process a fit runs in.  Nothing here depends on the machine's speed: a deadline
already past stops boosting after its first round whatever the CPU, and the child is
waited for on its answer or its exit, with timeouts that only mean "broken"."""

from __future__ import annotations

import os
import time

import lightgbm as lgb
import numpy as np
import pytest
from mlfs.trainers.fitting import FIRST_FIT_ROWS, MIN_FIT_ROWS, FitProcess, row_budget, stop_at
from mlfs.trainers.predictor.learner import EventLearner

#: how long a child may take to answer before the test calls it broken (its imports
#: took 15 s on a 2-core machine at load 14)
BROKEN_SECONDS = 120.0


def _data(rows: int = 2_000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((rows, 3))
    return x, (x[:, 0] + 0.1 * rng.random(rows) > 0.9).astype(float)


def test_a_deadline_already_past_stops_boosting_after_the_first_round() -> None:
    x, y = _data()
    params = {"objective": "binary", "verbose": -1, "num_threads": 1}
    cut = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=50,
                    callbacks=[stop_at(time.monotonic())])
    assert cut.num_trees() == 1
    whole = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=50,
                      callbacks=[stop_at(time.monotonic() + 3600)])
    assert whole.num_trees() == 50


def test_an_event_learner_cut_at_its_deadline_is_a_calibrated_model_of_fewer_trees() -> None:
    x, y = _data()
    columns = {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2]}
    learner = EventLearner(["a", "b", "c"], negative_rate=0.5, rounds=40)
    learner.fit(columns, y.astype(bool), deadline=time.monotonic())
    assert learner.trees == 1
    text = learner.policy_text()
    assert "objective=binary" in text
    assert lgb.Booster(model_str=text).num_trees() == 1
    assert np.all((learner.predict(columns) > 0) & (learner.predict(columns) < 1))


def test_the_row_budget_follows_the_measured_rate_within_its_bounds() -> None:
    assert row_budget(None, 30.0, 3_000_000) == FIRST_FIT_ROWS
    assert row_budget(100_000.0, 10.0, 3_000_000) == 400_000  # 40 % of 10 s at 100k rows/s
    assert row_budget(100_000.0, 1e6, 3_000_000) == 3_000_000
    assert row_budget(10.0, 1.0, 3_000_000) == MIN_FIT_ROWS
    assert row_budget(100_000.0, -5.0, 3_000_000) == MIN_FIT_ROWS


def echo_pid(request: dict) -> dict:
    """Run in the child: its pid, and the request back."""
    if request.get("fail"):
        raise ValueError("asked to fail")
    return {"pid": os.getpid(), "request": request}


def sleep_forever(request: dict) -> dict:
    """Run in the child: a fit that never ends on its own."""
    while True:
        time.sleep(1)


def _answer(process: FitProcess) -> dict:
    out = process.result(BROKEN_SECONDS)
    assert out is not None, f"no answer in {BROKEN_SECONDS:g} s: the child is broken"
    return out


def test_a_fit_process_answers_from_one_child_kept_between_requests() -> None:
    process = FitProcess(echo_pid)
    try:
        process.submit({"n": 1})
        first = _answer(process)
        assert first["request"] == {"n": 1}
        assert first["pid"] == process.pid != os.getpid()
        process.submit({"fail": True})  # an exception is an answer, the child lives on
        failed = _answer(process)
        assert "ValueError: asked to fail" in failed["error"]
        process.submit({"n": 2})
        assert _answer(process)["pid"] == first["pid"]
    finally:
        process.close()
    assert process.pid is None


def test_a_cancelled_fit_is_killed_by_its_pid_and_the_next_one_gets_a_new_child() -> None:
    process = FitProcess(sleep_forever)
    try:
        process.submit({})
        pid = process.pid
        assert pid is not None and process.result(0.2) is None and process.busy
        process.cancel()
        assert not process.busy
        with pytest.raises(ProcessLookupError):  # killed and reaped: the pid is gone
            os.kill(pid, 0)
    finally:
        process.close()


def test_a_child_that_dies_mid_fit_is_an_error_answer_not_a_hang() -> None:
    process = FitProcess(sleep_forever)
    try:
        process.submit({})
        pid = process.pid
        assert pid is not None
        os.kill(pid, 9)
        out = _answer(process)
        assert "ended without an answer" in out["error"]
        assert not process.busy and process.pid is None
    finally:
        process.close()
