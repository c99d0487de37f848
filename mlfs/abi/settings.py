"""Settings: checking a backend's `[[subsystem]]` table before anything is built.

Also the settings the core reads itself from the same table (an action, the
application's objective), split off before the backend sees the rest.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping

from .subsystem import APPLICATION, Objective

# --- settings: checking a backend's [[subsystem]] table before anything is built ---
#
# A `[[subsystem]]` table is checked whole, before the mount forks a daemon (and before
# `create_subsystems` builds anything): every key known, every value of the right type
# and within its range.  A mistake is then one line naming the key, not a traceback from
# a daemon that already said "mounted"; and a value that would hurt the host (a
# `tick_seconds` of 0 ticks as fast as the CPU allows, `nan` crashes the tick loop) never
# reaches a constructor.  Each backend declares its settings once as a table of checks
# (`Schema`); its `check` and `factory` both call `check_settings` with it, so the
# configuration check and the construction can never disagree.  `described` says what a
# check accepts and its default; `describe_schema` turns a Schema into what
# `mlfs backends` lists.

#: a check: returns the value to use, or raises SettingError(reason)
Check = Callable[[object], object]
Schema = Mapping[str, Check]

#: the shortest tick a backend accepts: 1,000 ticks/s already costs a core
#: (a tick is a proxy decision, a dataset row and a backend step)
MIN_TICK_SECONDS = 0.001
#: the longest tick: an hour (a model then still sees 24 rows a day)
MAX_TICK_SECONDS = 3600.0


#: a Schema entry's default when none is declared
NO_DEFAULT = object()


def described(check: Check, kind: str | None = None, default: object = NO_DEFAULT) -> Check:
    """`check` with what it accepts (`kind`) and its default, for `mlfs backends`.

    Returns `check` itself; `default` is only shown, never filled in (the
    backend applies its own defaults).
    """
    if kind is not None:
        check.kind = kind  # type: ignore[attr-defined]
    if default is not NO_DEFAULT:
        check.default = default  # type: ignore[attr-defined]
    return check


def defaults_from(schema: Schema, constructor: Callable) -> Schema:
    """Show each setting's default as `constructor`'s parameter default (declared once).

    Settings the constructor defaults to None (an optional setting left
    unset) or that already have a default keep what they have.
    """
    for param in inspect.signature(constructor).parameters.values():
        check = schema.get(param.name)
        if (check is not None and param.default is not param.empty
                and param.default is not None and not hasattr(check, "default")):
            default = param.default
            described(check, default=list(default) if isinstance(default, tuple) else default)
    return schema


def describe_schema(schema: Schema) -> list[dict]:
    """Each setting as {name, type, default?}: what a Schema accepts, in its order."""
    out = []
    for key, check in schema.items():
        entry = {"name": key, "type": getattr(check, "kind", "any")}
        if hasattr(check, "default"):
            entry["default"] = check.default
        out.append(entry)
    return out


class SettingError(ValueError):
    """One setting is wrong; `key` names it and str() is `key: reason`."""

    def __init__(self, key: str, reason: str, message: str | None = None) -> None:
        super().__init__(message or f"{key}: {reason}")
        self.key = key
        self.reason = reason


def _show(value: object) -> str:
    """A value as the TOML file spells it: true, 'word', nan, 12."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def number(lo: float, hi: float, *, integer: bool = False) -> Check:
    """An int (or, unless `integer`, a float) that is finite and in [lo, hi]."""

    def check(value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{_show(value)} is not a number")
        if integer and not isinstance(value, int):
            raise ValueError(f"{_show(value)} is not a whole number")
        if isinstance(value, int) and value.bit_length() > 64:  # no range reaches it, and
            # float() of it overflows (str() of one over 4300 digits raises, too)
            raise ValueError(f"a {value.bit_length()}-bit number is outside {lo}..{hi}")
        if not math.isfinite(value):
            raise ValueError(f"{_show(value)} is not a finite number")
        if not lo <= value <= hi:
            raise ValueError(f"{_show(value)} is outside {lo}..{hi}")
        return value if integer else float(value)

    return described(check, f"{'integer' if integer else 'number'} {_show(lo)}..{_show(hi)}")


def tick_seconds() -> Check:
    """Every backend's tick period, in one range."""
    return number(MIN_TICK_SECONDS, MAX_TICK_SECONDS)


def word(*choices: str) -> Check:
    """One of `choices`."""

    def check(value: object) -> object:
        if value not in choices:
            raise ValueError(f"{_show(value)} is not one of {', '.join(choices)}")
        return value

    return described(check, "one of " + ", ".join(choices))


def text(max_len: int = 256) -> Check:
    """A non-empty string (what it must look like is checked by its user)."""

    def check(value: object) -> object:
        if not isinstance(value, str) or not value or len(value) > max_len:
            raise ValueError(f"{_show(value)} is not a string of 1..{max_len} characters")
        return value

    return described(check, f"string (1..{max_len} characters)")


def boolean_or(*words: str) -> Check:
    """true, false, or one of `words`."""

    def check(value: object) -> object:
        if isinstance(value, bool) or value in words:
            return value
        alternatives = "".join(f" or {w!r}" for w in words)
        raise ValueError(f"{_show(value)} is not true, false{alternatives}")

    return described(check, "true, false" + "".join(f" or {w!r}" for w in words))


def table() -> Check:
    """A TOML table, checked in depth by its user (e.g. `apply`)."""

    def check(value: object) -> object:
        if not isinstance(value, Mapping):
            raise ValueError(f"{_show(value)} is not a table")
        return value

    return described(check, "table")


def list_of(item: Check, min_len: int = 1, max_len: int = 1024, unique: bool = False) -> Check:
    """A list of `min_len`..`max_len` items, each passing `item`."""

    def check(value: object) -> object:
        if not isinstance(value, list | tuple) or not min_len <= len(value) <= max_len:
            raise ValueError(f"{_show(value)} is not a list of {min_len}..{max_len} items")
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except ValueError as exc:
                raise ValueError(f"item {index + 1}: {exc}") from None
        if unique and len(set(map(repr, out))) != len(out):
            raise ValueError("items repeat")
        return out

    return described(check, f"list ({min_len}..{max_len}) of {getattr(item, 'kind', 'any')}"
                     + (", unique" if unique else ""))


def check_settings(settings: Mapping[str, object], schema: Schema,
                   internal: tuple[str, ...] = ("state_dir",)) -> dict:
    """`settings` checked against `schema`: the checked values, or SettingError.

    `internal` keys are passed by mlfs itself (the state directory), never by
    a configuration; they are passed through unchecked.
    """
    out: dict = {}
    for key, value in settings.items():
        if key in internal:
            out[key] = value
            continue
        check = schema.get(key)
        if check is None:
            near = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
            if near:  # a misspelling: the nearest name, not the whole list
                raise SettingError(key, f"unknown setting (did you mean {near[0]}?)")
            known = ", ".join(k for k in schema)
            raise SettingError(key, f"unknown setting (known: {known})")
        try:
            out[key] = check(value)
        except SettingError:
            raise
        except ValueError as exc:
            raise SettingError(key, str(exc)) from None
    return out



# ---- the settings the core reads itself ----------------------------------------------------
def _absolute_command(value: object) -> object:
    if not isinstance(value, list | tuple) or not value or not isinstance(value[0], str) \
            or not value[0].startswith("/"):
        raise ValueError(f"{_show(value)} is not a command: a list whose first item is an "
                         "absolute path (it runs without a shell)")
    return value


#: what a `[[subsystem]]` table may say to the core rather than to its backend: the
#: action command a predictor in recommendation mode runs for an alerted entity (argv,
#: no shell; the entity is the last argument), how long it may run, and how often it may
#: run for one entity.  Root's configuration file only: a run-time `load` that names one
#: is refused (docs/ABI.md, "Predictors").
ACTION_SETTINGS: Schema = {
    "action": described(lambda v: list_of(text(4096), max_len=32)(_absolute_command(v)),
                        "command: a list (1..32) of strings, the first an absolute path"),
    "action_timeout_seconds": number(0.1, 3600.0),
    "action_every_seconds": number(0.0, 1e7),
}


#: the application's objective, for any backend (`objective = "application"`): the
#: figure comes only from writes to `objective` (docs/ABI.md, "An application's objective")
OBJECTIVE_SETTINGS: Schema = {
    "objective": described(word(APPLICATION), f"{APPLICATION!r} (the core's); another value "
                           "is the backend's own setting"),
    "objective_unit": text(16),
    "objective_goal": word("max", "min"),
    "objective_wait_seconds": number(0.0, 3600.0),
}
#: every core setting of a `[[subsystem]]` table (the rest is the backend's)
CORE_SETTINGS: Schema = {**ACTION_SETTINGS, **OBJECTIVE_SETTINGS}


def _is_core(key: str, value: object) -> bool:
    if key == "objective":  # a feature name is the backend's objective setting
        return value == APPLICATION
    return key in CORE_SETTINGS


def split_core_settings(entry: Mapping[str, object]) -> tuple[dict, dict]:
    """(the core's settings of a `[[subsystem]]` table, checked; the backend's rest)."""
    core = {k: v for k, v in entry.items() if _is_core(k, v)}
    rest = {k: v for k, v in entry.items() if not _is_core(k, v)}
    checked = check_settings(core, CORE_SETTINGS)
    actions = [k for k in checked if k in ACTION_SETTINGS]
    if actions and "action" not in checked:
        raise SettingError(actions[0], "only with an `action` command")
    objectives = [k for k in checked if k in OBJECTIVE_SETTINGS and k != "objective"]
    if objectives and "objective" not in checked:
        raise SettingError(objectives[0], f"only with objective = {APPLICATION!r}")
    return checked, rest


def application_objective(core: Mapping[str, object], own: Objective) -> Objective | None:
    """The objective `core` settings give a subsystem whose own is `own`: None when
    they do not make it the application's.  The unit and goal default to the
    subsystem's own when that is already the application's (linux.sysfs's `unit`
    and `goal`), else to no unit and "max"."""
    if core.get("objective") != APPLICATION:
        return None
    already = own.name == APPLICATION
    return Objective(APPLICATION,
                     str(core.get("objective_unit", own.unit if already else "")),
                     core.get("objective_goal", own.goal if already else "max"),  # type: ignore[arg-type]
                     core.get("objective_wait_seconds", own.wait_seconds))  # type: ignore[arg-type]
