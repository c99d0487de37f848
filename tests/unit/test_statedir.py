"""The state directory's format version, its upgrade steps and its safe names."""

from __future__ import annotations

import logging
import tarfile
from pathlib import Path

import pytest

from mlfs.base import statedir

DATA = Path(__file__).resolve().parent.parent / "data"


def _v1(tmp_path: Path) -> Path:
    """The format-1 directory made by mlfs at f0369e4 (tests/data/README.md)."""
    with tarfile.open(DATA / "state-format-1.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "state"


def test_a_new_directory_gets_the_current_format(tmp_path):
    state = tmp_path / "new"
    assert statedir.upgrade(state) == statedir.FORMAT_VERSION
    assert (state / "format").read_text() == f"{statedir.FORMAT_VERSION}\n"


def test_a_format_1_directory_is_upgraded_in_place_and_says_so(tmp_path, caplog):
    state = _v1(tmp_path)
    before = sorted(p.relative_to(state) for p in state.rglob("*"))
    assert statedir.read_version(state) == 1
    with caplog.at_level(logging.WARNING, "mlfs.state"):
        assert statedir.upgrade(state) == 1
    assert (state / "format").read_text() == "4\n"
    assert "upgraded from format 1 to 2" in caplog.text
    assert "upgraded from format 2 to 3" in caplog.text
    assert "upgraded from format 3 to 4" in caplog.text
    after = sorted(p.relative_to(state) for p in state.rglob("*"))
    assert after == sorted([*before, Path("format")])  # v1 -> v4 moves nothing
    caplog.clear()
    with caplog.at_level(logging.WARNING, "mlfs.state"):
        assert statedir.upgrade(state) == 4  # nothing left to do, and quiet
    assert "upgraded" not in caplog.text


def test_every_step_is_registered_in_order_up_to_the_current_format():
    starts = [start for start, _ in statedir.STEPS]
    assert starts == list(range(1, statedir.FORMAT_VERSION))


def test_the_v1_to_v2_step_changes_no_file(tmp_path):
    state = _v1(tmp_path)
    snapshot = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    step = dict(statedir.STEPS)[1]
    assert "unchanged" in step(state)
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == snapshot


def test_the_v2_to_v3_step_changes_no_file_and_keeps_json_write_ahead_files(tmp_path):
    state = _v1(tmp_path)
    snapshot = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    step = dict(statedir.STEPS)[2]
    assert "replay unchanged" in step(state)
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == snapshot


def test_a_newer_format_is_refused_and_left_untouched(tmp_path):
    (tmp_path / "format").write_text("99\n")
    with pytest.raises(statedir.FormatError, match="format 99 is newer than this mlfs"):
        statedir.check(tmp_path)
    with pytest.raises(statedir.FormatError, match="format 99 is newer"):
        statedir.upgrade(tmp_path)
    assert (tmp_path / "format").read_text() == "99\n"


def test_a_damaged_format_file_is_set_aside_and_the_steps_run_again(tmp_path, caplog):
    state = _v1(tmp_path)
    (state / "format").write_bytes(b"\x00two")
    with caplog.at_level(logging.ERROR, "mlfs.state"):
        assert statedir.upgrade(state) == 1
    assert (state / "format").read_text() == f"{statedir.FORMAT_VERSION}\n"
    assert (state / "format.damaged").read_bytes() == b"\x00two"
    assert "format is damaged" in caplog.text


@pytest.mark.parametrize("name", ["../escape", "..", ".", "a/b", "/abs", "", "Upper", "x" * 65,
                                  "events", "ledger", "mlfs.pid"])
def test_a_subsystem_directory_never_leaves_the_state_directory(tmp_path, name):
    assert statedir.subsystem_name_problem(name)
    with pytest.raises(ValueError):
        statedir.subsystem_dir(tmp_path, name)


def test_a_symlinked_subsystem_directory_pointing_out_is_refused(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "sim").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside"):
        statedir.subsystem_dir(tmp_path / "state", "sim")
    assert statedir.subsystem_dir(tmp_path / "state", "sim.readahead") == \
        (tmp_path / "state" / "sim.readahead").resolve()


def test_a_damaged_pid_file_is_set_aside_and_names_no_daemon(tmp_path, caplog):
    (tmp_path / "mlfs.pid").write_text("12ab\n")
    with caplog.at_level(logging.ERROR, "mlfs.state"):
        assert statedir.live_daemon(tmp_path) is None
    assert (tmp_path / "mlfs.pid.damaged").exists() and not (tmp_path / "mlfs.pid").exists()
    assert "mlfs.pid is damaged" in caplog.text
    (tmp_path / "mlfs.pid").write_text("1\n")  # init: alive, but not mlfs
    assert statedir.live_daemon(tmp_path) is None
