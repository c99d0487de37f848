"""Backends: the subsystems a mount serves, found through entry points.

Every backend, built-in or not, registers in the entry-point group
`mlfs.backends` (`mlfs.abi.ENTRY_POINT_GROUP`): the entry point's name is the
backend's name (`backend = "linux.vm"` in a `[[subsystem]]` table) and its
value a module exporting `BACKEND`, an `mlfs.abi.Backend` (or `module:object`
naming the Backend itself).  The Backend says everything the registry needs:
description, settings schema, check, factory, the rights it needs (root only,
the state directory), the kinds of model it serves and which subsystem names
it can load at run time (docs/writing-a-backend.md).

The registry reads installed package metadata only, mlfs's own built-ins
included (pyproject.toml registers them; a checkout's `pip install -e` installs
that checkout's metadata).  A backend is imported only when a configuration
names it (or when `mlfs backends` lists everything); one that fails to import,
or exports no Backend, is reported with its package and the reason, never a crash.

A module written for mlfs 0.1's optional attributes (`check`, `factory`,
`DESCRIPTION`, `SETTINGS`, `USES_STATE_DIR`, `ROOT_ONLY`, `settings_for_name`)
still loads until mlfs `OLD_STYLE_REMOVED_IN`: the registry adapts it into a
Backend and says so (a DeprecationWarning, a log line once per process, and a
line on `mlfs backends`' stderr).
"""

from __future__ import annotations

import importlib.metadata
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from mlfs.abi import (
    ENTRY_POINT_GROUP,
    Backend,
    Knob,
    Objective,
    Sample,
    SettingError,
    Subsystem,
    application_objective,
    split_core_settings,
    subsystem_problems,
)

log = logging.getLogger("mlfs.backends")

OWN_DISTRIBUTION = "mlfs"
#: the release after which a backend module without `BACKEND` is refused
OLD_STYLE_REMOVED_IN = "0.2"


@dataclass(frozen=True)
class Registered:
    """One entry point of the group: backend name, target, the package providing it."""

    name: str
    value: str
    package: str

    def load(self) -> Backend:
        """The backend; BackendImportError when it cannot be imported or is no Backend."""
        try:
            target = importlib.metadata.EntryPoint(self.name, self.value,
                                                   ENTRY_POINT_GROUP).load()
        except (Exception, SystemExit) as exc:  # third-party code: anything may happen
            raise BackendImportError(self, f"failed to import: {type(exc).__name__}: {exc}") \
                from exc
        backend = _as_backend(self, target)
        if backend.name != self.name:
            raise BackendImportError(self, f"its Backend is named {backend.name!r}; the entry "
                                     "point's name and the Backend's must be the same")
        return backend


class BackendImportError(SettingError):
    """A registered backend cannot be used; str() names the package and the reason."""

    def __init__(self, entry: Registered, why: str) -> None:
        reason = f"backend {entry.name!r} (package {entry.package}, {entry.value}) {why}"
        super().__init__("backend", reason)
        self.entry = entry


#: old-style backends already logged as such (once per process)
_WARNED: set[str] = set()


def _as_backend(entry: Registered, target: object) -> Backend:
    """The Backend an entry point's target is, exports, or (deprecated) spells out."""
    if isinstance(target, Backend):
        return target
    exported = getattr(target, "BACKEND", None)
    if isinstance(exported, Backend):
        return exported
    if exported is not None:
        raise BackendImportError(entry, f"exports BACKEND = {type(exported).__name__}, "
                                 "not an mlfs.abi.Backend")
    if not (callable(getattr(target, "check", None))
            and callable(getattr(target, "factory", None))):
        raise BackendImportError(entry, "exports no BACKEND (an mlfs.abi.Backend)")
    message = (f"backend {entry.name!r} (package {entry.package}) has no BACKEND; its "
               f"module attributes are read until mlfs {OLD_STYLE_REMOVED_IN}: export "
               "BACKEND = mlfs.abi.Backend(...) (docs/writing-a-backend.md)")
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    if entry.name not in _WARNED:  # the daemon's log says it once, whatever the filters
        _WARNED.add(entry.name)
        log.warning("%s", message)
    schema = getattr(target, "SETTINGS", None)
    try:
        return Backend(
            name=entry.name,
            description=str(getattr(target, "DESCRIPTION", "") or "(no description)"),
            settings=schema if isinstance(schema, Mapping) else {},
            check=target.check, factory=target.factory,  # type: ignore[attr-defined]
            root_only=bool(getattr(target, "ROOT_ONLY", False)),
            uses_state_dir=bool(getattr(target, "USES_STATE_DIR", False)),
            settings_for_name=getattr(target, "settings_for_name", None),
            writes_kernel=getattr(target, "writes_kernel", None))
    except TypeError as exc:
        raise BackendImportError(entry, f"cannot be adapted: {exc}") from None


def registered() -> tuple[dict[str, Registered], list[str]]:
    """Every registered backend by name, and the problems found (name clashes).

    mlfs's own backends come first and win a clash; then other packages in
    name order (the first wins, the others are reported).
    """
    found: dict[str, Registered] = {}
    problems: list[str] = []
    entries = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = ep.dist.name if ep.dist is not None else "?"
        entries.append((package.lower() != OWN_DISTRIBUTION, package, ep.name, ep.value))
    for _, package, name, value in sorted(entries):
        if name in found:
            if found[name].value != value or found[name].package != package:
                problems.append(f"backend {name!r} of package {package} ignored: "
                                f"{found[name].package} registers it too")
            continue
        found[name] = Registered(name, value, package)
    return found, problems


def backend(name: object) -> Backend:
    """The registered backend `name`; SettingError naming `backend` when there is none."""
    known, _ = registered()
    if not isinstance(name, str) or name not in known:
        raise SettingError("backend", f"unknown backend {name!r} "
                           f"(known: {', '.join(sorted(known))})")
    return known[name].load()


def describe_backends() -> tuple[list[dict], list[str]]:
    """Every backend as {name, package, description, settings, kinds, ...}, and the problems.

    Imports each backend; one that fails is a problem line (which package,
    why), not an entry; one in the old attribute style is listed, with a
    problem line saying it is deprecated.
    """
    known, problems = registered()
    out = []
    for name in sorted(known):
        entry = known[name]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            try:
                found = entry.load()
            except BackendImportError as exc:
                problems.append(exc.reason)
                continue
        problems.extend(str(w.message) for w in caught
                        if issubclass(w.category, DeprecationWarning)
                        and "has no BACKEND" in str(w.message))
        out.append({"package": entry.package, **found.describe()})
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
    found = backend(settings.pop("backend"))
    if "state_dir" in settings:
        raise SettingError("state_dir", "set by mlfs (the mount's state directory), "
                           "not by the configuration")
    _, names = found.check(settings)
    return names


def root_only(name: str) -> bool:
    """Whether only root may load backend `name` at run time (`Backend.root_only`)."""
    return backend(name).root_only


#: settings keys that let a subsystem write kernel settings (every built-in backend's)
KERNEL_WRITE_KEYS = ("apply", "knobs")


def writes_kernel(entry: Mapping) -> bool:
    """Whether a `[[subsystem]]` table lets its subsystem write kernel settings: an
    `apply` table (linux.vm, linux.block) or declared knobs (linux.sysfs), or whatever
    the backend's own `writes_kernel(settings)` says.  Such a run-time load is root's."""
    own = backend(entry["backend"]).writes_kernel
    if own is not None:
        return bool(own({k: v for k, v in entry.items() if k != "backend"}))
    return any(entry.get(key) for key in KERNEL_WRITE_KEYS)


def entry_for_name(name: str) -> dict | None:
    """The `[[subsystem]]` table a `mkdir MOUNT/<name>` loads, or None.

    The backend is the longest registered name that `name` extends by a dot
    (`linux.block.sdb` -> `linux.block`); it decides through its
    `settings_for_name` whether the rest names something it can serve.
    """
    known, _ = registered()
    for candidate in sorted(known, key=len, reverse=True):
        if not name.startswith(candidate + "."):
            continue
        derive = known[candidate].load().settings_for_name
        settings = derive(name) if derive is not None else None
        if settings is not None:
            return {"backend": candidate, **settings}
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
    write real settings (`Backend.uses_state_dir`) get the state directory (for the
    ledger of original values) as their `state_dir` setting.
    """
    for entry in entries:
        check_entry(entry)
    subsystems: list[Subsystem] = []
    for entry in entries:
        core, settings = split_core_settings(entry)
        found = backend(settings.pop("backend"))
        if state_dir is not None and found.uses_state_dir:
            settings["state_dir"] = str(state_dir)
        built = found.factory(settings)
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


__all__ = ["Backend", "BackendImportError", "Knob", "Objective", "Registered", "Sample",
           "SettingError", "Subsystem", "backend", "check_entry", "create_subsystems",
           "describe_backends", "entry_for_name", "listing_text", "registered",
           "restore_orphans", "root_only", "writes_kernel"]
