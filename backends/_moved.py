"""Old import names that keep working for one release (issue 27: the ABI in two places).

A module that moved leaves a one-line stand-in under its old name that calls `alias`:
the old name then *is* the new module (the same object, private names included, so
state such as a module-level cache is never duplicated), and importing it says once,
as a DeprecationWarning, where the module went.  mlfs itself never imports an old name.
"""

from __future__ import annotations

import importlib
import sys
import warnings

#: the release after which the old names go
REMOVED_IN = "0.2"


def alias(old: str, new: str) -> None:
    """Make module `old` an alias of module `new`, warning that `old` is deprecated."""
    warnings.warn(f"{old} is deprecated and goes in mlfs {REMOVED_IN}: import {new}",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
