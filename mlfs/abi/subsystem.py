"""The subsystem interface: what a backend implements and every member the core reads.

`Subsystem`, `Objective`, `Target` and `Sample`; the `Sample.extra` keys the core
reads; the dataset's column names (`column_name`, `knob_column`): a trainer and a
policy address knobs by them; the name pattern (`NAME`) of subsystems and models;
and `subsystem_problems`, what the core checks before it serves a subsystem.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .knobs import MAX_SETTLE, Knob, KnobValue

#: the version of this interface, shown as `abi` in every subsystem's `info`
ABI_VERSION = 1

#: names of subsystems and models: file-name safe, no path, at most 64 characters
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: the same rule as text, for messages
NAME_RULE = "[a-z0-9][a-z0-9._-]{0,63}"
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
