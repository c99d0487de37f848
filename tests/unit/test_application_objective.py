"""An application's objective, for any backend (issue 33 item 4), in virtual time.

`objective = "application"` on sim.readahead: the figure comes only from writes
to `objective`, a write may cover a past window, and a tick no figure covers is
recorded with a missing objective -- never the backend's own throughput.
"""

from __future__ import annotations

import errno
import math

import pytest
from mlfs.backends import create_subsystems

from mlfs.abi import SettingError, split_core_settings
from mlfs.base.errors import Refused
from mlfs.config import parse_config
from mlfs.core.mount.exchange import Exchange

TICK = 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def application_runtime(tmp_path, clock, **settings):
    entry = {"backend": "sim.readahead", "seed": 3, "tick_seconds": TICK,
             "objective": "application", **settings}
    subsystems = create_subsystems([entry])
    exchange = Exchange(parse_config("[modes]\nsilence_seconds = 600.0\n", "test"),
                        tmp_path, subsystems, clock=clock)
    return exchange.runtimes["sim.readahead"]


def tick(runtime, clock) -> None:
    clock.now += TICK
    runtime.tick()


def rows(runtime) -> list[dict]:
    runtime.dataset.seal_now()
    return runtime.dataset.read_all().to_pylist()


def test_a_figure_written_once_a_second_covers_both_half_second_ticks_of_its_window(tmp_path):
    clock = Clock()
    runtime = application_runtime(tmp_path, clock)
    assert runtime.info()["objective"]["name"] == "application"
    for second in range(6):
        tick(runtime, clock)
        tick(runtime, clock)
        clock.now += 0.05  # the application reports a little after the second ends
        runtime.write_objective(f"{100 + second}.5 window=1.0\n".encode())
    runtime.close()
    got = [(r["tick"], r["objective"]) for r in rows(runtime)]
    assert got == [(t, 100 + t // 2 + 0.5) for t in range(12)], \
        "each figure is the objective of the two ticks its second held, and nothing else"


def test_a_tick_no_figure_covers_is_recorded_missing_never_with_the_backends_measure(
        tmp_path):
    clock = Clock()
    runtime = application_runtime(tmp_path, clock, objective_wait_seconds=1.0)
    tick(runtime, clock)
    runtime.write_objective(b"7.0\n")  # a bare figure: the last tick only
    for _ in range(6):  # the application goes quiet
        tick(runtime, clock)
    runtime.close()  # held ticks are recorded at close, none lost
    objectives = [r["objective"] for r in rows(runtime)]
    assert len(objectives) == 7
    assert objectives[0] == 7.0
    assert all(math.isnan(v) for v in objectives[1:]), objectives
    assert runtime.application.missing == 6


def test_a_held_row_waits_for_its_figure_then_is_released_in_tick_order(tmp_path):
    clock = Clock()
    runtime = application_runtime(tmp_path, clock, objective_wait_seconds=2.0)
    tick(runtime, clock)
    tick(runtime, clock)
    assert runtime.dataset.pending == 0, "no row before the figure or the wait"
    assert len(runtime.application.held) == 2
    runtime.write_objective(b"5 window=1\n")
    assert runtime.dataset.pending == 2
    for _ in range(5):  # 2.5 s without a figure: released as missing after the wait
        tick(runtime, clock)
    assert runtime.dataset.pending == 2 + 1, "only the tick past its wait is recorded"
    runtime.close()
    assert [r["tick"] for r in rows(runtime)] == list(range(7))


def test_the_models_efficiency_counts_only_ticks_with_a_figure(tmp_path):
    clock = Clock()
    runtime = application_runtime(tmp_path, clock, objective_wait_seconds=1.0)
    proxy = runtime.create_model("m")
    proxy.start()
    proxy.set_mode(b"collaboration\n")
    proxy.recommend(b"read_ahead_kb=512 ttl=1000\n")
    for second in range(40):
        tick(runtime, clock)
        tick(runtime, clock)
        if second % 2 == 0:  # half the seconds have a figure
            runtime.write_objective(b"50 window=1\n")
    runtime.close()
    proxy.feedback.seal_now()
    observed = [r["observed"] for r in proxy.feedback.read_all().to_pylist()]
    assert any(v == 50.0 for v in observed) and any(math.isnan(v) for v in observed)
    assert all(v == 50.0 or math.isnan(v) for v in observed), \
        "a missing objective is never filled with another measure"


def test_window_is_refused_where_the_objective_is_the_backends_own(tmp_path):
    from mlfs.backends.sim_readahead import SimReadahead

    exchange = Exchange(parse_config("", "test"), tmp_path, [SimReadahead(seed=1)])
    runtime = exchange.runtimes["sim.readahead"]
    with pytest.raises(Refused) as info:
        runtime.write_objective(b"12 window=1.0\n")
    assert info.value.errno == errno.EINVAL
    assert "application" in info.value.reason
    runtime.write_objective(b"12\n")  # today's rule: the next tick's objective
    runtime.tick()
    assert rows(runtime)[-1]["objective"] == 12.0
    runtime.close()


@pytest.mark.parametrize("data", [b"nan window=1\n", b"5 window=0\n", b"5 window=-1\n",
                                  b"5 window=7200\n", b"5 span=1\n", b"5 window=1 x\n",
                                  b"window=1\n", b""])
def test_a_bad_figure_is_refused_with_einval_and_changes_nothing(tmp_path, data):
    clock = Clock()
    runtime = application_runtime(tmp_path, clock)
    tick(runtime, clock)
    with pytest.raises(Refused) as info:
        runtime.write_objective(data)
    assert info.value.errno == errno.EINVAL
    assert not runtime.application.figures
    runtime.close()


@pytest.mark.parametrize("entry, key", [
    ({"objective_unit": "MB/s"}, "objective_unit"),
    ({"objective": "application", "objective_goal": "up"}, "objective_goal"),
    ({"objective": "application", "objective_wait_seconds": -1}, "objective_wait_seconds"),
])
def test_objective_settings_are_the_cores_and_checked(entry, key):
    with pytest.raises(SettingError) as info:
        split_core_settings({"backend": "sim.readahead", **entry})
    assert key in str(info.value)


def test_a_feature_objective_stays_the_backends_setting():
    core, rest = split_core_settings({"backend": "linux.vm", "objective": "pgmajfault_per_s"})
    assert core == {} and rest["objective"] == "pgmajfault_per_s"
