"""One TOML file configures a mount; with none, the embedded default serves."""

from __future__ import annotations

import difflib
import grp
import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from mlfs.base.hostid import host_id_problem
from mlfs.base.portion import StorePolicy
from mlfs.core.mount.readers import FREE_TASKS


@dataclass(frozen=True)
class ModeConfig:
    """Shares of ML ticks per mode and the thresholds of automatic switching.

    Ticks, not seconds, count dwell and cool-down, so a simulated subsystem in
    virtual time behaves exactly as a real one; only trainer silence is wall
    time (a trainer's silence is a fact about the real world).
    """

    learning_share: float = 0.10
    collaboration_share: float = 0.50
    recommendation_probe: float = 0.05
    #: learning's efficiency: the last `window_ticks` (the trainer changes its model
    #: as it learns, so older ticks judge another model)
    window_ticks: int = 300
    #: collaboration's and recommendation's: every tick since the switch into the mode,
    #: up to `evidence_ticks` (a growing sample: the sequential test stays valid)
    evidence_ticks: int = 2000
    unstable_baseline_ratio: float = 2.0
    min_ml_ticks: int = 30
    min_dwell_ticks: int = 50
    to_collaboration: float = 1.0
    to_recommendation: float = 1.05
    recommendation_confidence: float = 2.0
    demote_below: float = 0.97
    demote_confidence: float = 2.0
    collapse_below: float = 0.3
    emergency_cooldown_ticks: int = 200
    silence_seconds: float = 60.0


#: record datasets seal and wait in memory this many times a tick dataset's rows
RECORD_SEAL_FACTOR = 16


@dataclass(frozen=True)
class StoreConfig:
    seal_rows: int = 4096
    seal_seconds: float = 10.0
    feedback_seal_seconds: float = 2.0
    journal_seal_seconds: float = 30.0
    retention_bytes: int = 1 << 30
    retention_count: int = 1000
    # rows one store keeps in memory while the state dir refuses writes; at the
    # bound ticks are held (skipped, counted) and recommend gets ENOSPC
    max_waiting_rows: int = 65536
    # bytes of portions not yet shipped by a fleet pusher that retention keeps
    # beyond retention_bytes (docs/fleet.md); 0: retention never waits for it
    fleet_backlog_bytes: int = 1 << 28

    def dataset(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.seal_seconds, self.retention_bytes,
                           self.retention_count, max_waiting_rows=self.max_waiting_rows,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)

    def records(self) -> StorePolicy:
        """A record dataset's: rows arrive by the thousand per tick, columnar (a few bytes
        each in memory), so it seals at RECORD_SEAL_FACTOR x seal_rows and holds that many
        times max_waiting_rows while the state dir refuses writes."""
        return StorePolicy(self.seal_rows * RECORD_SEAL_FACTOR, self.seal_seconds,
                           self.retention_bytes, self.retention_count,
                           max_waiting_rows=self.max_waiting_rows * RECORD_SEAL_FACTOR,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)

    def feedback(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.feedback_seal_seconds, self.retention_bytes,
                           self.retention_count, max_waiting_rows=self.max_waiting_rows,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)

    def journal(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.journal_seal_seconds, self.retention_bytes,
                           self.retention_count, durable=True,
                           max_waiting_rows=self.max_waiting_rows,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)


@dataclass(frozen=True)
class MountConfig:
    group: str = ""
    allow_other: bool = True
    max_tasks: int = 512
    # events files, for every uid but root (core/mount/readers.py says why and what
    # is refused with which errno): open at once per uid and for all of them,
    # reads waiting for an event per uid and for all of them
    events_streams_per_uid: int = 128
    events_streams: int = 4096
    events_blocked_reads_per_uid: int = 64
    events_blocked_reads: int = 256
    # every other open file of the mount (attributes, portions), for every uid but
    # root: per uid (EMFILE beyond) and for all of them (ENFILE)
    handles_per_uid: int = 1024
    handles: int = 8192
    # Prometheus text at http://<metrics_address>:<metrics_port>/metrics (0 = off)
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    # models of all subsystems together; mkdir beyond it gets ENOSPC
    max_models: int = 4096
    # subsystems served at once, configured ones counted; a load beyond it gets ENOSPC
    max_subsystems: int = 64
    # action commands started per minute over the whole mount (core/mount/actions.py: a
    # token bucket); an alert beyond is counted as `limited`, logged, never queued
    action_spawns_per_minute: int = 60
    # this mount's fleet host id (docs/fleet.md); "" = minted once, kept in the state dir
    host_id: str = ""

    def __post_init__(self) -> None:
        if self.host_id:
            problem = host_id_problem(self.host_id)
            if problem:
                raise ValueError(f"mount.host_id: {problem}")
        problem = _number_problem(self.max_tasks, "mount.max_tasks")
        if problem:  # also for a MountConfig made in code, not parsed
            raise _Located(f"mount.max_tasks: {problem}", "mount", "max_tasks")
        if not 1 <= self.events_streams_per_uid <= self.events_streams <= 1_000_000:
            raise _Located("mount.events_streams_per_uid, events_streams: need 1 <= "
                             f"{self.events_streams_per_uid} <= {self.events_streams} "
                             "<= 1000000", "mount", "events_streams_per_uid")
        if not 1 <= self.handles_per_uid <= self.handles <= 1_000_000:
            raise _Located("mount.handles_per_uid, handles: need 1 <= "
                             f"{self.handles_per_uid} <= {self.handles} <= 1000000",
                           "mount", "handles_per_uid")
        if not 0 <= self.events_blocked_reads_per_uid <= self.events_blocked_reads \
                <= self.max_tasks - 2 * FREE_TASKS:
            raise _Located("mount.events_blocked_reads_per_uid, events_blocked_reads: "
                             f"need 0 <= {self.events_blocked_reads_per_uid} <= "
                             f"{self.events_blocked_reads} <= max_tasks - {2 * FREE_TASKS} "
                             f"({self.max_tasks - 2 * FREE_TASKS}): the rest is root's",
                           "mount", "events_blocked_reads")


@dataclass(frozen=True)
class Config:
    mount: MountConfig = field(default_factory=MountConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    modes: ModeConfig = field(default_factory=ModeConfig)
    subsystems: tuple[dict, ...] = ()
    source: str = "<embedded default>"


#: the tables of a configuration file and their settings' dataclasses
SECTIONS: dict[str, type] = {"mount": MountConfig, "store": StoreConfig, "modes": ModeConfig}


class ConfigError(ValueError):
    """A configuration mistake; str() is one line naming the file and the key, and the
    line of the file when it is known (` (at line N)`, as a TOML syntax error says)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message if line is None else f"{message} (at line {line})")
        self.line = line


class _Located(ValueError):
    """A mistake in one place of the file: `table` ("mount", "store", "modes", "subsystem"
    or "" for the top level), the subsystem's 1-based `index`, and the `key` (or None)."""

    def __init__(self, message: str, table: str, key: str | None = None,
                 index: int = 0) -> None:
        super().__init__(message)
        self.table, self.key, self.index = table, key, index


_HEADER = re.compile(r"""^\s*(\[\[?)\s*([A-Za-z0-9_.\-"' ]+?)\s*\]\]?\s*(#.*)?$""")


def _line_of(text: str, table: str, key: str | None, index: int = 0) -> int | None:
    """The line (1-based) of `key` in `table` of the TOML `text` (the `index`-th
    [[subsystem]] for "subsystem"), else of the table's header; None if not found.

    A scan of the text, not a parser (tomllib keeps no positions): bare and quoted
    keys, `table.key = ...` at the top level; a key inside a multi-line value is not
    told apart (the first match counts).
    """
    current, count, header = "", 0, None
    key = key.split(".")[0] if key else None
    for number, line in enumerate(text.splitlines(), 1):
        found = _HEADER.match(line)
        if found:
            current = found.group(2).strip().strip("\"'")
            if found.group(1) == "[[" and current == table:
                count += 1
            if current == table and (table != "subsystem" or count == index):
                header = header or number
            continue
        if key is None:
            continue
        here = (current == table and (table != "subsystem" or count == index))
        if here and re.match(rf"""^\s*(["']?){re.escape(key)}\1\s*=""", line):
            return number
        if current == "" and table and re.match(
                rf"""^\s*{re.escape(table)}\s*\.\s*(["']?){re.escape(key)}\1\s*=""", line):
            return number
    return header


#: the range of every number, "section.field" -> (lo, hi), both inclusive.  A
#: number without an entry must be finite and >= 0 (no setting of these
#: sections means anything negative); nan and inf are refused everywhere.
RANGES: dict[str, tuple[float, float]] = {
    # the one range of max_tasks (MountConfig checks it too): 2 * FREE_TASKS tasks no
    # blocked read may take, and as many again for blocked reads at the least
    "mount.max_tasks": (4 * FREE_TASKS, 65536),
    "mount.metrics_port": (0, 65535),
    "mount.max_models": (1, 100_000),
    "mount.max_subsystems": (1, 4096),
    "mount.action_spawns_per_minute": (1, 60_000),
    "store.seal_rows": (1, 10_000_000),
    # a portion at most every 0.1 s per store; at least one a year
    "store.seal_seconds": (0.1, 31_536_000),
    "store.feedback_seal_seconds": (0.1, 31_536_000),
    "store.journal_seal_seconds": (0.1, 31_536_000),
    "store.retention_bytes": (1, 1 << 60),
    "store.retention_count": (1, 1_000_000_000),
    "store.max_waiting_rows": (1, 1 << 24),
    "store.fleet_backlog_bytes": (0, 1 << 60),
    # shares of ticks
    "modes.learning_share": (0.0, 1.0),
    "modes.collaboration_share": (0.0, 1.0),
    "modes.recommendation_probe": (0.0, 1.0),
    # counts of ticks
    "modes.window_ticks": (1, 10_000_000),
    "modes.evidence_ticks": (1, 10_000_000),
    "modes.min_ml_ticks": (1, 10_000_000),
    "modes.min_dwell_ticks": (1, 10_000_000),
    "modes.emergency_cooldown_ticks": (1, 10_000_000),
    # a ratio of two default ticks' objectives, max over min
    "modes.unstable_baseline_ratio": (1.0, 1e6),
    # efficiency thresholds (ML objective / default objective) and z-scores
    "modes.to_collaboration": (0.0, 1e6),
    "modes.to_recommendation": (0.0, 1e6),
    "modes.demote_below": (0.0, 1e6),
    "modes.collapse_below": (0.0, 1e6),
    "modes.recommendation_confidence": (0.0, 1e6),
    "modes.demote_confidence": (0.0, 1e6),
    "modes.silence_seconds": (0.1, 1e9),
}


def _number_problem(value: int | float, where: str) -> str | None:
    if not math.isfinite(value):
        return f"{value} is not a finite number"
    lo, hi = RANGES.get(where, (0, math.inf))
    if not lo <= value <= hi:
        return f"{value} is outside {lo}..{hi}" if hi != math.inf \
            else f"{value} is below {lo}"
    return None


def suggestion(name: str, known: list[str], elsewhere: dict[str, str] | None = None) -> str:
    """" (did you mean X?)" for the known name nearest to a misspelled `name` (difflib),
    " (a [T] setting)" when `name` belongs to another table T, else the known names."""
    if elsewhere and name in elsewhere:
        return f" (a [{elsewhere[name]}] setting)"
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if near:
        return f" (did you mean {near[0]}?)"
    return f" (known: {', '.join(known)})"


def _elsewhere(where: str) -> dict[str, str]:
    """Every setting of the other tables, name -> its table."""
    return {f.name: table for table, cls in SECTIONS.items() if table != where
            for f in fields(cls)}


def _section(cls: type, data: object, where: str):
    if not isinstance(data, dict):
        raise _Located(f"[{where}] must be a table", where)
    known = {f.name: f for f in fields(cls)}
    unknown = [name for name in data if name not in known]
    if unknown:
        name = unknown[0]
        more = f" (and {', '.join(unknown[1:])})" if unknown[1:] else ""
        raise _Located(f"{where}.{name}: unknown setting"
                       f"{suggestion(name, list(known), _elsewhere(where))}{more}", where, name)
    values = {}
    for name, value in data.items():
        default = known[name].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise _Located(f"{where}.{name}: expected true or false", where, name)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(default, bool) and type(default) is not type(value):
            raise _Located(f"{where}.{name}: expected {type(default).__name__}", where, name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            problem = _number_problem(value, f"{where}.{name}")
            if problem:
                raise _Located(f"{where}.{name}: {problem}", where, name)
        values[name] = value
    return cls(**values)


def _check_mount(mount: MountConfig) -> None:
    """What a range cannot say: the address is not empty."""
    if not mount.metrics_address:
        raise _Located("mount.metrics_address: empty (127.0.0.1 serves loopback only)",
                       "mount", "metrics_address")


def check_host(config: Config) -> None:
    """What only the host that mounts can tell: the configured group exists.

    Separate from `parse_config`, so a configuration written for another host
    (a container image's) can still be read and checked here.
    """
    if config.mount.group:
        try:
            grp.getgrnam(config.mount.group)
        except KeyError:
            raise ConfigError(f"{config.source}: mount.group: no group "
                              f"{config.mount.group!r} on this host") from None


def _check_subsystems(entries: list) -> None:
    """Every [[subsystem]] table checked whole, with safe and unique names."""
    from mlfs.backends import check_entry
    from mlfs.base.statedir import subsystem_name_problem

    seen: dict[str, int] = {}
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise _Located(f"subsystem #{number}: must be a [[subsystem]] table", "subsystem",
                           None, number)
        label = f"subsystem #{number}"
        if isinstance(entry.get("name"), str):
            label += f" ({entry['name']})"
        elif isinstance(entry.get("backend"), str):
            label += f" ({entry['backend']})"
        try:
            names = check_entry(entry)
        except ValueError as exc:
            raise _Located(f"{label}: {exc}", "subsystem", getattr(exc, "key", None),
                           number) from None
        for name in names:
            problem = subsystem_name_problem(name)
            key = "devices" if entry.get("backend") == "linux.block" else "name"
            if problem:
                raise _Located(f"{label}: {key}: {problem}", "subsystem", key, number)
            if name in seen:
                raise _Located(f"{label}: {key}: {name!r} is already the name of "
                               f"subsystem #{seen[name]}", "subsystem", key, number)
            seen[name] = number


def parse_config(text: str, source: str) -> Config:
    """The checked configuration; ConfigError (one line, naming `source`) if wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        error = ConfigError(f"{source}: not valid TOML: {exc}")
        at = re.search(r"\(at line (\d+)", str(exc))  # tomllib says where, in its text
        error.line = int(at.group(1)) if at else None
        raise error from None
    try:
        subsystems = data.pop("subsystem", [])
        if not isinstance(subsystems, list):
            raise _Located("subsystem: must be [[subsystem]] tables", "", "subsystem")
        unknown = [name for name in data if name not in SECTIONS]
        loose = [name for name in unknown if not isinstance(data[name], dict)]
        if loose:
            raise _Located(f"{loose[0]}: a setting outside any table (settings go in "
                           "[mount], [store], [modes] or [[subsystem]])", "", loose[0])
        if unknown:
            name = unknown[0]
            near = suggestion(name, [*SECTIONS, "subsystem"])
            raise _Located(f"unknown section(s) {', '.join(unknown)}{near}", name)
        config = Config(
            mount=_section(MountConfig, data.pop("mount", {}), "mount"),
            store=_section(StoreConfig, data.pop("store", {}), "store"),
            modes=_section(ModeConfig, data.pop("modes", {}), "modes"),
            subsystems=tuple(subsystems),
            source=source,
        )
        _check_mount(config.mount)
        _check_subsystems(subsystems)
    except _Located as exc:
        raise ConfigError(f"{source}: {exc}", _line_of(text, exc.table, exc.key, exc.index)
                          ) from None
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


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
    from .abi import NAME_RULE

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
    import json

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


def default_text() -> str:
    return resources.files("mlfs").joinpath("default.toml").read_text()


def load_config(path: str | Path | None) -> Config:
    """The configuration in `path`, or the embedded default when None."""
    if path is None:
        return parse_config(default_text(), "<embedded default>")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read: {reason}") from None
    return parse_config(text, str(path))
