"""The benches' shared set-up: a sysctl a bench changes always goes back to what it was.

The sysctl is a file standing in for /proc/sys/kernel/printk_devkmsg: the machine's own
must stay `ratelimit` while other tests read the kernel log."""

from __future__ import annotations

import json

import pytest

from tests.bench.shared import emit, printk_devkmsg


@pytest.fixture
def sysctl(tmp_path):
    path = tmp_path / "printk_devkmsg"
    path.write_text("ratelimit\n")
    return path


def test_the_value_is_set_inside_and_the_original_put_back(sysctl) -> None:
    with printk_devkmsg("on", sysctl) as original:
        assert sysctl.read_text() == "on\n"
        assert original == "ratelimit"
    assert sysctl.read_text() == "ratelimit\n"


def test_an_exception_inside_the_block_still_puts_the_original_back(sysctl) -> None:
    with pytest.raises(RuntimeError, match="the bench failed"), printk_devkmsg("on", sysctl):
        raise RuntimeError("the bench failed")
    assert sysctl.read_text() == "ratelimit\n"


def test_a_value_the_kernel_does_not_take_is_refused_and_changes_nothing(sysctl) -> None:
    with pytest.raises(ValueError, match="'always' is not one of"), \
            printk_devkmsg("always", sysctl):
        pass
    assert sysctl.read_text() == "ratelimit\n"


def test_results_are_printed_and_written_as_the_same_json(tmp_path, capsys) -> None:
    results = {"records": 3, "lost": 0}
    out = tmp_path / "results.json"
    assert emit(results, str(out)) is results
    assert json.loads(capsys.readouterr().out) == results
    assert json.loads(out.read_text()) == results
    emit(results, None)
    assert json.loads(capsys.readouterr().out) == results
