"""Parsing and formatting of the sysfs-style text attributes.

Every value written to a control file arrives as one write(2); it is checked
whole here, before anything changes, and refused with a reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from mlfs.abi import Knob, KnobValue, KnobValueError
from mlfs.base.errors import invalid

MAX_WRITE = 4096


def escape_input(data: bytes, limit: int = 512) -> str:
    """Show an input on one line: newlines as \\n, other control bytes as \\xNN."""
    if data.endswith(b"\n"):
        data = data[:-1]
    out = []
    for byte in data[:limit]:
        if byte == 0x0A:
            out.append("\\n")
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    if len(data) > limit:
        out.append("...")
    return "".join(out)


def decode_text(data: bytes) -> str:
    """The written bytes as ASCII text, or a refusal saying what is wrong."""
    if len(data) > MAX_WRITE:
        raise invalid(f"write of {len(data)} bytes is over the {MAX_WRITE}-byte limit")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise invalid("input is not ASCII text") from None
    for ch in text:
        if ch not in "\n\t" and not 0x20 <= ord(ch) < 0x7F:
            raise invalid(f"control character \\x{ord(ch):02x} in input")
    return text


def one_word(data: bytes, what: str) -> str:
    """A single-value attribute: one word, an optional trailing newline."""
    words = decode_text(data).split()
    if len(words) != 1:
        raise invalid(f"{what} takes exactly one word")
    return words[0]


#: a decimal number as people write it: no `1_000` (Python's float() takes
#: it), no hex
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
#: the longest `ttl`: ~31 years of 1 s ticks; far inside the journal's int64
#: column, so every accepted value can be sealed
MAX_TTL = 10**9
_NON_FINITE = ("nan", "inf", "infinity")  # numbers, refused below as not finite


def parse_float(text: str, what: str) -> float:
    """A finite decimal number (any finite float64 fits a dataset or journal column)."""
    if not _NUMBER.fullmatch(text) and text.lower().lstrip("+-") not in _NON_FINITE:
        raise invalid(f"{what}: {text!r} is not a number (decimal: 1000, 0.5, 1e3)")
    value = float(text)
    if not math.isfinite(value):
        raise invalid(f"{what}: {text!r} is not a finite number")
    return value


def parse_ttl(text: str) -> int:
    """A whole number of ticks, 1..MAX_TTL."""
    if not text.isdigit() or len(text) > 10 or not 1 <= int(text) <= MAX_TTL:
        raise invalid(f"ttl: {text!r} is not a whole number of ticks in 1..{MAX_TTL}")
    return int(text)


@dataclass(frozen=True)
class RecommendationLine:
    """One checked line of `recommend`."""

    line: str
    knobs: dict[str, KnobValue]
    expect: float | None
    ttl: int | None


def parse_recommendations(
    data: bytes, knobs: dict[str, Knob], controlled: set[str]
) -> list[RecommendationLine]:
    """Check a whole write of `recommend`; every line must be valid or none is."""
    text = decode_text(data)
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        raise invalid("empty recommendation")
    return [_parse_line(line, knobs, controlled) for line in lines]


def _parse_line(line: str, knobs: dict[str, Knob], controlled: set[str]) -> RecommendationLine:
    values: dict[str, KnobValue] = {}
    expect: float | None = None
    ttl: int | None = None
    seen: set[str] = set()
    for token in line.split():
        key, sep, raw = token.partition("=")
        if not sep or not key or not raw:
            raise invalid(f"malformed token {token!r} (expected name=value)")
        if key in seen:
            raise invalid(f"{key} given twice")
        seen.add(key)
        if key == "expect":
            expect = parse_float(raw, "expect")
        elif key == "ttl":
            ttl = parse_ttl(raw)
        elif key not in knobs:
            raise invalid(f"unknown knob {key!r}")
        elif key not in controlled:
            raise invalid(f"knob {key!r} is not controlled by this model")
        else:
            try:
                values[key] = knobs[key].parse(raw)
            except KnobValueError as exc:
                raise invalid(str(exc)) from None
    if not values:
        raise invalid("no knob=value pair")
    return RecommendationLine(line, values, expect, ttl)


def format_value(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan\n"
        return f"{value:.6g}\n"
    return f"{value}\n"
