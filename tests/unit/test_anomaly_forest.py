"""The anomaly detector's policy: the exported forest, its verifier and the numpy scorer.

The daemon never unpickles a trainer's forest; it reads JSON arrays
(mlfs/core/models/kinds/anomaly/forest.py) and scores them itself.  These tests pin that the
score equals scikit-learn's on the same data, and that every broken rule of the format
is refused with EINVAL and a reason naming it.
"""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
from mlfs.backends.sim_disks import RECORDS, DrivePopulation, SimDisks
from mlfs.trainers.anomaly.learner import (
    choose_alert_score,
    export_forest,
    fit_anomaly,
    fit_forest,
    forest_scores,
)

from mlfs.base import outcomes
from mlfs.base.errors import Refused
from mlfs.core.models.kinds.anomaly import forest as F

FEATURES = [n for n in RECORDS if n not in ("drive_id", "failed")]


@pytest.fixture(scope="module")
def drive_days():
    columns = DrivePopulation(drives=400, seed=3).days(120)
    columns["tick"] = columns["day"]
    return columns


@pytest.fixture(scope="module")
def fitted(drive_days):
    x = np.column_stack([drive_days[f].astype(np.float64) for f in FEATURES])
    model = fit_forest(x, seed=1)
    return model, x, export_forest(model, FEATURES, 0.6)


def test_the_daemon_score_equals_scikit_learns_score_samples(fitted):
    model, x, text = fitted
    verified = F.verify_forest(text.encode())
    assert verified.trees == 100 and verified.features == tuple(FEATURES)
    ours = F.score(verified, x)
    np.testing.assert_allclose(ours, -model.score_samples(x), rtol=1e-12, atol=0)
    # also on rows the forest never saw, far outside the training ranges
    rng = np.random.default_rng(0)
    wild = x[:500] * rng.uniform(0, 50, size=(500, x.shape[1]))
    np.testing.assert_allclose(F.score(verified, wild), -model.score_samples(wild),
                               rtol=1e-12, atol=0)


def test_a_missing_value_goes_right_and_still_scores(fitted):
    _, x, text = fitted
    verified = F.verify_forest(text.encode())
    row = x[:1].copy()
    row[0, :] = np.nan
    value = F.score(verified, row)[0]
    assert 0.0 < value <= 1.0


def test_c_of_n_is_the_papers():
    assert F.average_path_length(np.array([0, 1, 2])).tolist() == [0.0, 0.0, 1.0]
    n = 256.0
    harmonic = np.log(n - 1) + np.euler_gamma
    assert F.average_path_length(np.array([n]))[0] == pytest.approx(
        2 * harmonic - 2 * (n - 1) / n)


def _doc(text: str) -> dict:
    return json.loads(text)


def _refused(doc, words: str) -> str:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(Refused) as caught:
        F.verify_forest(raw)
    assert caught.value.errno == errno.EINVAL
    assert words in caught.value.reason, caught.value.reason
    return caught.value.reason


def _tree0(doc, field, value, node=0):
    doc["trees"][0][field][node] = value
    return doc


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(extra=1), "unknown key 'extra'"),
    (lambda d: d.pop("samples"), "missing ['samples']"),
    (lambda d: d.update(version=2), "version 1"),
    (lambda d: d.update(features=[]), "features must be"),
    (lambda d: d.update(features=["a"] * len(d["features"])), "named twice"),
    (lambda d: d.update(samples=1), "samples must be"),
    (lambda d: d.update(alert_score=1.5), "alert_score"),
    (lambda d: d.update(alert_score=True), "alert_score"),
    (lambda d: d.update(trees=[]), "trees must be"),
    (lambda d: d["trees"][0].pop("size"), "tree 0 must have exactly"),
    (lambda d: _tree0(d, "left", 0), "left child 0 is not after it"),
    (lambda d: _tree0(d, "right", 10**6), "right child 1000000"),
    (lambda d: _tree0(d, "feature", 99), "feature 99 is not in"),
    (lambda d: _tree0(d, "feature", 1.5), "feature[0] is not an integer"),
    (lambda d: _tree0(d, "threshold", "x"), "threshold is not a finite number"),
    (lambda d: _tree0(d, "size", 10**6), "size 1000000 is not in 1..samples"),
    (lambda d: d["trees"][0]["size"].__setitem__(0, d["trees"][0]["size"][0] - 1),
     "size is not its children's sum"),
    (lambda d: d["trees"][0]["left"].append(-1), "a list of"),
])
def test_every_broken_rule_is_refused_with_its_reason(fitted, edit, words):
    doc = _doc(fitted[2])
    edit(doc)
    _refused(doc, words)


def test_a_node_with_two_parents_or_none_is_refused(fitted):
    doc = _doc(fitted[2])
    tree = doc["trees"][0]
    # the root's right child points where its left does
    tree["right"][0] = tree["left"][0]
    _refused(doc, "right child 1 has two parents")
    doc = _doc(fitted[2])
    tree = doc["trees"][0]
    inner = next(i for i in range(1, len(tree["left"])) if tree["left"][i] != -1)
    tree["left"][inner] = tree["left"][0]  # a node shared by the root and another
    _refused(doc, "child 1 ")  # node 1 is not after `inner`, or has two parents
    doc = _doc(fitted[2])
    tree = doc["trees"][0]
    tree["left"][0] = tree["right"][0] = -1  # the rest of the tree hangs from nothing
    tree["feature"][0] = -1
    _refused(doc, "node 1 is no node's child")


def test_not_json_nan_non_ascii_and_oversize_are_refused():
    _refused(b"\x80abc", "not ASCII")
    _refused(b"{nope", "not JSON")
    _refused(b'{"a": NaN}', "not a number JSON allows")
    _refused(b"[" * 100_000 + b"]" * 100_000, "")
    _refused(b" " * (F.MAX_FOREST_BYTES + 1), "over")


def test_a_chain_deeper_than_the_bound_is_refused():
    n = F.MAX_DEPTH + 2  # a chain of internal nodes, each with one leaf
    nodes = 2 * n + 1
    feature, left, right, size = [], [], [], []
    for i in range(nodes):
        if i % 2 == 0 and i < nodes - 1:
            feature.append(0)
            left.append(i + 1)
            right.append(i + 2)
        else:
            feature.append(-1)
            left.append(-1)
            right.append(-1)
        size.append(0)
    for i in reversed(range(nodes)):  # sizes: leaves 1, internal the sum of its children
        size[i] = 1 if left[i] == -1 else size[left[i]] + size[right[i]]
    doc = {"format": F.FORMAT, "version": 1, "features": ["a"], "samples": size[0],
           "alert_score": 0.5, "trees": [{"feature": feature, "threshold": [0.0] * nodes,
                                          "left": left, "right": right, "size": size}]}
    _refused(doc, f"deeper than {F.MAX_DEPTH}")


def test_the_chosen_level_is_the_cheapest_candidate_by_the_proxys_counting(drive_days):
    target = SimDisks.targets["failure"].describe()
    text, figures = fit_anomaly(drive_days, FEATURES, target, seed=0)
    verified = F.verify_forest(text.encode())
    assert verified.alert_score == figures["alert_score"]
    candidates = figures["candidates"]
    if candidates:
        cheapest = min(candidates.values(), key=lambda c: c["cost"])
        assert cheapest["alert_score"] == figures["alert_score"]
        # each candidate's figures are outcomes.score's on the rows whose outcome is known
        x = np.column_stack([drive_days[f].astype(np.float64) for f in FEATURES])
        scores = F.score(verified, x)
        known = drive_days["tick"] <= drive_days["tick"].max() - target["horizon_ticks"]
        s = outcomes.score(drive_days["drive_id"][known], drive_days["tick"][known],
                           drive_days["failed"][known],
                           scores[known] >= cheapest["alert_score"], target["horizon_ticks"])
        assert s.false_alarms == cheapest["false_alarms"]


def test_too_few_events_keep_the_default_level():
    scores = np.linspace(0.3, 0.8, 1000)
    keys = np.arange(1000) % 10
    ticks = np.arange(1000) // 10
    level, judged = choose_alert_score(scores, keys, ticks, np.zeros(1000, bool), 5, 100, 1)
    assert judged["candidates"] == {} and level == pytest.approx(np.quantile(scores, 0.999))


def test_forest_scores_are_the_daemons(fitted):
    model, x, text = fitted
    np.testing.assert_allclose(forest_scores(model, x[:100]),
                               F.score(F.verify_forest(text.encode()), x[:100]), rtol=1e-12)
