"""The anomaly kind's inputs: the level line of `recommend`, the policy over record
columns, and the trainer's level from the proxy's judged outcomes (its feedback)."""

from __future__ import annotations

import errno
import json

import numpy as np
import pyarrow as pa
import pytest
from mlfs.backends.sim_disks import RECORDS, DrivePopulation
from mlfs.trainers.anomaly.learner import export_forest, fit_forest
from mlfs.trainers.anomaly.worker import level_from_feedback

from mlfs.base.errors import Refused
from mlfs.core.models.kinds.anomaly import forest as F
from mlfs.core.models.kinds.anomaly.proxy import AnomalyPolicy, parse_level

FEATURES = ["smart_5_raw", "errors_delta_1d", "latency_ratio"]


@pytest.mark.parametrize("line, level, ttl", [
    (b"alert_score=0.7\n", 0.7, None), (b"  alert_score=1 ttl=12  \n\n", 1.0, 12)])
def test_a_level_line_is_read(line, level, ttl):
    (parsed,) = parse_level(line)
    assert (parsed.level, parsed.ttl, parsed.expect) == (level, ttl, None)


@pytest.mark.parametrize("line, words", [
    (b"alert_score=0\n", "not an anomaly score"), (b"alert_score=nan\n", "not an anomaly"),
    (b"alert_score=0.5\nalert_score=0.6\n", "takes one line"), (b"\n", "takes one line"),
    (b"ttl=3\n", "alert_score= is missing"), (b"alert_score=0.5 alert_score=0.6\n", "is not"),
    (b"alert_score=0.5 ttl=-1\n", "not a tick count"), (b"p=0.5\n", "is not alert_score")])
def test_a_bad_level_line_is_refused_whole(line, words):
    with pytest.raises(Refused) as caught:
        parse_level(line)
    assert caught.value.errno == errno.EINVAL and words in caught.value.reason


@pytest.fixture(scope="module")
def forest_text():
    columns = DrivePopulation(drives=300, seed=5).days(60)
    x = np.column_stack([columns[f].astype(np.float64) for f in FEATURES])
    return export_forest(fit_forest(x, seed=2), FEATURES, 0.65), columns


def test_the_policy_scores_a_tick_of_records_as_the_forest_does(forest_text):
    text, columns = forest_text
    policy = AnomalyPolicy(text.encode(), RECORDS)
    table = pa.table({n: columns[n][:300] for n in RECORDS})
    x = np.column_stack([columns[f][:300].astype(np.float64) for f in FEATURES])
    np.testing.assert_array_equal(policy.score(table), F.score(policy.verified, x))
    policy.max_rows = 100  # past the step bound: the rest unscored (NaN), and counted
    cut = policy.score(table)
    assert np.isnan(cut[100:]).all() and policy.rows_cut == 200


def test_a_forest_over_a_column_the_records_lack_or_a_text_one_is_refused(forest_text):
    text, _ = forest_text
    doc = json.loads(text)
    doc["features"][0] = "colour"
    with pytest.raises(Refused, match="not a numeric record field"):
        AnomalyPolicy(json.dumps(doc).encode(), RECORDS)
    with pytest.raises(Refused, match="not a numeric record field"):
        AnomalyPolicy(text.encode(), dict(RECORDS, smart_5_raw="string"))


def _feedback(rows):
    keys, p, outcome, alert = zip(*rows, strict=True)
    return (np.asarray(p, float), np.asarray(keys), np.arange(len(rows)),
            np.asarray(outcome), np.asarray(alert, bool))


def test_the_judged_outcomes_raise_the_level_when_false_alarms_cost_more_than_catches():
    # three events caught high (0.9), and many false alarms just over the level (0.61)
    rows = [(k, 0.9, 1, True) for k in (1, 2, 3)]
    rows += [(100 + i, 0.61, 0, True) for i in range(500)]
    p, keys, ticks, outcome, alert = _feedback(rows)
    chosen = level_from_feedback(p, keys, ticks, outcome, alert, 0.6, 100.0, 1.0)
    assert chosen is not None and 0.61 < chosen <= 0.9


def test_the_level_stays_when_raising_it_would_miss_events():
    rows = [(k, 0.615, 1, True) for k in (1, 2, 3)]
    rows += [(100 + i, 0.62, 0, True) for i in range(5)]
    p, keys, ticks, outcome, alert = _feedback(rows)
    assert level_from_feedback(p, keys, ticks, outcome, alert, 0.6, 100.0, 1.0) is None


def test_too_few_judged_events_leave_the_level_alone():
    rows = [(1, 0.9, 1, True)] + [(100 + i, 0.61, 0, True) for i in range(500)]
    assert level_from_feedback(*_feedback(rows), 0.6, 100.0, 1.0) is None
