"""linux.sysfs: a subsystem declared in configuration, with no code.

A kernel developer who wants to try ML on a subsystem whose knobs are sysctl,
sysfs or cgroup files, and whose state shows in /proc, sysfs or cgroup files,
writes a `[[subsystem]]` table instead of a backend::

    [[subsystem]]
    backend = "linux.sysfs"
    name = "loop3.readahead"
    description = "read-ahead of loop3"
    tick_seconds = 1.0
    objective = "read_kb_per_s"        # a feature, or "application" (written
    goal = "max"                       # to MOUNT/<name>/objective each tick)
    critical = {inflight = 1000}       # critical while a feature is above a level

    [subsystem.knobs.read_ahead_kb]
    path = "/sys/block/loop3/queue/read_ahead_kb"
    range = [0, 65536]                 # or choices = ["none", "mq-deadline"]
    apply = [16, 4096]                 # may be written within; absent: observe-only
    default = "original"               # the default algorithm: the value found
                                       # (and followed), or a fixed value
    unit = "KiB"

    [subsystem.features.read_kb_per_s]
    path = "/sys/block/loop3/stat"
    field = 2                          # the 3rd number (sectors read) of a one-line file
    kind = "rate"                      # per second; "level" (default) as read
    scale = 0.5                        # sectors -> KiB

A feature reads one of: a single number (`path` alone); the `field`-th
number of a one-line file (/sys/block/<dev>/stat, /proc/loadavg); `key`
(a name or a list, summed) of a `key value` file (/proc/vmstat,
/proc/meminfo, cgroup memory.stat), optionally `divide_by` another key of the
same file (a fraction); or `psi = "some avg10"` (or `"full total"`, ...) of
a PSI file (/proc/pressure/<r>).  A missing key or PSI line reads 0, as in
linux.vm.  Each file is read once per snapshot however many features use it.

Safety is the built-in real backends' (backends/linux/__init__.py): a knob is written
only when `apply` permits it and within those bounds (inside `range`); the
original is recorded durably in the state directory's ledger before the first
write and restored on stop, unmount and after a crash; a value someone else
set is left alone.  Because the daemon runs as root and writes what the
declaration names, knob paths must resolve (symlinks followed) to files under
/proc/sys or /sys (which holds /sys/fs/cgroup), and feature paths under /proc
or /sys; the resolved path is what is written and what the ledger records.
A declaration is configuration, and only root writes the configuration.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path

from mlfs.abi import (
    APPLICATION,
    CORE_COLUMNS,
    MAX_SETTLE,
    MAX_TICK_SECONDS,
    NAME,
    NAME_RULE,
    Backend,
    ConformanceEnv,
    ExampleUnavailable,
    Knob,
    KnobValue,
    Objective,
    Sample,
    Schema,
    SettingError,
    check_settings,
    column_name,
    defaults_from,
    described,
    knob_column,
    number,
    table,
    text,
    tick_seconds,
    word,
)

from .files import read_key_values, read_psi_file, read_text, stream_problem
from .knobs import KnobSpec, check_measure, parse_apply
from .subsystem import LinuxSubsystem

__all__ = ["BACKEND", "DeclaredSubsystem", "check", "factory"]

#: where a knob's file may resolve to (the ledger's own rule, ledger.KERNEL_ROOTS)
KNOB_ROOTS = (Path("/proc/sys"), Path("/sys"))
#: where a feature's file may resolve to
FEATURE_ROOTS = (Path("/proc"), Path("/sys"))
MAX_KNOBS = 64
MAX_FEATURES = 512
_KNOB_KEYS = {"path", "range", "choices", "apply", "default", "unit", "alt_path", "priority",
              "settle_ticks"}
_FEATURE_KEYS = {"path", "field", "key", "divide_by", "psi", "kind", "scale"}
_PSI_FIELDS = {f"{k} {f}" for k in ("some", "full") for f in ("avg10", "avg60", "avg300",
                                                               "total")}


def _resolve(raw: object, roots: tuple[Path, ...], where: str) -> Path:
    """`raw` resolved (symlinks followed) to an existing file under one of `roots`."""
    if not isinstance(raw, str) or not raw.startswith("/") or "\0" in raw:
        raise SettingError(where, f"{raw!r} is not an absolute path")
    try:
        path = Path(os.path.realpath(raw, strict=False))
        is_file = path.is_file()
    except OSError as exc:  # /proc/1/cwd/...: a link the daemon may not follow
        raise SettingError(where, f"{raw!r} cannot be resolved: "
                           f"{os.strerror(exc.errno or 0)}") from None
    if not any(path.is_relative_to(root) for root in roots):
        raise SettingError(where, f"{raw!r} resolves to {path}, outside "
                           f"{' and '.join(map(str, roots))}")
    if not is_file:
        raise SettingError(where, f"{raw!r} is not an existing file")
    return path


class _Feature:
    """How one feature is read from a parsed file and derived between snapshots."""

    def __init__(self, name: str, spec: Mapping, where: str) -> None:
        unknown = set(spec) - _FEATURE_KEYS
        if unknown:
            raise SettingError(where, f"unknown keys {', '.join(sorted(unknown))} "
                               f"(known: {', '.join(sorted(_FEATURE_KEYS))})")
        self.name = name
        self.path = _resolve(spec.get("path"), FEATURE_ROOTS, f"{where}.path")
        forms = [k for k in ("field", "key", "psi") if k in spec]
        if len(forms) > 1:
            raise SettingError(where, f"takes one of field, key, psi (not {', '.join(forms)})")
        self.parser = forms[0] if forms else "value"
        self.field = spec.get("field", 0)
        if isinstance(self.field, bool) or not isinstance(self.field, int) \
                or not 0 <= self.field < 64:
            raise SettingError(f"{where}.field", f"{self.field!r} is not an index 0..63")
        keys = spec.get("key", [])
        keys = [keys] if isinstance(keys, str) else keys
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys) \
                or (self.parser == "key" and not keys) or len(keys) > 64:
            raise SettingError(f"{where}.key", "is not a key or a list of 1..64 keys")
        self.keys = tuple(keys)
        self.divide_by = spec.get("divide_by")
        if self.divide_by is not None and (self.parser != "key"
                                           or not isinstance(self.divide_by, str)):
            raise SettingError(f"{where}.divide_by", "is a key of the same `key value` file")
        self.psi = spec.get("psi", "")
        if self.parser == "psi" and self.psi not in _PSI_FIELDS:
            raise SettingError(f"{where}.psi", f"{self.psi!r} is not one of "
                               f"{', '.join(sorted(_PSI_FIELDS))}")
        self.kind = spec.get("kind", "level")
        if self.kind not in ("level", "rate"):
            raise SettingError(f"{where}.kind", f"{self.kind!r} is not level or rate")
        scale = spec.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) \
                or not math.isfinite(scale):
            raise SettingError(f"{where}.scale", f"{scale!r} is not a finite number")
        self.scale = float(scale)

    @property
    def source(self) -> tuple[Path, str]:
        """The file and how it is parsed: files shared by features are read once."""
        return self.path, "psi" if self.parser == "psi" else (
            "keys" if self.parser == "key" else "numbers")

    def value(self, parsed: dict) -> float:
        """The raw level from a parsed file (0 when missing)."""
        if self.parser == "psi":
            return float(parsed.get(self.psi.replace(" ", "_"), 0.0))
        if self.parser == "key":
            total = float(sum(parsed.get(k, 0) for k in self.keys))
            if self.divide_by is not None:
                base = parsed.get(self.divide_by, 0)
                return total / base if base else 0.0
            return total
        numbers = parsed.get("numbers", ())
        return float(numbers[self.field]) if self.field < len(numbers) else 0.0


def _parse(path: Path, how: str) -> dict:
    if how == "keys":
        return read_key_values(path)
    if how == "psi":
        return read_psi_file(path)
    numbers = []
    for word_ in read_text(path).split():
        try:
            numbers.append(float(word_))
        except ValueError:
            break
    return {"numbers": numbers}


def _knob_spec(name: str, spec: Mapping, where: str) -> tuple[KnobSpec, object, object]:
    """The KnobSpec, its apply rule (as the knobs module takes it) and its default policy."""
    unknown = set(spec) - _KNOB_KEYS
    if unknown:
        raise SettingError(where, f"unknown keys {', '.join(sorted(unknown))} "
                           f"(known: {', '.join(sorted(_KNOB_KEYS))})")
    path = _resolve(spec.get("path"), KNOB_ROOTS, f"{where}.path")
    alt = spec.get("alt_path")
    alt_path = _resolve(alt, KNOB_ROOTS, f"{where}.alt_path") if alt is not None else None
    unit = spec.get("unit", "")
    if not isinstance(unit, str) or len(unit) > 16:
        raise SettingError(f"{where}.unit", f"{unit!r} is not a short string")
    priority = spec.get("priority", 1)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise SettingError(f"{where}.priority", f"{priority!r} is not a whole number")
    settle = spec.get("settle_ticks", 0)
    if isinstance(settle, bool) or not isinstance(settle, int) or not 0 <= settle <= MAX_SETTLE:
        raise SettingError(f"{where}.settle_ticks", f"{settle!r} is not a whole number in "
                           f"0..{MAX_SETTLE}")
    if ("range" in spec) == ("choices" in spec):
        raise SettingError(where, "takes range = [lo, hi] or choices = [...], one of them")
    if "range" in spec:
        bounds = spec["range"]
        if (not isinstance(bounds, list) or len(bounds) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                or bounds[0] > bounds[1]):
            raise SettingError(f"{where}.range", f"{bounds!r} is not [lo, hi] with lo <= hi")
        knob = KnobSpec(name, path, lo=bounds[0], hi=bounds[1], unit=unit, alt_path=alt_path,
                        priority=priority, settle_ticks=settle)
    else:
        choices = spec["choices"]
        if (not isinstance(choices, list) or not choices
                or not all(isinstance(c, str) and c and c.isprintable() and " " not in c
                           for c in choices)):
            raise SettingError(f"{where}.choices", f"{choices!r} is not a list of words")
        knob = KnobSpec(name, path, type="choice", unit=unit, alt_path=alt_path,
                        priority=priority, settle_ticks=settle)
    default = spec.get("default", "original")
    if default != "original":
        kind_ok = (isinstance(default, str) if knob.type == "choice"
                   else isinstance(default, int) and not isinstance(default, bool))
        if not kind_ok:
            raise SettingError(f"{where}.default", f"{default!r} is not \"original\" or a "
                               f"{'choice' if knob.type == 'choice' else 'whole number'}")
    return knob, spec.get("apply"), default


def _declaration(kwargs: Mapping) -> tuple[dict, dict, dict, dict]:
    """(knob specs, apply table, default policies, features) of a checked declaration."""
    knobs = kwargs.get("knobs", {})
    features = kwargs.get("features", {})
    if not isinstance(features, Mapping) or not features or len(features) > MAX_FEATURES:
        raise SettingError("features", f"a table of 1..{MAX_FEATURES} features is needed")
    if not isinstance(knobs, Mapping) or len(knobs) > MAX_KNOBS:
        raise SettingError("knobs", f"a table of at most {MAX_KNOBS} knobs")
    specs, apply, defaults, choices = {}, {}, {}, {}
    for name, spec in knobs.items():
        where = f"knobs.{name}"
        if not NAME.fullmatch(name) or not isinstance(spec, Mapping):
            raise SettingError(where, f"a knob is a table named like {NAME_RULE}")
        specs[name], rule, defaults[name] = _knob_spec(name, spec, where)
        if specs[name].type == "choice":
            choices[name] = tuple(spec["choices"])
        if rule is not None:
            apply[name] = rule
    out_features = {}
    taken = {*CORE_COLUMNS, *(knob_column(k) for k in specs)}
    for name, spec in features.items():
        where = f"features.{name}"
        if not NAME.fullmatch(name) or not isinstance(spec, Mapping):
            raise SettingError(where, f"a feature is a table named like {NAME_RULE}")
        if column_name(name) in taken:
            raise SettingError(where, f"its column {column_name(name)} is the core's or a "
                               "knob's (ts, tick, controller, model, mode, objective, knob_*)")
        out_features[name] = _Feature(name, spec, where)
    sub_name = kwargs.get("name", "linux.sysfs")
    try:
        rules = parse_apply(apply, specs, sub_name, choices)
    except ValueError as exc:
        raise SettingError("knobs", str(exc).removeprefix(f"{sub_name}: ")) from None
    for name, default in defaults.items():
        if default == "original":
            continue
        rule = rules.get(name)
        allowed = (rule[0] <= default <= rule[1] if isinstance(rule, tuple)
                   else rule is not None and default in rule)
        if not allowed:
            raise SettingError(f"knobs.{name}.default", f"{default!r} is not within what "
                               "apply permits (a fixed default is written each default tick)")
    objective = kwargs.get("objective", APPLICATION)
    if objective != APPLICATION and objective not in out_features:
        raise SettingError("objective", f"{objective!r} is neither a feature nor "
                           f"{APPLICATION!r}")
    critical = kwargs.get("critical", {})
    for feature, level in critical.items():
        if feature not in out_features:
            raise SettingError(f"critical.{feature}", "is not a feature")
        if isinstance(level, bool) or not isinstance(level, int | float) \
                or not math.isfinite(level):
            raise SettingError(f"critical.{feature}", f"{level!r} is not a finite number")
    return specs, rules, defaults, out_features


class DeclaredSubsystem(LinuxSubsystem):
    """A subsystem made of a declaration: kernel files as knobs and features."""

    backend = "linux.sysfs"

    def __init__(self, name: str = "linux.sysfs", description: str = "",
                 tick_seconds: float = 1.0, measure_seconds: float | None = None,
                 objective: str = APPLICATION, goal: str = "max", unit: str = "",
                 critical: Mapping | None = None, knobs: Mapping | None = None,
                 features: Mapping | None = None, state_dir: str | Path | None = None) -> None:
        settings = {"name": name, "objective": objective, "critical": critical or {},
                    "knobs": knobs or {}, "features": features or {}}
        specs, rules, self._defaults, self._features = _declaration(settings)
        self._sources = sorted({f.source for f in self._features.values()})
        self._critical = {k: float(v) for k, v in (critical or {}).items()}
        self._application = objective == APPLICATION
        choices = {n: tuple(knobs[n]["choices"]) for n, s in specs.items() if s.type == "choice"}
        feature_types = {n: "float64" for n in self._features}
        self.UNITS = {objective: unit}
        self._setup(name=name, specs=specs, rules=rules, state_dir=state_dir,
                    tick_seconds=tick_seconds, measure_seconds=measure_seconds,
                    objective=next(iter(feature_types)) if self._application else objective,
                    goal=goal, features=feature_types, choices=choices)
        if self._application:
            self.objective = Objective(APPLICATION, unit, goal)  # type: ignore[arg-type]
        self.description = f"{description or 'declared subsystem'}; {self.safety}"

    def snapshot(self) -> dict | None:
        out = {}
        for path, how in self._sources:
            try:
                out[(path, how)] = _parse(path, how)
            except OSError:
                return None
        return out

    def derive(self, before: dict, after: dict, seconds: float) -> dict[str, float]:
        out = {}
        for name, feature in self._features.items():
            now = feature.value(after[feature.source])
            if feature.kind == "rate":  # subsystem.rate's rule: a counter reset gives 0
                delta = now - feature.value(before[feature.source])
                now = delta / seconds if delta > 0 else 0.0
            out[name] = now * feature.scale
        return out

    def critical_state(self, features: dict[str, float]) -> str | None:
        for feature, level in self._critical.items():
            if features[feature] > level:
                return f"{feature} {features[feature]:g} > {level:g}"
        return None

    def default_knobs(self, last: Sample | None) -> dict[str, KnobValue]:
        values = self.controller.default_values()
        for name, policy in self._defaults.items():
            if policy != "original" and self.controller.allowed(name):
                values[name] = policy
        return values

    def _knob(self, name: str) -> Knob:
        knob = super()._knob(name)
        policy = self._defaults.get(name, "original")
        if policy != "original" and self.controller.allowed(name):
            knob = dataclasses.replace(knob, default=policy)
        return knob



#: `[[subsystem]] backend = "linux.sysfs"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "description": text(200),
    "tick_seconds": tick_seconds(),
    "measure_seconds": number(0.0, MAX_TICK_SECONDS),  # and <= tick_seconds
    "objective": described(text(64), f"a feature name or {APPLICATION!r}"),
    "goal": word("max", "min"),
    "unit": text(16),
    "critical": described(table(), "table {feature = level}: critical above the level"),
    "knobs": described(table(), "table of knobs {path, range | choices, apply, default, "
                       "unit, alt_path}"),
    "features": described(table(), "table of features {path, field | key [divide_by] | "
                          "psi, kind = level | rate, scale}"),
}
DESCRIPTION = ("a subsystem declared in configuration: any sysctl, sysfs or cgroup files "
               "as knobs, numbers from /proc, sysfs or cgroup files as features")
defaults_from(SETTINGS, DeclaredSubsystem.__init__)
#: the factory wants the state directory (the ledger of original knob values)
USES_STATE_DIR = True
#: it writes whatever files its declaration names: a run-time load is root's alone
ROOT_ONLY = True


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked declaration and its one subsystem name; SettingError naming the key."""
    kwargs = check_settings(settings, SETTINGS)
    check_measure(kwargs)
    name = kwargs.get("name", "linux.sysfs")
    if not NAME.fullmatch(name):
        raise SettingError("name", f"{name!r} does not match {NAME_RULE}")
    specs, _, _, features = _declaration(kwargs)
    declared = [(f"knobs.{n}.path", spec.path) for n, spec in specs.items()]
    declared += [(f"features.{n}.path", f.path) for n, f in features.items()]
    for where, path in declared:
        problem = stream_problem(path)
        if problem:
            raise SettingError(where, f"{path} {problem}")
    return kwargs, [name]


def factory(settings: dict) -> list[DeclaredSubsystem]:
    """`[[subsystem]] backend = "linux.sysfs"`: one subsystem."""
    kwargs, _ = check(settings)
    return [DeclaredSubsystem(**kwargs)]


def _example(env: ConformanceEnv) -> dict:
    """The conformance suite's instance: the loop device's readahead as a declared knob."""
    if env.device is None:
        raise ExampleUnavailable("no block device whose files to declare (needs root)")
    queue = f"/sys/block/{env.device}/queue"
    return {"name": "conformance.sysfs", "tick_seconds": 0.1, "measure_seconds": 0.0,
            "knobs": {"read_ahead_kb": {"path": f"{queue}/read_ahead_kb",
                                        "range": [0, 65536], "apply": [16, 4096]}},
            "features": {"reads": {"path": f"/sys/block/{env.device}/stat", "field": 0}}}


BACKEND = Backend(name="linux.sysfs", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, root_only=ROOT_ONLY,
                  uses_state_dir=USES_STATE_DIR, kinds=("knob",), example=_example)
