"""The predictor's incumbent is the best single-column threshold rule found on its own
labelled outcomes (mlfs/core/models/rule_incumbent.py): the sweep picks the column that
separates failures, keeps the declared rule on a tie, and holds bounded memory."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from mlfs.abi import Target
from mlfs.core.models.predictor import ShadowBook, Tally
from mlfs.core.models.rule_incumbent import (
    MIN_EVENTS,
    RuleIncumbent,
    RuleSweep,
    clearly_better,
    sweep_columns,
)

TARGET = Target(name="failure", key="id", event="failed", rule="rule_alert",
                horizon_ticks=10)
ENTITIES = 40


def population(ticks: int = 240, seed: int = 3):
    """Entities failing every so often: `wear` climbs over the 8 ticks before a failure
    (from 0-2 noise to 10+), `noise` is noise; the declared rule alerts only on the
    tick before a failure, and only for even entities (it catches about half, lead 1)."""
    rng = np.random.default_rng(seed)
    fail_at = {e: int(rng.integers(20, 60)) for e in range(ENTITIES)}
    for tick in range(ticks):
        ids = np.arange(ENTITIES)
        until = np.array([fail_at[e] - tick for e in ids])
        failed = until == 0
        wear = np.where((until >= 1) & (until <= 8), 10 + (8 - until),
                        rng.uniform(0, 2, ENTITIES))
        rule = (until == 1) & (ids % 2 == 0)
        yield tick, ids, failed, rule, {"wear": wear, "noise": rng.uniform(0, 20, ENTITIES),
                                        "copy_of_rule": rule.astype(float)}
        for e in ids[failed].tolist():
            fail_at[e] = tick + int(rng.integers(25, 70))


def sweep_over(columns: list[str], **limits) -> tuple[RuleSweep, int]:
    book = ShadowBook(TARGET.horizon_ticks)
    sweep = RuleSweep(TARGET, columns, **limits)
    changes = 0
    for tick, ids, failed, rule, features in population():
        matrix = np.column_stack([features[c] for c in columns]).astype(np.float32)
        judged = book.add(tick, ids, failed, np.zeros(len(ids)), np.zeros(len(ids), bool),
                          rule, matrix)
        changes += sweep.update(judged)
    return sweep, changes


def test_the_sweep_picks_the_column_that_separates_failures():
    sweep, changes = sweep_over(["noise", "wear"])
    rule, score = sweep.incumbent, sweep.incumbent_score
    assert rule.column == "wear" and rule.direction == ">=" and 2 < rule.threshold <= 10
    assert score.events >= MIN_EVENTS
    assert score.caught == score.events and score.false_alarms == 0
    assert min(score.leads) >= 8  # the wear rises 8 ticks ahead; the declared rule's 1
    assert changes == 1  # it took office once and kept it
    text = sweep.text()
    assert text.startswith("incumbent failure wear >= ") and "(swept)" in text
    assert f"over {score.events} events" in text


def test_a_rule_only_as_good_as_the_declared_one_leaves_it_standing():
    sweep, changes = sweep_over(["noise", "copy_of_rule"])
    assert sweep.incumbent.declared and changes == 0
    assert sweep.best is not None and sweep.best[0].column == "copy_of_rule"
    assert sweep.incumbent_score.caught == sweep.best[1].caught  # a tie: the operator's
    assert sweep.text().startswith("incumbent failure rule_alert (declared)")


def test_one_more_catch_on_a_handful_of_events_is_not_enough():
    declared = Tally(6, 3, 0, 1000, [1, 1, 1])
    assert not clearly_better(Tally(6, 4, 0, 1000, [1, 1, 1, 1]), declared)
    assert clearly_better(Tally(6, 5, 0, 1000, [1] * 5), declared)
    assert not clearly_better(Tally(6, 6, 1, 1000, [1] * 6), declared)  # a false alarm more
    assert not clearly_better(Tally(4, 4, 0, 1000, [9] * 4), Tally(4, 1, 0, 1000, [1]))
    # as many caught, a quarter more lead and a tick: clearly better
    assert clearly_better(Tally(6, 3, 0, 1000, [4, 4, 4]), Tally(6, 3, 0, 1000, [2, 2, 3]))


def test_as_many_catches_as_early_with_half_the_false_alarms_is_clearly_better():
    # the failing disks' run 2 (docs/predictors.md): the first error against a threshold
    first_error = Tally(17, 17, 1738, 3891, [16] * 17)
    assert clearly_better(Tally(17, 17, 260, 3891, [20] * 17), first_error)
    assert not clearly_better(Tally(17, 17, 260, 3891, [15] * 17), first_error)  # later
    assert not clearly_better(Tally(17, 16, 260, 3891, [20] * 16), first_error)  # one fewer
    assert not clearly_better(Tally(17, 17, 900, 3891, [16] * 17), first_error)  # > half
    # a few false alarms halved are a few rows, not a margin
    assert not clearly_better(Tally(6, 6, 2, 1000, [3] * 6), Tally(6, 6, 6, 1000, [3] * 6))
    assert clearly_better(Tally(6, 6, 2, 1000, [3] * 6), Tally(6, 6, 7, 1000, [3] * 6))


def test_the_ring_of_labelled_rows_is_bounded():
    sweep, _ = sweep_over(["noise", "wear"], max_positive_rows=300, max_negative_rows=2000)
    assert sweep.positives.rows == 300 and sweep.negatives.rows == 2000
    assert sum(len(c["tick"]) for c in sweep.negatives.chunks) == 2000


def test_columns_are_the_numeric_ones_the_target_does_not_name():
    records = {"id": "uint32", "rule_alert": "bool", "failed": "bool", "wear": "float64",
               "name": "string", "count": "int64"}
    assert sweep_columns(records, TARGET) == ["wear", "count"]


class _Window:
    restarts = 0

    class efficiency:  # noqa: N801 (the window's attribute)
        @staticmethod
        def estimate():
            return float("nan"), float("nan")


def test_the_standing_rule_raises_alerts_and_the_model_is_judged_against_it():
    book = ShadowBook(TARGET.horizon_ticks)
    sweep = RuleSweep(TARGET, ["wear"])
    incumbent = RuleIncumbent(_Window(), {"failure": sweep})
    for tick, ids, failed, rule, features in population():
        matrix = features["wear"][:, None].astype(np.float32)
        model = features["wear"] >= 15  # late: a shorter lead than the wear rule's
        incumbent.update("failure", book.add(tick, ids, failed, np.zeros(len(ids)), model,
                                             rule, matrix))
    standing = incumbent.standing()
    assert standing.rule_name.startswith("wear >= ")
    assert standing.rule.caught == standing.rule.events > 0  # counted since it took office
    assert not standing.policy_proven  # the model's lead is shorter
    table = pa.table({"wear": [0.5, 12.0]})
    assert sweep.incumbent_alerts(table, np.array([True, False])).tolist() == [False, True]
    assert incumbent.file_text().splitlines()[-1] == "model_beats_rule no"


def test_rows_past_a_ticks_sweep_rows_are_left_out_of_the_ring():
    book = ShadowBook(2)
    sweep = RuleSweep(TARGET, ["wear"])
    table = pa.table({"wear": np.arange(5, dtype=np.float64)})
    held = sweep.features(table)[:3]  # as if the tick had more rows than the sweep reads
    ids = np.arange(5)
    book.add(0, ids, np.zeros(5, bool), np.zeros(5), np.zeros(5, bool), np.zeros(5, bool),
             held)
    judged = book.flush()
    assert np.isnan(judged.column("features")[3:]).all()
    sweep.update(judged)
    assert sweep.negatives.rows == 3
