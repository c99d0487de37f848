"""The failing-disk benches' verdicts are the proxy's own rule gate (`predictor.beats`)."""

from __future__ import annotations

from mlfs.core.models.predictor import RuleStanding, Tally
from tests.bench.failing_modes import earned
from tests.bench.failing_predict import gate


def _run(model_lead, model_false, rule_lead=3.0, rule_false=False) -> dict:
    return {"model": {"lead_s": model_lead, "false_alarm": model_false},
            "first_error": {"lead_s": rule_lead, "false_alarm": rule_false}}


def test_a_model_that_buys_lead_with_false_alarms_stays_in_collaboration() -> None:
    # issue 53's failing disk: the model caught 4/4 with two false alarms, the rule 4/4
    runs = [_run(9.0, True), _run(9.0, True), _run(9.0, False), _run(9.0, False)]
    verdict = gate(runs)
    assert verdict["model_beats_incumbent"] is False
    assert "stays in collaboration" in verdict["verdict"]


def test_a_model_with_longer_leads_and_no_more_false_alarms_may_replace_the_rule() -> None:
    verdict = gate([_run(9.0, False), _run(7.0, False), _run(8.0, False)])
    assert verdict["model_beats_incumbent"] is True


def test_a_model_that_misses_an_event_the_rule_caught_never_replaces_it() -> None:
    verdict = gate([_run(None, False), _run(20.0, False), _run(20.0, False)])
    assert verdict["model_beats_incumbent"] is False


# tests.bench.failing_modes reads the gate's verdict back from the mount's own `mode`
# event: its `why` is the text `RuleStanding.why` writes, re-checked with `beats`

def _why(model: Tally, rule: Tally) -> tuple[str, bool]:
    standing = RuleStanding(model, rule, efficiency=1.4, rule_name="first_error")
    return ("efficiency 1.400 >= 1.05 (interval [1.1, 1.9] over 12 episodes, z=2.0)"
            + standing.why, standing.policy_proven)


def test_a_switch_naming_a_model_that_beats_the_rule_is_read_as_earned() -> None:
    why, proven = _why(Tally(events=6, caught=6, leads=[9, 8, 7]),
                       Tally(events=6, caught=6, leads=[5, 4, 6]))
    assert proven and earned(why)


def test_a_switch_naming_more_false_alarms_or_fewer_catches_is_read_as_unearned() -> None:
    for model, rule in (
            (Tally(events=4, caught=4, false_alarms=2, leads=[9, 9, 9, 9]),
             Tally(events=4, caught=4, leads=[3, 3, 3, 3])),
            (Tally(events=4, caught=3, leads=[20, 20, 20]),
             Tally(events=4, caught=4, leads=[3, 3, 3, 3]))):
        why, proven = _why(model, rule)
        assert not proven and not earned(why)


def test_a_switch_that_names_no_standing_is_unearned() -> None:
    assert not earned("efficiency 1.400 >= 1.05 (interval [1.1, 1.9] over 12 episodes)")
