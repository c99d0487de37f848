"""Reading a configuration file: TOML in, a checked `Config` out, or one line saying what is wrong.

Why a module of its own: every mistake is told with the file, the key and the line
(`_line_of`, since tomllib keeps no positions) and a suggestion for a misspelled name;
that machinery is the parser's alone.  The settings themselves are in settings.py.
"""

from __future__ import annotations

import difflib
import grp
import re
import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path

from .settings import (
    SECTIONS,
    Config,
    Located,
    ModeConfig,
    MountConfig,
    StoreConfig,
    number_problem,
)


class ConfigError(ValueError):
    """A configuration mistake; str() is one line naming the file and the key, and the
    line of the file when it is known (` (at line N)`, as a TOML syntax error says)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message if line is None else f"{message} (at line {line})")
        self.line = line


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
        raise Located(f"[{where}] must be a table", where)
    known = {f.name: f for f in fields(cls)}
    unknown = [name for name in data if name not in known]
    if unknown:
        name = unknown[0]
        more = f" (and {', '.join(unknown[1:])})" if unknown[1:] else ""
        raise Located(f"{where}.{name}: unknown setting"
                       f"{suggestion(name, list(known), _elsewhere(where))}{more}", where, name)
    values = {}
    for name, value in data.items():
        default = known[name].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise Located(f"{where}.{name}: expected true or false", where, name)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(default, bool) and type(default) is not type(value):
            raise Located(f"{where}.{name}: expected {type(default).__name__}", where, name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            problem = number_problem(value, f"{where}.{name}")
            if problem:
                raise Located(f"{where}.{name}: {problem}", where, name)
        values[name] = value
    return cls(**values)


def _check_mount(mount: MountConfig) -> None:
    """What a range cannot say: the address is not empty."""
    if not mount.metrics_address:
        raise Located("mount.metrics_address: empty (127.0.0.1 serves loopback only)",
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
            raise Located(f"subsystem #{number}: must be a [[subsystem]] table", "subsystem",
                           None, number)
        label = f"subsystem #{number}"
        if isinstance(entry.get("name"), str):
            label += f" ({entry['name']})"
        elif isinstance(entry.get("backend"), str):
            label += f" ({entry['backend']})"
        try:
            names = check_entry(entry)
        except ValueError as exc:
            raise Located(f"{label}: {exc}", "subsystem", getattr(exc, "key", None),
                           number) from None
        for name in names:
            problem = subsystem_name_problem(name)
            key = "devices" if entry.get("backend") == "linux.block" else "name"
            if problem:
                raise Located(f"{label}: {key}: {problem}", "subsystem", key, number)
            if name in seen:
                raise Located(f"{label}: {key}: {name!r} is already the name of "
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
            raise Located("subsystem: must be [[subsystem]] tables", "", "subsystem")
        unknown = [name for name in data if name not in SECTIONS]
        loose = [name for name in unknown if not isinstance(data[name], dict)]
        if loose:
            raise Located(f"{loose[0]}: a setting outside any table (settings go in "
                           "[mount], [store], [modes] or [[subsystem]])", "", loose[0])
        if unknown:
            name = unknown[0]
            near = suggestion(name, [*SECTIONS, "subsystem"])
            raise Located(f"unknown section(s) {', '.join(unknown)}{near}", name)
        config = Config(
            mount=_section(MountConfig, data.pop("mount", {}), "mount"),
            store=_section(StoreConfig, data.pop("store", {}), "store"),
            modes=_section(ModeConfig, data.pop("modes", {}), "modes"),
            subsystems=tuple(subsystems),
            source=source,
        )
        _check_mount(config.mount)
        _check_subsystems(subsystems)
    except Located as exc:
        raise ConfigError(f"{source}: {exc}", _line_of(text, exc.table, exc.key, exc.index)
                          ) from None
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


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
