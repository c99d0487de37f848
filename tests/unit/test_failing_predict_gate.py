"""The failing-disk bench's verdict is the proxy's own rule gate (`predictor.beats`)."""

from __future__ import annotations

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
