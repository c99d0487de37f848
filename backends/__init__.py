"""Backends: the subsystems a mount serves, chosen by name in the configuration."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module

from mlfs.abi import Knob, Objective, Sample, Subsystem

from .settings import SettingError

#: backend name -> the module providing `check(settings)` and `factory(settings)`;
#: imported only when a configuration names the backend
MODULES: dict[str, str] = {
    "sim.readahead": "mlfs.backends.sim_readahead",
    "linux.vm": "mlfs.backends.linux_vm",
    "linux.block": "mlfs.backends.linux_block",
}


def _module(backend: object):
    if not isinstance(backend, str) or backend not in MODULES:
        raise SettingError("backend", f"unknown backend {backend!r} "
                           f"(known: {', '.join(MODULES)})")
    return import_module(MODULES[backend])


def check_entry(entry: Mapping) -> list[str]:
    """Check one `[[subsystem]]` table whole, building nothing; its subsystem names.

    Raises SettingError naming the key.  `state_dir` is mlfs's own, never a
    configuration's (the ledger must live in the mount's state directory).
    """
    if "backend" not in entry:
        raise SettingError("backend", "missing (which backend serves this subsystem?)")
    settings = dict(entry)
    module = _module(settings.pop("backend"))
    if "state_dir" in settings:
        raise SettingError("state_dir", "set by mlfs (the mount's state directory), "
                           "not by the configuration")
    _, names = module.check(settings)
    return names


def create_subsystems(entries: tuple[dict, ...] | list[dict],
                      state_dir: str | None = None) -> list[Subsystem]:
    """Build every configured subsystem; names must be unique.

    Every entry is checked (`check_entry`) before any is built.  Backends that
    write real settings need the state directory (for the ledger of original
    values): it is passed as the `state_dir` setting to every factory except
    the simulated one.
    """
    for entry in entries:
        check_entry(entry)
    subsystems: list[Subsystem] = []
    for entry in entries:
        settings = dict(entry)
        if state_dir is not None and not settings["backend"].startswith("sim."):
            settings["state_dir"] = str(state_dir)
        backend = settings.pop("backend")
        subsystems.extend(_module(backend).factory(settings))
    names = [s.name for s in subsystems]
    if len(set(names)) != len(names):
        raise ValueError(f"subsystem names repeat: {names}")
    return subsystems


__all__ = ["Knob", "Objective", "Sample", "SettingError", "Subsystem", "check_entry",
           "create_subsystems", "MODULES"]
