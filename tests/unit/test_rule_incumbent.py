"""A predictor's incumbent is the rule it is shadowed against (mlfs/core/models/predictor.py).

Recommendation (where the model's alerts replace the rule's) needs the model to beat
the rule on outcomes: no more false alarms, and more events caught or as many with a
longer lead.  Otherwise it stays in collaboration, where the rule's alerts stand.
"""

from __future__ import annotations

from mlfs.config import parse_config
from mlfs.core.models.efficiency import EfficiencyStats
from mlfs.core.models.modes import transition
from mlfs.core.models.predictor import RuleStanding, Tally

MODES = parse_config("", "defaults").modes


def tally(caught: int, false_alarms: int, leads: list[int], events: int = 4) -> Tally:
    return Tally(events, caught, false_alarms, 1000, leads)


def test_the_failing_disk_case_keeps_the_rule():
    # issue 53: the model caught 4/4 with two false alarms, the rule 4/4 with none
    standing = RuleStanding(tally(4, 2, [9, 9, 9, 9]), tally(4, 0, [1, 1, 1, 1]), 1.5)
    assert not standing.policy_proven
    assert "false alarms 2 (rule 0)" in standing.why
    assert standing.text().endswith("model_beats_rule no\n")


def test_lead_time_at_no_more_false_alarms_beats_the_rule():
    assert RuleStanding(tally(4, 0, [9, 8, 9, 7]), tally(4, 0, [1, 1, 2, 1]), 1.1).policy_proven
    assert RuleStanding(tally(4, 1, [9, 8, 9, 7]), tally(3, 1, [1, 1, 2]), 1.1).policy_proven
    # as many caught, as early, as few false alarms: a tie, the rule stays
    assert not RuleStanding(tally(4, 0, [2, 2, 2, 2]), tally(4, 0, [2, 2, 2, 2]),
                            1.0).policy_proven
    # nothing judged yet: not proven
    assert not RuleStanding(Tally(), Tally(), float("nan")).policy_proven


def test_promotion_to_recommendation_waits_for_the_outcomes():
    stats = EfficiencyStats(1.6, 20.0, 40, 1000, float("nan"), episodes=40)
    keeps = RuleStanding(tally(4, 2, [9, 9, 9, 9]), tally(4, 0, [1, 1, 1, 1]), 1.6)
    assert transition("collaboration", stats, MODES, lambda: keeps) is None
    wins = RuleStanding(tally(4, 0, [9, 9, 9, 9]), tally(4, 0, [1, 1, 1, 1]), 1.6)
    switch = transition("collaboration", stats, MODES, lambda: wins)
    assert switch.mode == "recommendation" and "against the rule" in switch.why
