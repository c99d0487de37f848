"""The one rule for the tables that plug points are kept in.

Kinds of model (`mlfs.core.models.kinds`), their trainers (`mlfs.trainers.kinds`), their
fleet rounds (`mlfs.fleet.kinds`) and their demos (`mlfs.demos`) are each a table keyed
by the kind's name.  An entry is added once (a second entry of the same name is a
programming error, refused at import) and names its code as "module:function", imported
only when it runs: a trainer's or a fleet round's imports take seconds, and a mount must
not pay for LightGBM or Dask to list what it could run.
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import Any, TypeVar

Entry = TypeVar("Entry")


def add_entry(table: MutableMapping[str, Entry], entry: Entry, what: str) -> Entry:
    """Put `entry` into `table` under `entry.name`; ValueError if the name is taken."""
    name = entry.name  # type: ignore[attr-defined]
    if name in table:
        raise ValueError(f"{what} {name!r} is registered already")
    table[name] = entry
    return entry


def load_target(target: str) -> Any:
    """The object a "module:function" string names, its module imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
