"""The backend ABI: what a subsystem implements and the rules everyone shares.

A backend is a Python package that provides subsystems (docs/writing-a-backend.md): the
proposal's kernel subsystem, a state that can be sampled (features), knobs that
can be set, a default algorithm (the human-made policy) and an objective
measured per tick.  The exchange (mlfs.core) drives each subsystem one tick at
a time and learns nothing about its internals; the trainers (mlfs.trainers)
read what it publishes.  Three parties therefore have to agree on a few rules,
and this module is the only place they are defined:

* the interface: `Subsystem`, `Knob`, `Objective`, `Sample` and every member
  the core reads (`Subsystem.blocking`, `Sample.critical`, the `Sample.extra`
  keys `EXTRA_APPLIED`, `EXTRA_REFUSED`, `EXTRA_FOREIGN`);
* the dataset's column names (`column_name`, `knob_column`): a trainer and a
  policy address knobs by these names;
* the candidate grid and the tie-break (`candidate_values`,
  `distance_from_default`): the proxy running an uploaded policy and the
  trainer choosing a recommendation must pick the same setting from the same
  predictions, or a policy would not do what its trainer measured;
* the name pattern (`NAME`) of subsystems and models;
* the settings helpers (`Schema`, `check_settings`, `SettingError`, the checks
  `number`, `word`, `text`, ...): how a backend checks its `[[subsystem]]` table
  before anything is built, so `mlfs backends` lists what it accepts.

`ABI_VERSION` is shown in each subsystem's `info` as `abi`.  It changes only
when something here changes incompatibly (a member removed or its meaning
changed); members added with a default keep the version.  A backend is found
through the entry-point group `mlfs.backends` (see docs/writing-a-backend.md):
the entry point names a module with `check(settings)` and `factory(settings)`,
and optionally `DESCRIPTION` (one line), `SETTINGS` (its `Schema`),
`USES_STATE_DIR`, `ROOT_ONLY` and `settings_for_name(name)`.

This module and the real-knob toolkit `mlfs.backends.linux` (kernel file I/O,
the ledger of originals, the knob controller) are the two places a backend,
ours or a third party's, imports from; nothing else.

Everything here is synchronous, FUSE-free and cheap to import (no pyarrow, no
LightGBM): a third-party backend and the trainer both import it.
"""

from __future__ import annotations

import abc
import collections
import difflib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

#: the version of this interface, shown as `abi` in every subsystem's `info`
ABI_VERSION = 1

#: the entry-point group where backends register (built-ins included)
ENTRY_POINT_GROUP = "mlfs.backends"

#: names of subsystems and models: file-name safe, no path, at most 64 characters
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: the same rule as text, for messages
NAME_RULE = "[a-z0-9][a-z0-9._-]{0,63}"

KnobValue = int | str
_DECIMAL = re.compile(r"-?[0-9]{1,18}")
_COLUMN_UNSAFE = re.compile(r"[^A-Za-z0-9_]")

#: `Sample.extra` keys the core reads (all optional)
#: {knob: value}: what the kernel really has after `step` (recorded as the tick's knob value)
EXTRA_APPLIED = "applied"
#: {knob: reason}: a write the kernel refused (reported as a `knob` event)
EXTRA_REFUSED = "refused"
#: {knob: reason}: a value changed behind mlfs's back, which the backend no longer touches
EXTRA_FOREIGN = "foreign"
#: int: records the source knows it lost this tick (a ring overrun, kernel-side drops)
EXTRA_RECORDS_LOST = "records_lost"
#: [{report, kind, title, status, count}]: reports that are new or repeat (`report` events)
EXTRA_REPORTS = "reports"

#: the types a record field may have (`Subsystem.records`)
RECORD_TYPES = ("int64", "uint64", "int32", "uint32", "uint16", "uint8", "float64", "bool",
                "string", "timestamp")
#: the columns the core adds to every record row; no record field may take them
RECORD_CORE_COLUMNS = ("record_seq", "tick")

#: at most this many candidate values per int knob
MAX_VALUES_PER_KNOB = 64
#: the longest carry-over a knob may declare (`Knob.settle_ticks`), in ticks
MAX_SETTLE = 1000
#: an int knob without a maximum is searched up to this value
_UNBOUNDED_MAX = 1 << 20


class KnobValueError(ValueError):
    """A knob value is malformed or outside its range; str(err) is the reason."""


@dataclass(frozen=True)
class Knob:
    """One tunable setting: an integer range or a choice among words.

    `settle_ticks` declares the knob's carry-over: for how many ticks after a
    change the objective still shows the previous value (dirty pages written
    back during the next ticks, a readahead size that reaches only files
    opened afterwards).  0, the default, means a change acts within its tick.
    The proxy then interleaves ML and the default in episodes and leaves the
    settling ticks out of its efficiency (mlfs/core/models/efficiency.py).
    """

    name: str
    type: Literal["int", "choice"]
    default: KnobValue
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""
    settle_ticks: int = 0

    def parse(self, text: str) -> KnobValue:
        """Turn the text of `knob=value` into a value, or raise KnobValueError."""
        if self.type == "choice":
            if text not in self.choices:
                raise KnobValueError(
                    f"{self.name}: {text!r} is not one of {' '.join(self.choices)}"
                )
            return text
        if not _DECIMAL.fullmatch(text):
            raise KnobValueError(f"{self.name}: {text!r} is not an integer (plain decimal digits)")
        value = int(text, 10)
        if self.min is not None and value < self.min:
            raise KnobValueError(f"{self.name}: {value} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise KnobValueError(f"{self.name}: {value} is above the maximum {self.max}")
        return value

    def describe(self) -> dict:
        """The knob as `info` shows it."""
        out: dict = {"type": self.type, "default": self.default}
        if self.type == "choice":
            out["choices"] = list(self.choices)
        else:
            out["min"] = self.min
            out["max"] = self.max
        if self.unit:
            out["unit"] = self.unit
        if self.settle_ticks:
            out["settle_ticks"] = self.settle_ticks
        return out

    @classmethod
    def from_info(cls, name: str, spec: Mapping[str, Any]) -> Knob:
        """The knob a subsystem's `info` describes (`describe()`'s inverse).

        A trainer only sees `info`; building the same `Knob` lets it use the
        same grid and tie-break as the proxy.  A missing default is the
        minimum (int) or the first choice.
        """
        settle = int(spec.get("settle_ticks", 0))
        if spec["type"] == "choice":
            choices = tuple(str(c) for c in spec["choices"])
            return cls(name, "choice", str(spec.get("default", choices[0] if choices else "")),
                       choices=choices, unit=str(spec.get("unit", "")), settle_ticks=settle)
        lo = spec.get("min")
        hi = spec.get("max")
        default = spec.get("default", lo or 0)
        return cls(name, "int", int(default), None if lo is None else int(lo),
                   None if hi is None else int(hi), unit=str(spec.get("unit", "")),
                   settle_ticks=settle)


class Settling:
    """Tells settling ticks: a carry-over knob changed within its `settle_ticks`.

    `settle` maps a knob (or dataset column) to its settle ticks; knobs with
    0 are ignored.  Until k values of a knob were seen, its ticks count as
    settling (its value before is unknown).  The one rule for what
    `Knob.settle_ticks` means tick by tick: the proxy leaves these ticks out
    of its efficiency (mlfs/core/models/efficiency.py) and the trainer out of its fit
    (trainers/knob/learner.py), since both would otherwise credit a setting with
    what the previous one left behind.
    """

    def __init__(self, settle: Mapping[str, int]) -> None:
        self._recent = {name: collections.deque(maxlen=k)
                        for name, k in settle.items() if k > 0}

    def __bool__(self) -> bool:
        return bool(self._recent)

    def __call__(self, knobs: Mapping[str, object]) -> bool:
        """Is the tick run with `knobs` settling?  (Call once per tick, in order.)"""
        settling = False
        for name, recent in self._recent.items():
            value = knobs.get(name)
            if len(recent) < recent.maxlen or any(v != value for v in recent):
                settling = True
            recent.append(value)
        return settling


@dataclass(frozen=True)
class Objective:
    """What a subsystem's ticks are judged by: `name` in `unit`, to maximise or minimise.

    `name` APPLICATION: the application measures it and writes it to `objective`
    (mlfs.base.application); a tick's row then waits up to `wait_seconds` for the
    figure (None: twice the tick, at least 2 s) and the sample's own `objective` is
    never used."""

    name: str
    unit: str
    goal: Literal["max", "min"] = "max"
    wait_seconds: float | None = None


#: the objective an application writes (any backend: `objective = "application"`)
APPLICATION = "application"


@dataclass(frozen=True)
class Target:
    """An event a record source can predict: what a predictor model is judged on.

    Each record row is one entity (`key`: a drive, a device) at one tick; `event` is
    the boolean record field that is true on the row where the event happened (a
    failure, an I/O error), `rule` the boolean record field holding the default rule's
    alert on that row (the human-made algorithm: SMART's threshold trip, "alert after
    the first error").  An alert warns of an event 1..`horizon_ticks` ticks ahead.
    `miss_cost` and `false_alarm_cost` weigh a missed event against an alert on a row
    whose entity had no event within the horizon (docs/ABI.md, "Predictors").
    """

    name: str
    key: str
    event: str
    rule: str
    horizon_ticks: int
    miss_cost: float = 10.0
    false_alarm_cost: float = 1.0
    description: str = ""
    #: the record field whose value an action command gets as its argument (a device's
    #: name where `key` is its number); "" passes the key itself
    argument: str = ""

    def describe(self) -> dict:
        return {"key": self.key, "event": self.event, "rule": self.rule,
                "horizon_ticks": self.horizon_ticks, "miss_cost": self.miss_cost,
                "false_alarm_cost": self.false_alarm_cost, "description": self.description}


@dataclass
class Sample:
    """What one tick produced.

    `features` must have exactly the keys of `Subsystem.features`; values are
    numbers (float or int).  `objective` is the tick's measured objective
    (NaN when it could not be measured; an application writing `objective`
    overrides it).  `critical` is a reason string when the subsystem is in a
    critical state (e.g. memory pressure above threshold): the proxy then puts
    every model into emergency and runs the default algorithm.  `extra` may
    carry `EXTRA_APPLIED`, `EXTRA_REFUSED` and `EXTRA_FOREIGN` (see their
    comments); other keys are the backend's own and ignored by the core.
    """

    features: dict[str, float]
    objective: float
    critical: str | None = None
    extra: dict = field(default_factory=dict)
    #: the tick's records (a record source only, `Subsystem.records`): None, or a
    #: pyarrow RecordBatch or Table, or a numpy structured array, with exactly the
    #: declared fields; no Python object per row
    records: Any = None


class Subsystem(abc.ABC):
    """One subsystem served under MOUNT/<name>/.

    The core reads the class attributes below once, when the subsystem is
    served; they must not change afterwards (they are the dataset's schema).
    """

    #: matches `NAME`, e.g. "sim.readahead", "linux.vm", "linux.block.sda"
    name: str
    #: the backend's entry-point name, e.g. "linux.block"
    backend: str
    #: one line for `info` and `mlfs backends`
    description: str
    #: wall-clock seconds between ticks when served by a mount
    tick_seconds: float
    objective: Objective
    #: knob name -> Knob, in a stable order (the dataset's column order)
    knobs: dict[str, Knob]
    #: feature name -> "float64" | "int64", in a stable order
    features: dict[str, str]
    #: record field name -> one of `RECORD_TYPES`: a record dataset (MOUNT/<name>/records/,
    #: zero or many rows per tick, handed over in `Sample.records`); empty: none
    records: ClassVar[dict[str, str]] = {}
    #: True when what the subsystem publishes identifies users (the kernel log): its
    #: dataset, records and reports are then readable by root and the mount's group only
    private: ClassVar[bool] = False
    #: True when the subsystem keeps reports (`report_files`), served under reports/
    publishes_reports: ClassVar[bool] = False
    #: target name -> Target: events its records let a predictor forecast; with targets
    #: (and no knobs) the subsystem's models are predictors, not knob models
    targets: ClassVar[dict[str, Target]] = {}
    #: True when `step` blocks (sleeps through its measuring window, waits for
    #: the kernel): the core then runs it in a worker thread, so the mount
    #: keeps answering.  False (the default) means `step` returns at once and
    #: is called on the event-loop thread.
    blocking: ClassVar[bool] = False

    def default_knobs(self, last: Sample | None) -> dict[str, KnobValue]:
        """The default (human-made) algorithm: knob values for the next tick.

        The stock values unless a backend has a smarter heuristic; `last` is the
        previous tick's sample (None on the first tick).
        """
        return {name: knob.default for name, knob in self.knobs.items()}

    @abc.abstractmethod
    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        """Apply `knobs`, let the subsystem run one tick, and sample it.

        Simulated backends advance virtual time by one tick and return at once;
        real backends apply the knobs, then measure the period since the last
        call.  Must not raise for ordinary conditions; a knob the kernel refused
        is reported in `Sample.extra[EXTRA_REFUSED]`.
        """

    def report_files(self) -> dict[str, str]:
        """The reports to serve under reports/ (`publishes_reports`): file name -> text.

        Bounded by the backend (a fixed number of reports, each of bounded size).
        """
        return {}

    def release(self, knobs: list[str]) -> None:
        """No model controls `knobs` any more: real backends restore them now.

        The next tick would apply the default algorithm anyway; this makes
        `stop`/`rmdir` of a model put the original values back at once.
        """
        return None

    def close(self) -> None:
        """Stop: real backends restore every original knob value here.

        Called once, on unmount (and on unload); nothing is called afterwards.
        """
        return None  # simulated backends have nothing to restore


# ---- rules shared by the core, the trainers and the backends --------------

def column_name(name: str) -> str:
    """A dataset column name: only [A-Za-z0-9_], other characters become '_'."""
    return _COLUMN_UNSAFE.sub("_", name)


def knob_column(knob: str) -> str:
    """The dataset column holding a knob's value during the tick."""
    return "knob_" + column_name(knob)


#: the dataset columns the core writes itself (docs/ABI.md); no feature may take them
CORE_COLUMNS = ("ts", "tick", "controller", "model", "mode", "objective")
#: the types a feature may have
FEATURE_TYPES = ("float64", "int64")


def subsystem_problems(subsystem: Subsystem) -> list[str]:
    """Why the core cannot serve `subsystem` (empty when it can).

    Checked before a subsystem is served: a bad name or two columns with the
    same name would otherwise surface as an unreadable dataset, not an error.
    """
    problems = []
    name = getattr(subsystem, "name", None)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append(f"name {name!r} does not match {NAME_RULE}")
    columns: dict[str, str] = {c: "the core" for c in CORE_COLUMNS}
    for knob_name, knob in subsystem.knobs.items():
        if not isinstance(knob, Knob) or knob.name != knob_name:
            problems.append(f"knob {knob_name!r} is not a Knob named {knob_name!r}")
        elif not (isinstance(knob.settle_ticks, int) and 0 <= knob.settle_ticks <= MAX_SETTLE):
            problems.append(f"knob {knob_name!r}: settle_ticks {knob.settle_ticks!r} is not "
                            f"an integer in 0..{MAX_SETTLE}")
        column = knob_column(knob_name)
        if column in columns:
            problems.append(f"knob {knob_name!r}: column {column} is taken by {columns[column]}")
        columns[column] = f"knob {knob_name!r}"
    for feature, kind in subsystem.features.items():
        if kind not in FEATURE_TYPES:
            problems.append(f"feature {feature!r}: type {kind!r} is not one of "
                            f"{', '.join(FEATURE_TYPES)}")
        column = column_name(feature)
        if column in columns:
            problems.append(f"feature {feature!r}: column {column} is taken by {columns[column]}")
        columns[column] = f"feature {feature!r}"
    if getattr(subsystem.objective, "goal", None) not in ("max", "min"):
        problems.append("objective goal is neither max nor min")
    records = getattr(subsystem, "records", {})
    for target_name, target in getattr(subsystem, "targets", {}).items():
        if not isinstance(target, Target) or target.name != target_name or \
                not NAME.fullmatch(target_name):
            problems.append(f"target {target_name!r} is not a Target named so ({NAME_RULE})")
            continue
        if subsystem.knobs:
            problems.append(f"target {target_name!r}: a subsystem with knobs cannot have "
                            "targets (its models would be both kinds)")
        for what in ("event", "rule"):
            if records.get(getattr(target, what)) != "bool":
                problems.append(f"target {target_name!r}: {what} {getattr(target, what)!r} is "
                                "not a bool record field")
        if target.key not in records:
            problems.append(f"target {target_name!r}: key {target.key!r} is not a record field")
        if not (isinstance(target.horizon_ticks, int) and 1 <= target.horizon_ticks <= 100_000):
            problems.append(f"target {target_name!r}: horizon_ticks is not in 1..100000")
        if not (target.miss_cost > 0 and target.false_alarm_cost > 0):
            problems.append(f"target {target_name!r}: costs must be positive")
    for record_field, kind in records.items():
        if kind not in RECORD_TYPES:
            problems.append(f"record field {record_field!r}: type {kind!r} is not one of "
                            f"{', '.join(RECORD_TYPES)}")
        if record_field in RECORD_CORE_COLUMNS or column_name(record_field) != record_field:
            problems.append(f"record field {record_field!r} is taken by the core or is not "
                            "a column name ([A-Za-z0-9_])")
    return problems


def _as_knob(knob: Knob | Mapping[str, Any]) -> Knob:
    return knob if isinstance(knob, Knob) else Knob.from_info("", knob)


def candidate_values(knob: Knob | Mapping[str, Any]) -> list[KnobValue]:
    """The values a policy (or a trainer) evaluates for one knob, ascending.

    int knobs: min, max, default and the powers of two in range, thinned evenly
    to at most `MAX_VALUES_PER_KNOB` (the default always kept); choice knobs:
    every choice, in `info` order.  `knob` is a Knob or its `info` entry.
    """
    knob = _as_knob(knob)
    if knob.type == "choice":
        return list(knob.choices)
    lo = int(knob.min or 0)
    hi = int(knob.max) if knob.max is not None else _UNBOUNDED_MAX
    default = int(knob.default)
    values = {lo, hi, default}
    power = 1
    while power <= hi:
        if power >= lo:
            values.add(power)
        power *= 2
    ordered = sorted(values)
    if len(ordered) > MAX_VALUES_PER_KNOB:
        import numpy as np  # only for huge ranges; keeps this module's import cheap

        picks = np.linspace(0, len(ordered) - 1, MAX_VALUES_PER_KNOB).round().astype(int)
        ordered = sorted({ordered[i] for i in picks} | {default})
    return ordered


def distance_from_default(knob: Knob | Mapping[str, Any], value: KnobValue) -> float:
    """How far a candidate moves a knob from its default: log2 steps, or 1 for another choice.

    Among candidates with exactly the best prediction, the one with the least
    total distance wins: a tree model predicts the same for every value beyond
    the last split it learnt, so "first in the grid wins" would pick the
    grid's extreme (read_ahead_kb 0) for values it never saw.
    """
    knob = _as_knob(knob)
    if knob.type == "choice":
        return 0.0 if value == knob.default else 1.0
    return abs(math.log2(1 + abs(int(value))) - math.log2(1 + abs(int(knob.default))))


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


__all__ = [
    "ABI_VERSION", "ENTRY_POINT_GROUP", "EXTRA_APPLIED", "EXTRA_FOREIGN", "EXTRA_REFUSED",
    "Knob", "KnobValue", "KnobValueError", "MAX_SETTLE", "MAX_VALUES_PER_KNOB", "NAME",
    "NAME_RULE",
    "Objective", "Sample", "Settling", "Subsystem", "candidate_values", "column_name",
    "distance_from_default", "knob_column", "subsystem_problems", "CORE_COLUMNS",
    "FEATURE_TYPES",
    # settings
    "Check", "MAX_TICK_SECONDS", "MIN_TICK_SECONDS", "NO_DEFAULT", "Schema", "SettingError",
    "boolean_or", "check_settings", "defaults_from", "describe_schema", "described",
    "list_of", "number", "table", "text", "tick_seconds", "word",
    "ACTION_SETTINGS", "APPLICATION", "CORE_SETTINGS", "OBJECTIVE_SETTINGS",
    "application_objective", "split_core_settings",
]


# ---- window features: an entity's recent rows, for predictors -------------------------
#
# A predictor sees one row per entity and tick, but what gives a failure away is often a
# trend: errors on several of the last days, a latency above its own month.  The trainer
# and the proxy running a policy must compute such features the same way, so the grammar
# and both computations (over a whole dataset, and tick by tick) are defined here.  A
# policy names them like any column: `<field>__<aggregate><W>`, over the entity's last W
# rows (fewer while it has fewer), the current row included:
#   mean  the field's mean;
#   pos   how many of the rows have the field above 0;
#   first rows since the oldest of them with the field above 0 (0: the current row),
#         -1 when none is.
# Rows, not ticks: an entity has one row per tick while it exists (a record source's
# contract), so W rows are the last W ticks it was seen.

#: the longest window a window feature may name
MAX_WINDOW = 90
WINDOW_AGGREGATES = ("mean", "pos", "first")
_WINDOW_NAME = re.compile(r"^(?P<field>[A-Za-z0-9_]+?)__(?P<agg>mean|pos|first)"
                          r"(?P<w>[0-9]{1,3})$")


@dataclass(frozen=True)
class WindowFeature:
    """One parsed window feature name."""

    name: str
    field: str
    aggregate: str
    window: int


def window_feature(name: str) -> WindowFeature | None:
    """The window feature a column name asks for, or None for a plain column (or a name
    whose window is outside 2..MAX_WINDOW)."""
    match = _WINDOW_NAME.match(name)
    if match is None:
        return None
    window = int(match["w"])
    if not 2 <= window <= MAX_WINDOW:
        return None
    return WindowFeature(name, match["field"], match["agg"], window)


def window_features(keys: Any, ticks: Any, columns: Mapping[str, Any],
                    names: list[str]) -> dict[str, Any]:
    """The named window features of every row of a dataset (rows in any order; each
    key's rows are taken in tick order): one float64 array per name."""
    import numpy as np

    specs = [w for w in map(window_feature, names) if w is not None]
    keys = np.asarray(keys)
    order = np.lexsort((np.asarray(ticks, dtype=np.int64), keys))
    n = len(order)
    k = keys[order]
    start = np.ones(n, bool)
    start[1:] = k[1:] != k[:-1]
    first_row = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    here = np.arange(n)
    seen = here - first_row + 1  # rows of this key so far, the current one included
    out: dict[str, Any] = {}
    for spec in specs:
        values = np.asarray(columns[spec.field], dtype=np.float64)[order]
        count = np.minimum(seen, spec.window)
        lo = here - count + 1  # the window's oldest row
        if spec.aggregate == "mean":
            total = np.concatenate(([0.0], np.cumsum(values)))
            result = (total[here + 1] - total[lo]) / count
        elif spec.aggregate == "pos":
            total = np.concatenate(([0], np.cumsum(values > 0)))
            result = (total[here + 1] - total[lo]).astype(np.float64)
        else:
            positive = np.flatnonzero(values > 0)
            idx = np.searchsorted(positive, lo)
            cand = positive[np.minimum(idx, max(len(positive) - 1, 0))] if len(positive) \
                else here
            has = (idx < len(positive)) & (cand <= here)
            result = np.where(has, here - cand, -1).astype(np.float64)
        unsorted = np.empty(n)
        unsorted[order] = result
        out[spec.name] = unsorted
    return out


class WindowState:
    """The same window features tick by tick, from each entity's last rows kept here.

    `update(keys, columns)` takes one tick's rows (one per entity) and returns the named
    features for them, equal to `window_features` over all the rows so far.  An entity
    unseen for `MAX_WINDOW` updates is forgotten when room is needed (at most
    `max_entities` are kept; one that comes back starts a new history).
    """

    def __init__(self, names: list[str], max_entities: int = 100_000) -> None:
        import numpy as np

        self.specs = [w for w in map(window_feature, names) if w is not None]
        self.names = [s.name for s in self.specs]
        self.depth: dict[str, int] = {}
        for spec in self.specs:
            self.depth[spec.field] = max(self.depth.get(spec.field, 0), spec.window)
        self.max_entities = max_entities
        self.slots: dict[Any, int] = {}
        self.capacity = 0
        self.seen = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)
        self.rings = {f: np.zeros((0, d)) for f, d in self.depth.items()}
        self.updates = 0

    def _grow(self, need: int) -> None:
        import numpy as np

        if need <= self.capacity:
            return
        if need > self.max_entities:
            self._forget()
            need = len(self.slots) + (need - self.capacity)
        size = max(need, 2 * self.capacity, 64)
        self.seen = np.concatenate((self.seen, np.zeros(size - self.capacity, np.int64)))
        self.last = np.concatenate((self.last, np.zeros(size - self.capacity, np.int64)))
        for f, ring in self.rings.items():
            self.rings[f] = np.concatenate((ring, np.zeros((size - self.capacity,
                                                            ring.shape[1]))))
        self.capacity = size

    def _forget(self) -> None:
        """Compact: keep the entities seen within the last MAX_WINDOW updates."""
        import numpy as np

        keep = [(key, slot) for key, slot in self.slots.items()
                if self.updates - self.last[slot] < MAX_WINDOW]
        old = np.array([slot for _, slot in keep], dtype=np.int64)
        self.slots = {key: i for i, (key, _) in enumerate(keep)}
        self.seen = self.seen[old]
        self.last = self.last[old]
        self.rings = {f: ring[old] for f, ring in self.rings.items()}
        self.capacity = len(old)

    def update(self, keys: Any, columns: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np

        self.updates += 1
        keys = np.asarray(keys).tolist()
        new = [key for key in dict.fromkeys(keys) if key not in self.slots]
        if new:
            self._grow(len(self.slots) + len(new))
            for key in new:
                self.slots[key] = len(self.slots)
            self.seen[[self.slots[key] for key in new]] = 0
        slots = np.fromiter((self.slots[key] for key in keys), np.int64, len(keys))
        self.last[slots] = self.updates
        for f, depth in self.depth.items():
            self.rings[f][slots, self.seen[slots] % depth] = np.asarray(columns[f],
                                                                       dtype=np.float64)
        self.seen[slots] += 1
        seen = self.seen[slots]
        out: dict[str, Any] = {}
        for spec in self.specs:
            depth = self.depth[spec.field]
            back = np.arange(spec.window)  # 0: this row, 1: the row before, ...
            window = self.rings[spec.field][slots[:, None],
                                            (seen[:, None] - 1 - back[None, :]) % depth]
            valid = back[None, :] < np.minimum(seen, spec.window)[:, None]
            if spec.aggregate == "mean":
                out[spec.name] = (np.where(valid, window, 0.0).sum(axis=1)
                                  / valid.sum(axis=1))
            elif spec.aggregate == "pos":
                out[spec.name] = ((window > 0) & valid).sum(axis=1).astype(np.float64)
            else:
                hit = (window > 0) & valid
                oldest = spec.window - 1 - np.argmax(hit[:, ::-1], axis=1)
                out[spec.name] = np.where(hit.any(axis=1), oldest, -1).astype(np.float64)
        return out


__all__ += ["MAX_WINDOW", "WINDOW_AGGREGATES", "WindowFeature", "WindowState",
            "window_feature", "window_features"]
