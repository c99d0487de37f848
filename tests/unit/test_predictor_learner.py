"""The predictor's policy is calibrated in its own trees and passes the verifier."""

import lightgbm as lgb
import numpy as np
from mlfs.trainers.predictor.learner import EventLearner, label_rows

from mlfs.base.verifier import gives_probability, verify


def _data(n=60_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    noise = rng.standard_normal(n)
    p = 1 / (1 + np.exp(-(2.0 * x - 6.0)))  # rare: about 1 % positive
    y = rng.random(n) < p
    return {"x": x, "noise": noise}, y, p


def test_down_sampled_negatives_are_corrected_in_the_first_tree():
    columns, y, truth = _data()
    learner = EventLearner(["x", "noise"], negative_rate=0.05, rounds=80).fit(columns, y)
    p = learner.predict(columns)
    assert abs(p.mean() - y.mean()) < 0.25 * y.mean()  # calibrated on average
    high = truth > 0.2
    assert abs(p[high].mean() - truth[high].mean()) < 0.1
    # the correction is in the text: LightGBM itself gives the same numbers
    text = learner.policy_text()
    again = lgb.Booster(model_str=text).predict(np.column_stack([columns["x"],
                                                                 columns["noise"]]))
    np.testing.assert_allclose(again, p)
    model = verify(text.encode())
    assert gives_probability(model) and model.feature_names == ("x", "noise")


def test_labels_mark_the_ticks_before_each_event_within_the_horizon():
    keys = np.array([7, 7, 7, 7, 7, 9, 9])
    ticks = np.array([0, 1, 2, 3, 4, 0, 1])
    events = np.array([0, 0, 0, 0, 1, 0, 0], bool)
    label, usable = label_rows(keys, ticks, events, horizon=2)
    assert label.tolist() == [False, False, True, True, False, False, False]
    assert usable.tolist() == [True, True, True, True, False, True, True]


def test_the_trainers_fit_names_window_features_the_proxy_computes_the_same_way():
    import pyarrow as pa
    from mlfs.backends.sim_disks import RECORDS, DrivePopulation
    from mlfs.trainers.predictor.learner import fit_predictor

    from mlfs.abi import WindowState
    from mlfs.core.models.kinds.predictor.inputs import PredictionPolicy

    pop = DrivePopulation(drives=2000, seed=3)
    days = [pop.day() for _ in range(240)]
    columns = {k: np.concatenate([d[k] for d in days]) for k in days[0]}
    columns["tick"] = np.repeat(np.arange(240), 2000)
    fields = [n for n in RECORDS if n not in ("drive_id", "failed")]
    learner, figures = fit_predictor(columns, "drive_id", "failed", 30, fields, rounds=30)
    assert learner is not None and figures["positives"] >= 20
    windows = learner.features[len(fields):]
    assert "errors_delta_1d__first60" in windows and "read_latency_ms__mean30" in windows
    # the proxy accepts the policy and, keeping each drive's last rows itself, gives the
    # probabilities the trainer's columns give
    policy = PredictionPolicy(learner.policy_text().encode(), RECORDS)
    assert policy.windows == windows
    state = WindowState(policy.windows)
    for tick, day in enumerate(days):
        got = state.update(day["drive_id"], day)
        if tick in (10, 239):
            rows = columns["tick"] == tick
            p = policy.predict(pa.table({n: day[n] for n in RECORDS}), got)
            np.testing.assert_allclose(p, learner.predict({k: v[rows] for k, v in
                                                           columns.items()}), rtol=1e-6)
