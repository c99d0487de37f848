"""A model's directory in the state dir: its files, their schemas, and checking them back.

STATE/<subsystem>/models/<model>/ holds `model.json` (the knobs it controls,
its pin, its lifecycle state), `policy.txt` (the uploaded policy, verified
again when read back), and two stores: `recommendations/` (the journal of
every input) and `feedback/`.  `model.json` is written last when a directory
is laid out, so a directory without it is not a model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from mlfs.base.durable import write_durably
from mlfs.base.errors import Refused, invalid

STATES = ("initialized", "started", "running", "stopped")
MODES = ("emergency", "learning", "collaboration", "recommendation")
MODEL_SETTINGS = "model.json"
POLICY_FILE = "policy.txt"


def prepare_model_directory(directory: Path, knobs: list[str]) -> None:
    """Lay out a new model's directory; its settings file, written last, marks it whole."""
    (directory / "recommendations").mkdir()
    (directory / "feedback").mkdir()
    save_settings(directory, knobs, None, "initialized")


def save_settings(directory: Path, knobs: list[str], pinned: str | None, state: str) -> None:
    write_durably(directory / MODEL_SETTINGS, json.dumps(
        {"knobs": knobs, "pinned": pinned, "state": state}).encode())


def read_settings(data: bytes, knobs: dict, subsystem: str) -> dict:
    """model.json checked field by field against the subsystem's `knobs` (Refused with
    the field's name); the knobs it names come back in the subsystem's order."""
    try:
        saved = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: [[[[...]]]]
        raise invalid(f"not JSON: {str(exc)[:100]}") from None
    if not isinstance(saved, dict):
        raise invalid(f"not a JSON object but {type(saved).__name__}")
    unknown = set(saved) - {"knobs", "pinned", "state"}
    if unknown:
        raise invalid(f"unknown field {sorted(unknown)[0][:40]!r}")
    named = saved.get("knobs", [])
    if not isinstance(named, list) or not all(isinstance(k, str) for k in named):
        raise invalid("knobs is not a list of knob names")
    for name in named:
        if name not in knobs:
            raise invalid(f"knobs: {name[:40]!r} is not a knob of {subsystem}")
    if len(set(named)) != len(named):
        raise invalid("knobs: a knob is named twice")
    pinned = saved.get("pinned")
    if pinned is not None and pinned not in MODES:
        raise invalid(f"pinned is {str(pinned)[:40]!r}, not null or one of {' '.join(MODES)}")
    state = saved.get("state", "initialized")
    if state not in STATES:
        raise invalid(f"state is {str(state)[:40]!r}, not one of {' '.join(STATES)}")
    return {"knobs": [k for k in knobs if k in named], "pinned": pinned, "state": state}


def read_back(path: Path) -> tuple[bytes | None, list[tuple[Path, str]]]:
    """A state file's bytes (None: absent or unreadable), and the damaged files found."""
    try:
        return path.read_bytes(), []
    except FileNotFoundError:
        return None, []
    except OSError as exc:
        return None, [(path, f"unreadable: {exc}")]


def read_back_settings(directory: Path, knobs: dict, subsystem: str
                       ) -> tuple[dict | None, list[tuple[Path, str]]]:
    """model.json checked (`read_settings`); None and why when absent or damaged."""
    path = directory / MODEL_SETTINGS
    data, damaged = read_back(path)
    if data is None:
        return None, damaged
    try:
        return read_settings(data, knobs, subsystem), []
    except Refused as exc:
        return None, [(path, exc.reason)]


def feedback_schema(runtime) -> pa.Schema:
    fields = [
        ("tick", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("model", pa.string()),
        ("source", pa.string()),
        ("recommendation_id", pa.int64()),
    ]
    fields += runtime.knob_fields() + runtime.feature_fields()
    fields += [
        ("expected", pa.float64()),
        ("observed", pa.float64()),
        ("baseline", pa.float64()),
        ("efficiency", pa.float64()),
        ("efficiency_vs_incumbent", pa.float64()),
        ("error", pa.float64()),
    ]
    return pa.schema(fields)
