"""The live shadow book and the offline score agree on the same rows, tick by tick."""

import math

import numpy as np
from mlfs.backends.sim_disks import DrivePopulation, backblaze_rule, smart_threshold_rule

from mlfs.base.outcomes import score
from mlfs.core.models.predictor import PredictorEfficiency, ShadowBook

HORIZON = 30


def test_live_book_gives_the_offline_figures_for_the_model_and_the_rule():
    pop = DrivePopulation(drives=2000, seed=11)
    book = ShadowBook(HORIZON)
    eff = PredictorEfficiency(miss_cost=10.0, false_alarm_cost=1.0)
    days = []
    for tick in range(240):
        day = pop.day()
        p = 1 - np.exp(-0.05 * day["errors_delta_7d"])  # a crude score, 0 when quiet
        model_alert = p >= 0.2
        eff.update(book.add(tick, day["drive_id"], day["failed"], p, model_alert,
                            smart_threshold_rule(day)))
        day["tick"] = np.full(2000, tick)
        day["model_alert"] = model_alert
        days.append(day)
    eff.update(book.flush())
    rows = {k: np.concatenate([d[k] for d in days]) for k in days[0]}
    offline_model = score(rows["drive_id"], rows["tick"], rows["failed"], rows["model_alert"],
                          HORIZON)
    offline_rule = score(rows["drive_id"], rows["tick"], rows["failed"],
                         smart_threshold_rule(rows), HORIZON)
    assert offline_model.events >= 5
    assert eff.model.score() == offline_model
    assert eff.rule.score() == offline_rule
    assert offline_model.caught > offline_rule.caught  # the error trend beats the threshold
    ratio, z = eff.estimate()
    assert ratio > 1 and z > 0


def test_the_estimate_is_unknown_until_enough_events_are_judged():
    book = ShadowBook(horizon=5)
    eff = PredictorEfficiency(10.0, 1.0, min_events=3)
    keys = np.arange(100)
    for tick in range(20):
        events = np.zeros(100, bool)
        if tick == 10:
            events[7] = True  # one event only
        eff.update(book.add(tick, keys, events, np.zeros(100), np.zeros(100, bool),
                            backblaze_rule({f"smart_{a}_raw": np.zeros(100, int)
                                            for a in (5, 187, 188, 197, 198)})))
    ratio, z = eff.estimate()
    assert math.isnan(ratio) and math.isnan(z)


def test_a_tick_over_the_row_bound_is_cut_and_the_cut_counted():
    book = ShadowBook(horizon=2, max_rows=10)
    book.add(0, np.arange(25), np.zeros(25, bool), np.zeros(25), np.zeros(25, bool),
             np.zeros(25, bool))
    assert book.rows_dropped == 15
    assert len(book.flush()) == 10
