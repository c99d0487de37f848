"""Window features (mlfs.abi): the trainer computes them over a dataset, the proxy tick
by tick from each entity's last rows; the two must give the same numbers."""

import numpy as np
import pytest
from mlfs.backends.sim_disks import DrivePopulation
from mlfs.trainers.predictor.learner import default_windows

from mlfs.abi import MAX_WINDOW, WindowState, window_feature, window_features

NAMES = ["errors_delta_1d__mean7", "errors_delta_1d__pos30", "errors_delta_1d__first60",
         "read_latency_ms__mean30", "smart_197_raw__first3"]


def test_names_follow_the_grammar_and_bound_the_window():
    w = window_feature("errors_delta_1d__first60")
    assert (w.field, w.aggregate, w.window) == ("errors_delta_1d", "first", 60)
    assert window_feature("smart_5_raw") is None
    assert window_feature("x__median7") is None
    assert window_feature(f"x__mean{MAX_WINDOW + 1}") is None
    assert window_feature("x__mean1") is None


def test_one_entity_by_hand():
    keys = np.zeros(6, int)
    ticks = np.arange(6)
    values = np.array([0, 2, 0, 0, 1, 0])
    out = window_features(keys, ticks, {"e": values}, ["e__mean3", "e__pos3", "e__first3"])
    assert out["e__mean3"].tolist() == pytest.approx([0, 1, 2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert out["e__pos3"].tolist() == [0, 1, 1, 1, 1, 1]
    assert out["e__first3"].tolist() == [-1, 0, 1, 2, 0, 1]


def test_the_proxy_state_tick_by_tick_equals_the_trainer_over_the_dataset():
    # 300 drives over 150 days: failed drives are replaced by new ids, so entities come
    # and go; rows arrive shuffled within a day, as a source may order them
    pop = DrivePopulation(drives=300, seed=5)
    rng = np.random.default_rng(0)
    state = WindowState(NAMES)
    days, stream = [], {n: [] for n in NAMES}
    for _ in range(150):
        day = pop.day()
        order = rng.permutation(len(day["drive_id"]))
        day = {k: v[order] for k, v in day.items()}
        days.append(day)
        got = state.update(day["drive_id"], day)
        for n in NAMES:
            stream[n].append(got[n])
    columns = {k: np.concatenate([d[k] for d in days]) for k in days[0]}
    ticks = np.repeat(np.arange(150), 300)
    batch = window_features(columns["drive_id"], ticks, columns, NAMES)
    assert (columns["errors_delta_1d"] > 0).any()
    for n in NAMES:
        np.testing.assert_allclose(np.concatenate(stream[n]), batch[n], rtol=1e-9, atol=1e-9)


def test_the_state_forgets_entities_gone_for_a_window_when_it_needs_room():
    state = WindowState(["v__mean3"], max_entities=100)
    for tick in range(MAX_WINDOW + 1):
        state.update(np.arange(60) + (1000 if tick else 0), {"v": np.ones(60)})
    # 60 first-tick entities gone for MAX_WINDOW updates: room for 60 new ones
    got = state.update(np.arange(2000, 2060), {"v": np.full(60, 3.0)})
    assert got["v__mean3"].tolist() == [3.0] * 60
    assert len(state.slots) <= 120


def test_the_trainer_adds_trends_of_counts_and_levels_of_measurements():
    columns = {"errors": np.array([0, 0, 0, 3]), "latency": np.array([1.0, 2, 3, 4]),
               "age": np.array([5, 6, 7, 8]), "flag": np.array([0, 1, 0, 0], bool)}
    names = default_windows(columns, list(columns))
    assert names == ["errors__mean7", "errors__mean30", "errors__pos30", "errors__first60",
                     "latency__mean7", "latency__mean30"]
