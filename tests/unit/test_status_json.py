"""`mlfs status --json`'s values: the attribute texts as JSON types (issue 32, item 4)."""

from __future__ import annotations

import pytest

from mlfs.status_view.data import json_value, machine


@pytest.mark.parametrize("text, value", [
    ("35.8346\n", 35.8346), ("8192", 8192), ("-3", -3), ("1e3", 1000.0),
    ("nan", None), ("inf", None), ("?", None), ("", None),
    ("mq-deadline", "mq-deadline"),  # a choice knob's value stays a text
])
def test_json_value_makes_numbers_numbers_and_unknowns_null(text, value):
    got = json_value(text)
    assert got == value and type(got) is type(value)


def test_an_objective_or_efficiency_whose_text_is_whole_is_still_a_float():
    """The objective file read "1098" once in CI (a sim objective whole to its printed
    digits) and `status --json` gave an int where every other read gave a float."""
    status = {"subsystems": {"s": {"objective": "1098\n", "knobs": {"k": "128"},
                                   "models": {"m": {"efficiency": "1"}}}}}
    entry = machine(status)["subsystems"]["s"]
    assert type(entry["objective"]) is float and entry["objective"] == 1098.0
    assert type(entry["models"]["m"]["efficiency"]) is float
    assert type(entry["knobs"]["k"]) is int


def test_machine_turns_an_unknown_tick_and_any_nan_into_null():
    status = {"subsystems": {"s": {"objective": "nan", "knobs": {"k": "?"}, "tick": -1,
                                   "models": {"m": {"efficiency": "0.98",
                                                    "efficiency_trend": [float("nan"), 1.0]}}}}}
    entry = machine(status)["subsystems"]["s"]
    assert (entry["objective"], entry["knobs"], entry["tick"]) == (None, {"k": None}, None)
    assert entry["models"]["m"]["efficiency"] == 0.98
    assert entry["models"]["m"]["efficiency_trend"] == [None, 1.0]
