"""A backend as one typed object: what its module exports as `BACKEND`.

A backend registers in the entry-point group `mlfs.backends` (`ENTRY_POINT_GROUP`);
the entry point names its module, and the module exports one `Backend`:

    BACKEND = Backend(name="example.cache", description="...", settings=SETTINGS,
                      check=check, factory=factory, kinds=("knob",))

Everything the registry, `mlfs backends`, the mount's `load`/`mkdir` and the
conformance suite (tests/mount/test_backend_conformance.py) need to know about a
backend is a field here, checked once when the object is made: a misspelt
attribute is a TypeError at import, not a right silently missing at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .settings import Schema, describe_schema
from .subsystem import NAME, NAME_RULE, Subsystem

#: the entry-point group where backends register (built-ins included)
ENTRY_POINT_GROUP = "mlfs.backends"


@dataclass(frozen=True)
class ConformanceEnv:
    """What the conformance suite offers a backend to build one test instance on.

    `device` is a block device the backend may tune and trace (a loop device over a
    sparse file, e.g. "loop3"; None where the suite could not make one); `scratch` a
    directory of its own.  `Backend.example` turns it into settings.
    """

    device: str | None
    scratch: Path


class ExampleUnavailable(LookupError):
    """`Backend.example` cannot build on this machine; str() says why (the suite skips)."""


@dataclass(frozen=True)
class Backend:
    """One backend: its name, what it accepts, how it is built and the rights it needs.

    * `name`: the entry-point name it registers under (`backend = "linux.vm"`);
    * `description`: one line for `mlfs backends` and `MOUNT/backends`;
    * `settings`: the `Schema` its `[[subsystem]]` table is checked against;
    * `check(settings) -> (checked settings, subsystem names)`: the whole table
      checked, nothing built, SettingError naming the key;
    * `factory(settings) -> list[Subsystem]`: builds what `check` accepted;
    * `root_only`: the backend makes the daemon write (or trace) what its settings
      name, so a run-time `load` of it is root's alone, never the configured group's;
    * `uses_state_dir`: the factory gets the mount's state directory as `state_dir`
      (the ledger of original knob values lives there);
    * `kinds`: the kinds of model its subsystems serve ("knob", "predictor", ...: the
      core's registry of kinds decides what each means), when known; () otherwise;
    * `settings_for_name(name) -> dict | None`: the settings that serve the
      subsystem `name` (`linux.block.sdb` -> `devices = ["sdb"]`), so
      `mkdir MOUNT/<name>` can load it; None when the name is not one of its;
    * `writes_kernel(settings) -> bool`: whether a table lets its subsystem write
      kernel settings (such a run-time load is root's); None: it does when it has
      an `apply` table or declared `knobs`;
    * `example(env) -> settings`: settings that build one small instance on
      `env` (a `ConformanceEnv`) for the conformance suite, or ExampleUnavailable
      saying why not here; None: the empty table builds one.
    """

    name: str
    description: str
    settings: Schema
    check: Callable[[dict], tuple[dict, list[str]]]
    factory: Callable[[dict], list[Subsystem]]
    root_only: bool = False
    uses_state_dir: bool = False
    kinds: tuple[str, ...] = ()
    settings_for_name: Callable[[str], dict | None] | None = None
    writes_kernel: Callable[[Mapping[str, Any]], bool] | None = None
    example: Callable[[ConformanceEnv], dict] | None = None

    def __post_init__(self) -> None:
        problem = backend_problem(self)
        if problem is not None:
            raise TypeError(f"Backend {self.name!r}: {problem}")
        object.__setattr__(self, "description", " ".join(self.description.split()))
        object.__setattr__(self, "kinds", tuple(self.kinds))

    def describe(self) -> dict:
        """The backend as `mlfs backends --json` lists it (without its package)."""
        return {"name": self.name, "description": self.description,
                "settings": describe_schema(self.settings), "kinds": list(self.kinds),
                "root_only": self.root_only, "uses_state_dir": self.uses_state_dir}


def backend_problem(backend: Backend) -> str | None:
    """Why `backend`'s fields cannot be served (one line), or None."""
    if not isinstance(backend.name, str) or not NAME.fullmatch(backend.name):
        return f"name does not match {NAME_RULE}"
    if not isinstance(backend.description, str) or not backend.description.strip():
        return "description is not a non-empty string"
    if not isinstance(backend.settings, Mapping) or \
            not all(isinstance(k, str) and callable(c) for k, c in backend.settings.items()):
        return "settings is not a Schema (a mapping of names to checks)"
    for field_name in ("check", "factory"):
        if not callable(getattr(backend, field_name)):
            return f"{field_name} is not callable"
    for field_name in ("settings_for_name", "writes_kernel", "example"):
        value = getattr(backend, field_name)
        if value is not None and not callable(value):
            return f"{field_name} is neither None nor callable"
    for field_name in ("root_only", "uses_state_dir"):
        if not isinstance(getattr(backend, field_name), bool):
            return f"{field_name} is not True or False"
    kinds = backend.kinds
    if isinstance(kinds, str) or not all(isinstance(k, str) and NAME.fullmatch(k)
                                         for k in kinds):
        return f"kinds is not a tuple of names ({NAME_RULE})"
    return None
