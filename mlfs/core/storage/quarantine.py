"""What no portion can hold: checked, split off and kept beside the store, never dropped.

One rule for both codecs of the write-ahead engine (wal.py: a tick store's JSON lines, a
record store's Arrow frames), applied by the engine's one replay path: whatever cannot be
replayed goes to the store's `quarantine/` directory, where an operator can read it, and
the store counts and logs it.

- A write-ahead line that is not a row of the store's schema (damaged, or written by
  another version) and a row pyarrow can never encode (a value out of its column's range
  or of the wrong type) are kept as JSON lines (`quarantine`).
- A damaged write-ahead file whose damage is not per line (a record store's frames) is
  kept whole, byte for byte (`keep_copy`).
- Something in a write-ahead file's place that is not a regular file (a directory, a
  FIFO, a symlink) is moved there as it is (`wal_files`): reading it could fail, block or
  lead outside the state directory, and the mount must come up.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from mlfs.base.durable import write_durably

QUARANTINE_DIR = "quarantine"
#: what pyarrow raises for a value it can never encode: quarantine, do not retry
ENCODE_ERRORS = (ValueError, OverflowError, TypeError, pa.ArrowInvalid, pa.ArrowTypeError,
                 pa.ArrowNotImplementedError)
_INT64 = 1 << 63

log = logging.getLogger("mlfs.store")


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


def keep_copy(directory: Path, name: str, data: bytes) -> Path:
    """Keep `data` (a damaged file's bytes) as `directory/quarantine/name`, durably.

    Idempotent: a copy with the same bytes is reused (a store that crashes again before
    its next seal replays the same damaged file); a different one already there keeps
    its name and this one is numbered (`name.1`, ...).
    """
    folder = directory / QUARANTINE_DIR
    folder.mkdir(exist_ok=True)
    target, number = folder / name, 0
    while True:
        try:
            if target.read_bytes() == data:
                return target
        except FileNotFoundError:
            break
        except OSError:
            pass  # a directory moved aside by wal_files, say: not ours to compare
        number += 1
        target = folder / f"{name}.{number}"
    write_durably(target, data)
    return target


def wal_files(directory: Path, pattern: str, seq: Callable[[Path], int | None]
              ) -> list[Path]:
    """The store's write-ahead files matching `pattern`, oldest first (by `seq`).

    An entry of that name that is not a regular file is moved into quarantine/ (or
    left, when even that fails) and not returned, with a WARNING either way.
    """
    found = []
    for path in directory.glob(pattern):
        if seq(path) is None:
            continue
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISREG(mode):
            found.append(path)
            continue
        kind = "a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode) \
            else "not a regular file"
        try:
            (directory / QUARANTINE_DIR).mkdir(exist_ok=True)
            target = directory / QUARANTINE_DIR / path.name
            number = 0
            while os.path.lexists(target):
                number += 1
                target = directory / QUARANTINE_DIR / f"{path.name}.{number}"
            os.rename(path, target)
        except OSError as exc:
            log.warning("%s is %s, not a write-ahead file; skipped (not moved aside: %s)",
                        path, kind, exc)
            continue
        log.warning("%s is %s, not a write-ahead file; moved to %s", path, kind, target)
    return sorted(found, key=seq)


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
