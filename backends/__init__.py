"""Backends: the subsystems a mount serves, chosen by name in the configuration."""

from __future__ import annotations

from collections.abc import Callable

from .base import Knob, Objective, Sample, Subsystem


def _sim_readahead(settings: dict) -> list[Subsystem]:
    from .sim_readahead import SimReadahead

    allowed = {"name", "seed", "tick_seconds", "phase_ticks", "noise", "critical_pressure",
               "phases"}
    unknown = set(settings) - allowed
    if unknown:
        raise ValueError(f"sim.readahead: unknown setting(s) {', '.join(sorted(unknown))}")
    kwargs = dict(settings)
    for key in ("phase_ticks", "phases"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    return [SimReadahead(**kwargs)]


def _linux_vm(settings: dict) -> list[Subsystem]:
    from .linux_vm import factory

    return list(factory(settings))


def _linux_block(settings: dict) -> list[Subsystem]:
    from .linux_block import factory

    return list(factory(settings))


FACTORIES: dict[str, Callable[[dict], list[Subsystem]]] = {
    "sim.readahead": _sim_readahead,
    "linux.vm": _linux_vm,
    "linux.block": _linux_block,
}


def create_subsystems(entries: tuple[dict, ...] | list[dict],
                      state_dir: str | None = None) -> list[Subsystem]:
    """Build every configured subsystem; names must be unique.

    Backends that write real settings need the state directory (for the
    ledger of original values): it is passed as the `state_dir` setting to
    every factory except the simulated one.
    """
    subsystems: list[Subsystem] = []
    for entry in entries:
        settings = dict(entry)
        if state_dir is not None and not settings["backend"].startswith("sim."):
            settings["state_dir"] = str(state_dir)
        backend = settings.pop("backend")
        factory = FACTORIES.get(backend)
        if factory is None:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(FACTORIES)})")
        subsystems.extend(factory(settings))
    names = [s.name for s in subsystems]
    if len(set(names)) != len(names):
        raise ValueError(f"subsystem names repeat: {names}")
    return subsystems


__all__ = ["Knob", "Objective", "Sample", "Subsystem", "create_subsystems", "FACTORIES"]
