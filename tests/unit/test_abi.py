"""The backend ABI: one definition of every shared rule, and `info` round trips."""

from __future__ import annotations

import mlfs.trainers.knob.learner as learner
from mlfs.backends.linux.vm import LinuxVM
from mlfs.backends.sim_readahead import SimReadahead

import mlfs.abi as abi
import mlfs.core.models.policy as policy

KNOBS = [
    abi.Knob("read_ahead_kb", "int", default=128, min=0, max=4096, unit="KiB"),
    abi.Knob("nr_requests", "int", default=64, min=4, max=1024),
    abi.Knob("scheduler", "choice", default="none", choices=("none", "mq-deadline", "bfq")),
    abi.Knob("huge", "int", default=3, min=0, max=1 << 70),
]


def test_a_knob_rebuilt_from_its_info_entry_is_the_same_knob():
    for knob in KNOBS:
        assert abi.Knob.from_info(knob.name, knob.describe()) == knob
    for knob in [*SimReadahead().knobs.values(), *LinuxVM().knobs.values()]:
        assert abi.Knob.from_info(knob.name, knob.describe()) == knob


def test_grid_and_tie_break_are_the_same_from_a_knob_and_from_its_info_entry():
    for knob in KNOBS:
        info = knob.describe()
        grid = abi.candidate_values(knob)
        assert grid == abi.candidate_values(info)
        assert len(grid) <= abi.MAX_VALUES_PER_KNOB + 1 and knob.default in grid
        assert [abi.distance_from_default(knob, v) for v in grid] == [
            abi.distance_from_default(info, v) for v in grid]
        assert abi.distance_from_default(knob, knob.default) == 0.0


def test_proxy_and_trainer_use_the_abi_rules_not_copies():
    assert policy.candidate_values is abi.candidate_values
    assert policy.distance_from_default is abi.distance_from_default
    assert learner.candidate_values is abi.candidate_values
    assert learner.knob_column is abi.knob_column
    assert learner.column_name is abi.column_name


def test_blocking_is_declared_false_by_default_and_true_for_real_backends():
    assert abi.Subsystem.blocking is False
    assert SimReadahead().blocking is False
    assert LinuxVM().blocking is True


def test_names_and_columns():
    assert abi.NAME.fullmatch("linux.block.sda") and not abi.NAME.fullmatch("Linux")
    assert not abi.NAME.fullmatch("a" * 65) and not abi.NAME.fullmatch("../x")
    assert abi.knob_column("dirty.ratio") == "knob_dirty_ratio"
    assert abi.column_name("pgpg.in-rate/s") == "pgpg_in_rate_s"


def test_built_in_subsystems_pass_the_serving_check_and_a_column_clash_does_not():
    assert abi.subsystem_problems(SimReadahead()) == []
    assert abi.subsystem_problems(LinuxVM()) == []
    clash = SimReadahead()
    clash.features = {**clash.features, "tick": "int64", "odd": "string"}
    problems = abi.subsystem_problems(clash)
    assert any("column tick is taken by the core" in p for p in problems)
    assert any("'odd': type 'string'" in p for p in problems)
