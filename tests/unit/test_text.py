"""Parsing of the text attributes: recommendations, one-word values, escaping, names."""

from __future__ import annotations

import errno

import pytest

from mlfs.abi import NAME, Knob, column_name, knob_column
from mlfs.base.errors import Refused
from mlfs.base.text import (
    MAX_WRITE,
    decode_text,
    escape_input,
    format_value,
    one_word,
    parse_float,
    parse_recommendations,
)

KNOBS = {
    "read_ahead_kb": Knob("read_ahead_kb", "int", default=128, min=0, max=4096),
    "nr_requests": Knob("nr_requests", "int", default=64, min=4, max=1024),
    "scheduler": Knob("scheduler", "choice", default="none",
                      choices=("none", "mq-deadline", "bfq")),
}
ALL = set(KNOBS)


def refused(data: bytes, controlled=ALL) -> str:
    with pytest.raises(Refused) as info:
        parse_recommendations(data, KNOBS, set(controlled))
    assert info.value.errno == errno.EINVAL
    return info.value.reason


def test_one_write_may_carry_several_lines_each_with_knobs_expect_and_ttl():
    lines = parse_recommendations(
        b"read_ahead_kb=256\n  nr_requests=8 scheduler=bfq expect=812.5 ttl=30 \n\n",
        KNOBS, ALL)
    assert len(lines) == 2
    assert lines[0].knobs == {"read_ahead_kb": 256}
    assert (lines[0].expect, lines[0].ttl) == (None, None)
    assert lines[1].knobs == {"nr_requests": 8, "scheduler": "bfq"}
    assert (lines[1].expect, lines[1].ttl) == (812.5, 30)
    assert lines[1].line == "nr_requests=8 scheduler=bfq expect=812.5 ttl=30"


def test_knob_bounds_are_inclusive():
    assert parse_recommendations(b"read_ahead_kb=0", KNOBS, ALL)[0].knobs == {"read_ahead_kb": 0}
    assert parse_recommendations(b"read_ahead_kb=4096", KNOBS, ALL)[0].knobs == {
        "read_ahead_kb": 4096}


@pytest.mark.parametrize("data, reason", [
    (b"", "empty"),
    (b"\n\n", "empty"),
    (b"read_ahead_kb", "malformed"),
    (b"read_ahead_kb=", "malformed"),
    (b"=5", "malformed"),
    (b"read_ahead_kb=1 read_ahead_kb=2", "twice"),
    (b"swappiness=10", "unknown knob"),
    (b"read_ahead_kb=4097", "above the maximum"),
    (b"read_ahead_kb=-1", "below the minimum"),
    (b"read_ahead_kb=1.5", "not an integer"),
    (b"scheduler=cfq", "not one of"),
    (b"expect=3.0", "no knob=value"),
    (b"read_ahead_kb=1 expect=nan", "not a finite number"),
    (b"read_ahead_kb=1 expect=inf", "not a finite number"),
    (b"read_ahead_kb=1 expect=fast", "not a number"),
    (b"read_ahead_kb=1 ttl=0", "ttl"),
    (b"read_ahead_kb=1 ttl=-3", "ttl"),
    (b"read_ahead_kb=1 ttl=2.5", "ttl"),
    (b"read_ahead_kb=1\x00", "control character"),
    (b"read_ahead_kb=1\r\n", "control character"),
    ("read_ahead_kb=\u0662".encode(), "not ASCII"),
])
def test_malformed_or_out_of_range_lines_are_refused_with_a_reason(data, reason):
    assert reason in refused(data)


def test_a_knob_not_controlled_by_the_model_is_refused():
    reason = refused(b"nr_requests=16", controlled={"read_ahead_kb"})
    assert "not controlled" in reason


def test_one_bad_line_refuses_the_whole_write():
    assert "unknown knob" in refused(b"read_ahead_kb=64\nbogus=1\n")


def test_writes_over_4096_bytes_are_refused_even_when_every_line_is_valid():
    line = b"read_ahead_kb=64\n"
    fits = line * (MAX_WRITE // len(line))
    assert len(parse_recommendations(fits, KNOBS, ALL)) == MAX_WRITE // len(line)
    assert "4096" in refused(fits + line)


def test_knob_values_are_plain_decimal_integers():
    """sysfs (kstrtoint) refuses Python-only spellings such as digit separators."""
    assert "read_ahead_kb" in refused(b"read_ahead_kb=1_000")


def test_escape_input_shows_newlines_and_control_bytes_on_one_line():
    assert escape_input(b"read_ahead_kb=1\n") == "read_ahead_kb=1"
    assert escape_input(b"a\nb\n") == "a\\nb"
    assert escape_input(b"x\x00y\x1b\x7f\xff\t") == "x\\x00y\\x1b\\x7f\\xff\\x09"
    assert escape_input(b"\n\n") == "\\n"
    shown = escape_input(b"z" * 600)
    assert shown == "z" * 512 + "..."
    assert all(0x20 <= ord(c) < 0x7F for c in escape_input(bytes(range(256))))


def test_decode_text_accepts_tabs_and_newlines_only():
    assert decode_text(b"a\tb\n") == "a\tb\n"
    with pytest.raises(Refused):
        decode_text(b"a\x0bb")


def test_one_word_takes_exactly_one_word():
    assert one_word(b"start\n", "control") == "start"
    assert one_word(b"  start  ", "control") == "start"
    for bad in (b"", b"\n", b"start stop", b"start\nstop\n"):
        with pytest.raises(Refused) as info:
            one_word(bad, "control")
        assert info.value.errno == errno.EINVAL


def test_parse_float_refuses_non_finite_numbers():
    assert parse_float("812.5", "x") == 812.5
    for bad in ("nan", "inf", "-inf", "1e400", "abc", ""):
        with pytest.raises(Refused):
            parse_float(bad, "x")


@pytest.mark.parametrize("name", ["a", "lgbm", "m0", "a.b_c-d", "0" * 64, "9lives"])
def test_model_names_accepted(name):
    assert NAME.fullmatch(name)


@pytest.mark.parametrize("name", ["", "BAD", "Lgbm", "-a", ".a", "_a", "a b", "a/b",
                                  "a" * 65, "é", "a+b"])
def test_model_names_refused(name):
    assert not NAME.fullmatch(name)


def test_column_names_use_only_safe_characters():
    assert column_name("read_ahead_kb") == "read_ahead_kb"
    assert column_name("pgpg.in-rate/s") == "pgpg_in_rate_s"
    assert knob_column("dirty.ratio") == "knob_dirty_ratio"


def test_format_value_ends_in_a_newline():
    assert format_value(128) == "128\n"
    assert format_value(float("nan")) == "nan\n"
    assert format_value(1.2744444) == "1.27444\n"
    assert format_value("bfq") == "bfq\n"
