"""Rows no portion can hold: checked, split off and kept beside the store, never dropped.

A write-ahead line that is not a row of the store's schema (damaged, or written
by another version) and a row pyarrow can never encode (a value out of its
column's range or of the wrong type) go to the store's `quarantine/` directory
as JSON lines, where an operator can read them; the store counts and logs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from .durable import write_durably

QUARANTINE_DIR = "quarantine"
#: what pyarrow raises for a value it can never encode: quarantine, do not retry
ENCODE_ERRORS = (ValueError, OverflowError, TypeError, pa.ArrowInvalid, pa.ArrowTypeError,
                 pa.ArrowNotImplementedError)
_INT64 = 1 << 63


def check_line(raw: bytes, types: dict[str, pa.DataType]) -> tuple[dict | None, str]:
    """A write-ahead line as a row of a schema with these column types, or None and why not."""
    try:
        row = json.loads(raw)
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    for name, value in row.items():
        kind = types.get(name)
        if kind is None or value is None:
            continue
        if not fits(kind, value):
            return None, f"field {name!r}: {value!r} does not fit {kind}"
    return row, ""


def split_unencodable(columns: dict[str, list], schema: pa.Schema
                      ) -> tuple[dict[str, list], list[dict]]:
    """The columns without the rows pyarrow cannot encode, and those rows."""
    names = list(columns)
    rows = [dict(zip(names, values, strict=True))
            for values in zip(*columns.values(), strict=True)]
    bad: set[int] = set()
    for f in schema:
        values = columns[f.name]
        try:
            pa.array(values, type=f.type)
            continue
        except ENCODE_ERRORS:
            pass
        for i, value in enumerate(values):
            try:
                pa.array([value], type=f.type)
            except ENCODE_ERRORS:
                bad.add(i)
    good = {name: [v for i, v in enumerate(vals) if i not in bad]
            for name, vals in columns.items()}
    return good, [rows[i] for i in sorted(bad)]


def quarantine(directory: Path, name: str, lines: list[bytes]) -> Path:
    """Keep `lines` as `directory/quarantine/name`, durably (idempotent); its path."""
    target = directory / QUARANTINE_DIR / name
    target.parent.mkdir(exist_ok=True)
    write_durably(target, b"".join(line + b"\n" for line in lines))
    return target


def row_lines(rows: list[dict]) -> list[bytes]:
    """Rows as JSON lines (a value JSON cannot hold is written as its text)."""
    return [json.dumps(row, separators=(",", ":"), default=str).encode() for row in rows]


def fits(kind: pa.DataType, value: object) -> bool:
    """Can `value` (from JSON) be a cell of a column of type `kind`?"""
    if pa.types.is_integer(kind) or pa.types.is_timestamp(kind):
        return isinstance(value, int) and not isinstance(value, bool) and \
            -_INT64 <= value < _INT64
    if pa.types.is_floating(kind):
        return isinstance(value, float) or (
            isinstance(value, int) and not isinstance(value, bool) and abs(value) < _INT64)
    if pa.types.is_string(kind):
        return isinstance(value, str)
    if pa.types.is_boolean(kind):
        return isinstance(value, bool)
    return True
