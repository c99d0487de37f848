"""mlfs: the kernel <-> user-space ML exchange, as a FUSE filesystem.

The repository keeps the design card's layout (`mlfs/`, `backends/`,
`trainers/` at the top) but installs the last two as `mlfs.backends` and
`mlfs.trainers` (pyproject's package-dir mapping), so mlfs claims no generic
top-level name in site-packages.  An installed copy therefore has
`mlfs/backends/` inside the package.  A source tree does not: when Python
imports `mlfs` straight from a checkout (tests and `python -m mlfs` run with
cwd = the checkout, each git worktree against its own code), `mlfs.backends`
would otherwise be looked up by the editable install's finder, which points
into whichever checkout ran `pip install -e` -- another worktree's code, or
none at all before the venv is reinstalled.  So in a source tree, and only
there, the two sub-packages are found beside this directory.
"""

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

__version__ = "0.1.0"

_SOURCE_TREE = Path(__file__).resolve().parent.parent
_MAPPED = {"mlfs.backends": "backends", "mlfs.trainers": "trainers"}


class _SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Finds `mlfs.backends` / `mlfs.trainers` in the checkout this `mlfs` came from."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MAPPED:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(_SOURCE_TREE)])


#: the checkout this mlfs runs from (pyproject.toml beside it, the sub-packages
#: not inside the package), or None for an installed copy
SOURCE_TREE = (_SOURCE_TREE if (_SOURCE_TREE / "pyproject.toml").is_file()
               and not (Path(__file__).parent / "backends").exists() else None)

if SOURCE_TREE is not None and not any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceTreeFinder())
