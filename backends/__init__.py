"""Backends: the subsystems a mount serves, found through entry points.

Every backend, built-in or not, registers in the entry-point group
`mlfs.backends` (`mlfs.abi.ENTRY_POINT_GROUP`): the entry point's name is the
backend's name (`backend = "linux.vm"` in a `[[subsystem]]` table) and its
value a module (or `module:object`) providing

* `check(settings) -> (checked settings, subsystem names)`: the whole table
  checked, nothing built, SettingError naming the key;
* `factory(settings) -> list[Subsystem]`;
* optionally `DESCRIPTION` (one line), `SETTINGS` (the `Schema` it checks
  against, listed by `mlfs backends`) and `USES_STATE_DIR = True` (the
  factory then gets the mount's state directory as `state_dir`, for a ledger
  of original knob values);
* optionally `ROOT_ONLY = True`: the backend makes the daemon write files its
  settings name (a declared subsystem), so a run-time `load` of it is root's
  alone, never the configured group's;
* optionally `settings_for_name(name) -> dict | None`: the settings that
  serve the subsystem `name` (`linux.block.sdb` -> `devices = ["sdb"]`), so
  `mkdir MOUNT/<name>` can load it; None when the name is not one of its.

The built-ins are registered in mlfs's own pyproject.toml.  An installed mlfs
reads them from its package metadata like any plugin's; a checkout (see
mlfs/__init__.py) reads them from its pyproject.toml, because the installed
metadata may belong to another checkout.  A backend is imported only when a
configuration names it (or when `mlfs backends` lists everything); one that
fails to import is reported with its package and the reason, never a crash.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass

import mlfs
from mlfs.abi import (
    ENTRY_POINT_GROUP,
    Knob,
    Objective,
    Sample,
    SettingError,
    Subsystem,
    application_objective,
    describe_schema,
    split_core_settings,
    subsystem_problems,
)

OWN_DISTRIBUTION = "mlfs"


@dataclass(frozen=True)
class Registered:
    """One entry point of the group: backend name, target, the package providing it."""

    name: str
    value: str
    package: str

    def load(self):
        """The backend module (or object); BackendImportError when it cannot be imported."""
        try:
            return importlib.metadata.EntryPoint(self.name, self.value, ENTRY_POINT_GROUP).load()
        except (Exception, SystemExit) as exc:  # third-party code: anything may happen
            raise BackendImportError(self, exc) from exc


class BackendImportError(SettingError):
    """A registered backend failed to import; str() names the package and the reason."""

    def __init__(self, entry: Registered, exc: BaseException) -> None:
        reason = (f"backend {entry.name!r} (package {entry.package}, {entry.value}) "
                  f"failed to import: {type(exc).__name__}: {exc}")
        super().__init__("backend", reason)
        self.entry = entry


def _own_entries() -> dict[str, str] | None:
    """The built-ins from the checkout's pyproject.toml, or None when installed."""
    if mlfs.SOURCE_TREE is None:
        return None
    with open(mlfs.SOURCE_TREE / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return dict(project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


def registered() -> tuple[dict[str, Registered], list[str]]:
    """Every registered backend by name, and the problems found (name clashes).

    mlfs's own backends come first and win a clash; then other packages in
    name order (the first wins, the others are reported).
    """
    found: dict[str, Registered] = {}
    problems: list[str] = []
    own = _own_entries()
    if own is not None:
        for name, value in own.items():
            found[name] = Registered(name, value, OWN_DISTRIBUTION)
    entries = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = ep.dist.name if ep.dist is not None else "?"
        if own is not None and package.lower() == OWN_DISTRIBUTION:
            continue  # the installed metadata of possibly another checkout
        entries.append((package.lower() != OWN_DISTRIBUTION, package, ep.name, ep.value))
    for _, package, name, value in sorted(entries):
        if name in found:
            if found[name].value != value or found[name].package != package:
                problems.append(f"backend {name!r} of package {package} ignored: "
                                f"{found[name].package} registers it too")
            continue
        found[name] = Registered(name, value, package)
    return found, problems


def _module(backend: object):
    known, _ = registered()
    if not isinstance(backend, str) or backend not in known:
        raise SettingError("backend", f"unknown backend {backend!r} "
                           f"(known: {', '.join(sorted(known))})")
    return known[backend].load()


def describe_backends() -> tuple[list[dict], list[str]]:
    """Every backend as {name, package, description, settings}, and the problems.

    Imports each backend; one that fails is a problem line (which package,
    why), not an entry.
    """
    known, problems = registered()
    out = []
    for name in sorted(known):
        entry = known[name]
        try:
            module = entry.load()
        except BackendImportError as exc:
            problems.append(exc.reason)
            continue
        description = " ".join(str(getattr(module, "DESCRIPTION", "")).split())
        schema = getattr(module, "SETTINGS", None)
        out.append({"name": name, "package": entry.package,
                    "description": description or "(no description)",
                    "settings": describe_schema(schema) if isinstance(schema, Mapping)
                    else []})
    return out, problems


def listing_text(backends: list[dict]) -> str:
    """`MOUNT/backends`: one line per backend (`describe_backends`), name and description."""
    return "".join(f"{b['name']} {b['description']}\n" for b in backends)


def check_entry(entry: Mapping) -> list[str]:
    """Check one `[[subsystem]]` table whole, building nothing; its subsystem names.

    Raises SettingError naming the key.  `state_dir` is mlfs's own, never a
    configuration's (the ledger must live in the mount's state directory).
    """
    if "backend" not in entry:
        raise SettingError("backend", "missing (which backend serves this subsystem?)")
    _, settings = split_core_settings(entry)  # the core's own (an action) checked here
    module = _module(settings.pop("backend"))
    if "state_dir" in settings:
        raise SettingError("state_dir", "set by mlfs (the mount's state directory), "
                           "not by the configuration")
    _, names = module.check(settings)
    return names


def root_only(backend: str) -> bool:
    """Whether only root may load `backend` at run time (its `ROOT_ONLY`)."""
    return bool(getattr(_module(backend), "ROOT_ONLY", False))


#: settings keys that let a subsystem write kernel settings (every built-in backend's)
KERNEL_WRITE_KEYS = ("apply", "knobs")


def writes_kernel(entry: Mapping) -> bool:
    """Whether a `[[subsystem]]` table lets its subsystem write kernel settings: an
    `apply` table (linux.vm, linux.block) or declared knobs (linux.sysfs), or whatever
    the backend's own `writes_kernel(settings)` says.  Such a run-time load is root's."""
    module = _module(entry["backend"])
    own = getattr(module, "writes_kernel", None)
    if callable(own):
        return bool(own({k: v for k, v in entry.items() if k != "backend"}))
    return any(entry.get(key) for key in KERNEL_WRITE_KEYS)


def entry_for_name(name: str) -> dict | None:
    """The `[[subsystem]]` table a `mkdir MOUNT/<name>` loads, or None.

    The backend is the longest registered name that `name` extends by a dot
    (`linux.block.sdb` -> `linux.block`); it decides through its
    `settings_for_name` whether the rest names something it can serve.
    """
    known, _ = registered()
    for backend in sorted(known, key=len, reverse=True):
        if not name.startswith(backend + "."):
            continue
        derive = getattr(known[backend].load(), "settings_for_name", None)
        settings = derive(name) if callable(derive) else None
        if settings is not None:
            return {"backend": backend, **settings}
    return None


def restore_orphans(state_dir) -> dict[str, str]:
    """Put back every ledger original whose owner is gone (`linux.ledger.recover`).

    For a remembered subsystem that cannot be built (its backend uninstalled):
    the knobs it touched before the crash or umount still get their originals.
    Entries of live subsystems are left alone.
    """
    from .linux.ledger import Ledger, recover

    ledger = Ledger(state_dir, create=False)
    if not ledger.directory.is_dir():
        return {}
    return recover(ledger)


def create_subsystems(entries: tuple[dict, ...] | list[dict],
                      state_dir: str | None = None) -> list[Subsystem]:
    """Build every configured subsystem; names must be unique.

    Every entry is checked (`check_entry`) before any is built.  Backends that
    write real settings (`USES_STATE_DIR`) get the state directory (for the
    ledger of original values) as their `state_dir` setting.
    """
    for entry in entries:
        check_entry(entry)
    subsystems: list[Subsystem] = []
    for entry in entries:
        core, settings = split_core_settings(entry)
        module = _module(settings.pop("backend"))
        if state_dir is not None and getattr(module, "USES_STATE_DIR", False):
            settings["state_dir"] = str(state_dir)
        built = module.factory(settings)
        for subsystem in built:
            objective = application_objective(core, subsystem.objective)
            if objective is not None:  # the core's rule, whatever the backend measures
                subsystem.objective = objective
            problems = subsystem_problems(subsystem)
            if problems:
                for other in subsystems + built:
                    other.close()  # restore what was already touched
                raise SettingError("backend", f"{entry['backend']} built a subsystem the "
                                   f"core cannot serve: {'; '.join(problems)}")
        subsystems.extend(built)
    names = [s.name for s in subsystems]
    if len(set(names)) != len(names):
        raise ValueError(f"subsystem names repeat: {names}")
    return subsystems


__all__ = ["BackendImportError", "Knob", "Objective", "Registered", "Sample", "SettingError",
           "Subsystem", "check_entry", "create_subsystems", "describe_backends",
           "entry_for_name", "listing_text", "registered", "restore_orphans", "root_only",
           "writes_kernel"]
