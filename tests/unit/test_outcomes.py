"""The one judgement of predictions: hits, false alarms, misses and lead time, by hand."""

import math

import numpy as np

from mlfs.base.outcomes import Score, efficiency, score, threshold_at_false_alarm_rate


def _rows():
    # two drives over ticks 0..9; drive 1 fails at tick 8, drive 2 never
    keys = np.array([1] * 9 + [2] * 10)
    ticks = np.array(list(range(9)) + list(range(10)))
    events = np.zeros(19, bool)
    events[8] = True
    return keys, ticks, events


def test_an_alert_within_the_horizon_before_the_event_is_a_hit_with_its_lead():
    keys, ticks, events = _rows()
    alerts = np.zeros(19, bool)
    alerts[[5, 6]] = True  # drive 1 at ticks 5 and 6: 3 and 2 ticks ahead
    s = score(keys, ticks, events, alerts, horizon=3)
    assert (s.events, s.caught, s.false_alarms, s.lead_ticks) == (1, 1, 0, (3,))
    assert s.recall == 1.0 and s.misses == 0


def test_an_alert_before_the_horizon_is_a_false_alarm_and_the_event_a_miss():
    keys, ticks, events = _rows()
    alerts = np.zeros(19, bool)
    alerts[2] = True  # 6 ticks ahead with a horizon of 3
    s = score(keys, ticks, events, alerts, horizon=3)
    assert (s.caught, s.false_alarms, s.misses) == (0, 1, 1)


def test_the_events_own_tick_counts_neither_way_and_other_keys_are_false_alarms():
    keys, ticks, events = _rows()
    alerts = np.zeros(19, bool)
    alerts[8] = True  # on the failure tick itself: warns nobody
    alerts[9 + 4] = True  # drive 2 never fails
    s = score(keys, ticks, events, alerts, horizon=3)
    assert (s.caught, s.false_alarms) == (0, 1)
    # negatives: drive 1's ticks 0..4 (5..7 positive, 8 its own) and drive 2's ten
    assert s.negatives == 5 + 10
    assert math.isclose(s.false_alarm_rate, 1 / 15)


def test_rows_in_any_order_give_the_same_score():
    keys, ticks, events = _rows()
    alerts = np.zeros(19, bool)
    alerts[[6, 12]] = True
    order = np.random.default_rng(3).permutation(19)
    a = score(keys, ticks, events, alerts, 3)
    b = score(keys[order], ticks[order], events[order], alerts[order], 3)
    assert a == b


def test_threshold_keeps_false_alarms_at_or_under_the_rate():
    p = np.linspace(0, 1, 1001)
    negative = np.ones(1001, bool)
    tau = threshold_at_false_alarm_rate(p, negative, 0.01)
    assert (p >= tau).sum() <= 10
    assert (p >= np.nextafter(tau, -1) - 1e-3).sum() >= 10


def test_efficiency_is_the_rules_cost_over_the_models():
    model = Score(events=10, caught=8, false_alarms=5, negatives=1000, lead_ticks=(1,) * 8)
    rule = Score(events=10, caught=2, false_alarms=1, negatives=1000, lead_ticks=(1, 1))
    # costs: a miss 10, a false alarm 1 -> model 2*10+5 = 25, rule 8*10+1 = 81
    assert math.isclose(efficiency(model, rule, 10.0, 1.0), 81 / 25)
