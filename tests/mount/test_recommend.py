"""Recommendations (docs/ABI.md, recommend) written by a shell and by trainers, on a real mount."""

from __future__ import annotations

import datetime as dt
import errno
import os
import re

import pytest

from tests.harness import EventStream, read_rows, sh, wait_for, write_errno

ERROR_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z) (\S+) (.+)$")


def journal(model) -> list[dict]:
    return read_rows(model / "recommendations")


def journaled(model, predicate, what: str) -> dict:
    """Wait for the journal (sealed every second here) to hold a matching row."""
    def find():
        return next((row for row in journal(model) if predicate(row)), None)
    return wait_for(find, what=what)


def prepare(mount) -> None:
    assert write_errno(mount.sub / "control", b"prepare_dataset\n") == 0


def test_an_echoed_recommendation_is_accepted_journaled_and_announced(shared_mount,
                                                                     shared_models):
    model = shared_models("accept")
    with EventStream(shared_mount.sub / "events") as events:
        done = sh(f"echo 'read_ahead_kb=300 expect=812.5' > {model}/recommend")
        assert done.returncode == 0 and done.stderr == ""
        event = events.wait_for(lambda e: e["event"] == "recommendation"
                                and e["model"] == "accept", what="recommendation event")
    assert event["status"] == "accepted"
    assert event["subsystem"] == "sim.readahead"
    row = journaled(model, lambda r: r["status"] == "accepted", "the accepted row")
    assert row["id"] == event["id"]
    assert row["line"] == "read_ahead_kb=300 expect=812.5"
    assert row["expect"] == 812.5
    assert row["ttl"] is None
    assert row["model"] == "accept"
    assert row["reason"] == ""
    assert abs(row["ts"] - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=1)
    applied = journaled(model, lambda r: r["status"] == "applied", "the applied row")
    assert applied["id"] == row["id"]
    assert applied["tick"] >= row["tick"]


def test_accepted_recommendations_are_durable_in_the_state_dir_before_the_write_returns(
        shared_mount, shared_models):
    model = shared_models("durable")
    assert write_errno(model / "recommend", b"read_ahead_kb=301\n") == 0
    state = shared_mount.state_dir / "sim.readahead/models/durable/recommendations"
    text = b""
    for wal in state.glob("wal.*.jsonl"):  # read before the portions: a seal renames
        try:                               # the portion into place, then drops the WAL
            text += wal.read_bytes()
        except FileNotFoundError:
            pass
    sealed = read_rows(state)
    assert b'"read_ahead_kb=301"' in text or any(
        r["line"] == "read_ahead_kb=301" for r in sealed)


REJECTED = [
    ("malformed", b"read_ahead_kb 64\n", "malformed token"),
    ("unknown-knob", b"swappiness=10\n", "unknown knob 'swappiness'"),
    ("out-of-range", b"read_ahead_kb=5000\n", "above the maximum 4096"),
    ("negative", b"read_ahead_kb=-8\n", "below the minimum 0"),
    ("not-integer", b"read_ahead_kb=12.5\n", "not an integer"),
    ("bad-ttl", b"read_ahead_kb=77 ttl=0\n", "ttl"),
    ("bad-expect", b"read_ahead_kb=77 expect=nan\n", "finite"),
    ("one-bad-line", b"read_ahead_kb=77\nbogus\n", "malformed token 'bogus'"),
    ("over-4096", b"read_ahead_kb=77\n" * 260, "4096"),
]


@pytest.mark.parametrize("label, data, reason", REJECTED, ids=[r[0] for r in REJECTED])
def test_a_refused_recommendation_applies_nothing_and_is_reported_everywhere(
        shared_mount, shared_models, label, data, reason):
    model = shared_models(f"refuse-{label}")
    assert write_errno(model / "recommend", b"read_ahead_kb=256\n") == 0
    with EventStream(shared_mount.sub / "events") as events:
        if len(data) < 1000 and data.count(b"\n") == 1:
            done = sh(f"echo '{data.decode().strip()}' > {model}/recommend")
            assert done.returncode == 1
            assert "echo: write error: Invalid argument" in done.stderr, done.stderr
        else:
            assert write_errno(model / "recommend", data) == errno.EINVAL
        event = events.wait_for(lambda e: e["event"] == "recommendation"
                                and e.get("model") == model.name
                                and e["status"] == "rejected", what="rejected event")
    assert reason in event["reason"]
    line = (model / "errors").read_text().splitlines()[-1]
    match = ERROR_LINE.match(line)
    assert match, line
    stamp = dt.datetime.fromisoformat(match.group(1).replace("Z", "+00:00"))
    assert abs(stamp - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=1)
    assert match.group(2) == "recommend"
    body = data[:-1]
    shown = body[:512].decode().replace("\n", "\\n") + ("..." if len(body) > 512 else "")
    assert match.group(3) == f"{event['reason']}: {shown}"
    row = journaled(model, lambda r: r["status"] == "rejected", "the rejected row")
    assert row["reason"] == event["reason"]
    assert row["id"] == event["id"]
    # nothing applied: the accepted 256 is still the one that rules ML ticks
    assert not [r for r in journal(model) if r["status"] == "accepted" and "77" in r["line"]]
    prepare(shared_mount)
    rows = read_rows(shared_mount.sub / "dataset")
    after = [r for r in rows if r["tick"] > row["tick"] and r["model"] == model.name]
    ml_values = {r["knob_read_ahead_kb"] for r in after if r["controller"] == "ml"}
    assert ml_values <= {256}, ml_values


def test_control_characters_are_escaped_in_errors(shared_mount, shared_models):
    model = shared_models("escape")
    assert write_errno(model / "recommend", b"read_ahead_kb=1\x01\x7f\xff\n") == errno.EINVAL
    assert write_errno(model / "recommend", b"junk\nmore\n") == errno.EINVAL
    assert write_errno(model / "recommend", b"read_ahead_kb=1\ttab=2\r\n") == errno.EINVAL
    lines = (model / "errors").read_text().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith(": read_ahead_kb=1\\x01\\x7f\\xff")
    assert "control character" in lines[0] or "not ASCII" in lines[0]
    assert lines[1].endswith(": junk\\nmore")
    assert lines[2].endswith(": read_ahead_kb=1\\x09tab=2\\x0d")
    for line in lines:
        assert line.isascii() and all(0x20 <= ord(c) < 0x7F for c in line)


def test_a_valid_write_to_a_model_not_started_is_einval(shared_mount, shared_models):
    model = shared_models("notstarted", start=False)
    done = sh(f"echo read_ahead_kb=64 > {model}/recommend")
    assert done.returncode == 1
    assert "echo: write error: Invalid argument" in done.stderr
    assert "not started" in (model / "errors").read_text()
    assert write_errno(model / "control", b"start\n") == 0
    assert write_errno(model / "control", b"stop\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=64\n") == errno.EINVAL
    assert (model / "state").read_text() == "stopped\n"


def test_a_valid_write_while_pinned_in_emergency_is_ebusy(shared_mount, shared_models):
    model = shared_models("pinned-emergency")
    assert write_errno(model / "mode", b"emergency\n") == 0
    done = sh(f"echo read_ahead_kb=64 > {model}/recommend")
    assert done.returncode == 1
    assert "echo: write error: Device or resource busy" in done.stderr
    assert "emergency" in (model / "errors").read_text().splitlines()[-1]
    assert write_errno(model / "recommend", b"bogus\n") == errno.EINVAL, \
        "malformed input is EINVAL in any mode"
    row = journaled(model, lambda r: r["status"] == "rejected", "the rejected row")
    assert "emergency" in row["reason"]


def test_printf_two_lines_are_two_writes_the_first_superseded(shared_mount, shared_models):
    model = shared_models("twolines")
    done = sh(f"printf 'read_ahead_kb=64\\nread_ahead_kb=256\\n' > {model}/recommend")
    assert done.returncode == 0, done.stderr
    rows = [journaled(model, lambda r, s=s: r["status"] == s, s)
            for s in ("accepted", "superseded")]
    accepted = [r for r in journal(model) if r["status"] == "accepted"]
    assert [r["line"] for r in accepted] == ["read_ahead_kb=64", "read_ahead_kb=256"]
    first, second = accepted
    assert second["id"] > first["id"]
    superseded = rows[1]
    assert superseded["id"] == first["id"]
    assert str(second["id"]) in superseded["reason"]
    assert not [r for r in journal(model) if r["status"] == "applied" and r["id"] == first["id"]]


def test_a_recommendation_with_ttl_expires(shared_mount, shared_models):
    model = shared_models("ttl")
    assert write_errno(model / "mode", b"recommendation\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=320 ttl=3\n") == 0
    accepted = journaled(model, lambda r: r["status"] == "accepted", "accepted")
    expired = journaled(model, lambda r: r["status"] == "expired", "expired")
    assert expired["id"] == accepted["id"]
    assert expired["ttl"] == 3
    assert expired["tick"] >= accepted["tick"] + 3
    knob = shared_mount.sub / "knobs/read_ahead_kb"
    wait_for(lambda: knob.read_text() == "128\n", what="the default after expiry")


def test_the_applied_value_shows_in_dataset_rows_controlled_by_ml(shared_mount, shared_models):
    model = shared_models("applied")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=333\n") == 0
    applied = journaled(model, lambda r: r["status"] == "applied", "applied")
    wait_for(lambda: (model / "state").read_text() == "running\n", what="running")
    prepare(shared_mount)
    rows = [r for r in read_rows(shared_mount.sub / "dataset") if r["tick"] >= applied["tick"]
            and r["model"] == "applied"]
    ml = [r for r in rows if r["controller"] == "ml"]
    default = [r for r in rows if r["controller"] == "default"]
    assert ml and default
    assert {r["knob_read_ahead_kb"] for r in ml} == {333}
    assert {r["knob_read_ahead_kb"] for r in default} == {128}
    assert {r["mode"] for r in rows} == {"collaboration"}
    assert abs(len(ml) - len(default)) <= 1, "collaboration is half ML"


def test_errors_keeps_the_last_100_rejected_inputs(shared_mount, shared_models):
    model = shared_models("hundred")
    for i in range(130):
        assert write_errno(model / "recommend", f"bad{i}\n".encode()) == errno.EINVAL
    lines = (model / "errors").read_text().splitlines()
    assert len(lines) == 100
    assert lines[0].endswith(": bad30")
    assert lines[-1].endswith(": bad129")
    assert all(ERROR_LINE.match(line) for line in lines)


def test_several_lines_in_one_write_are_all_accepted_the_last_one_rules(shared_mount,
                                                                        shared_models):
    model = shared_models("multiline")
    assert write_errno(model / "mode", b"recommendation\n") == 0
    fd = os.open(model / "recommend", os.O_WRONLY)
    try:
        assert os.write(fd, b"read_ahead_kb=16\nread_ahead_kb=32\nread_ahead_kb=48\n") == 51
    finally:
        os.close(fd)
    knob = shared_mount.sub / "knobs/read_ahead_kb"
    wait_for(lambda: knob.read_text() == "48\n", what="the last line in effect")
    superseded = wait_for(lambda: len([r for r in journal(model)
                                       if r["status"] == "superseded"]) == 2 or None,
                          what="two superseded rows")
    assert superseded


def test_feedback_portions_hold_expected_observed_and_error_for_ml_ticks(shared_mount,
                                                                        shared_models):
    import duckdb

    model = shared_models("feedback")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512 expect=700\n") == 0
    wait_for(lambda: list((model / "feedback").glob("*.parquet")), what="a feedback portion")
    feedback = duckdb.sql(
        f"SELECT tick, source, knob_read_ahead_kb, expected, observed, error "
        f"FROM '{model}/feedback/*.parquet' ORDER BY tick").fetchall()
    assert feedback
    for _tick, source, knob, expected, observed, error in feedback:
        assert (source, knob, expected) == ("recommendation", 512, 700.0)
        assert error == pytest.approx(observed - 700.0)
    prepare(shared_mount)
    dataset = {r["tick"]: r for r in read_rows(shared_mount.sub / "dataset")}
    for tick, *_rest, observed, _error in feedback:
        assert dataset[tick]["controller"] == "ml"
        assert dataset[tick]["model"] == "feedback"
        assert dataset[tick]["objective"] == observed
