"""The configuration in other forms: TOML with every default filled in, plain data, and
the JSON Schema of the file.

Why a module of its own: `mlfs config show` and `mlfs config schema` print these for
people and editors; the parser (parse.py) never needs them.  All are generated from the
settings' dataclasses and RANGES (settings.py), so a new setting appears in each at once.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields

from .settings import RANGES, SECTIONS, Config

#: the JSON Schema type of each Python type a setting has
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a configuration file read as TOML, for editors
    (taplo, Even Better TOML, check-jsonschema).  Generated from the one table: each
    section's dataclass (names, types, defaults) and RANGES (minimum, maximum; a number
    without an entry is >= 0), so a new setting is in it as soon as it is in the code.
    What only the loader can check (cross-field limits, a backend's own settings, the
    group existing on the host) is not in it: `mlfs config check FILE` is the authority.
    """
    from mlfs.abi import NAME_RULE

    properties = {}
    for table, cls in SECTIONS.items():
        settings = {}
        for f in fields(cls):
            kind = type(f.default)
            entry: dict = {"type": _JSON_TYPES[kind], "default": f.default}
            if kind in (int, float):
                lo, hi = RANGES.get(f"{table}.{f.name}", (0, math.inf))
                entry["minimum"] = lo
                if hi != math.inf:
                    entry["maximum"] = hi
            settings[f.name] = entry
        if "metrics_address" in settings:
            settings["metrics_address"]["minLength"] = 1
        if "host_id" in settings:
            settings["host_id"]["pattern"] = f"^$|^{NAME_RULE}$"
        properties[table] = {"type": "object", "additionalProperties": False,
                             "properties": settings}
    properties["subsystem"] = {
        "type": "array",
        "description": "one [[subsystem]] table per subsystem; its other settings are the "
                       "backend's (mlfs backends)",
        "items": {"type": "object", "required": ["backend"],
                  "properties": {"backend": {"type": "string"},
                                 "name": {"type": "string", "pattern": f"^{NAME_RULE}$"}}},
    }
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "mlfs configuration (TOML)", "type": "object",
            "additionalProperties": False, "properties": properties}


def as_toml(config: Config) -> str:
    """`config` with every setting, defaults filled in, as TOML `parse_config` reads back
    to the same Config (what `mlfs config show` prints)."""
    lines = [f"# the effective configuration of {config.source}"]
    for table in SECTIONS:
        lines += ["", f"[{table}]"]
        section = getattr(config, table)
        lines += [f"{f.name} = {_toml_value(getattr(section, f.name))}" for f in fields(section)]
    for entry in config.subsystems:
        lines += ["", "[[subsystem]]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def as_dict(config: Config) -> dict:
    """`config` as plain data (what `mlfs config show --json` prints)."""
    out: dict = {table: {f.name: getattr(getattr(config, table), f.name)
                         for f in fields(getattr(config, table))} for table in SECTIONS}
    out["subsystem"] = [dict(entry) for entry in config.subsystems]
    return out


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string (JSON's escapes are TOML's)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"{value!r} has no TOML form here")
