"""Which code a benchmark measured: every raw output names its commit (issue 33)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

#: the package's parts a checkout keeps in folders of its own (pyproject.toml maps
#: them to mlfs.trainers and mlfs.backends)
PACKAGE_PARTS = ("mlfs", "mlfs.trainers", "mlfs.backends")


def foreign_parts(repo: Path) -> list[str]:
    """The package's parts this process imports from outside `repo`.

    A bench run from a second checkout (a `git worktree`, so that the main one can be
    edited meanwhile) imports `mlfs` from its working directory, but an editable install
    of the main checkout maps `mlfs.trainers` and `mlfs.backends` to the main
    checkout's folders: the run would measure one commit's core with another's trainer
    and backends, under the first commit's name.  Symlinks `mlfs/trainers ->
    ../trainers` and `mlfs/backends -> ../backends` in the second checkout make it
    import its own.
    """
    foreign = []
    for name in PACKAGE_PARTS:
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            continue
        where = spec and (spec.origin if spec.origin not in (None, "namespace")
                          else next(iter(spec.submodule_search_locations or []), None))
        if where and repo.resolve() not in Path(where).resolve().parents:
            foreign.append(f"{name} from {Path(where).resolve().parent}")
    return foreign


def measured_commit() -> str:
    """The checkout's commit, with "+dirty" when it has uncommitted changes: which
    code a run measured (issue 33: claims must name it); "+mixed" when part of the
    package came from another checkout (`foreign_parts`), said on stderr too."""
    repo = Path(__file__).resolve().parents[2]
    foreign = foreign_parts(repo)
    if foreign:
        print(f"provenance: {repo} measures code from elsewhere: {'; '.join(foreign)}",
              file=sys.stderr)
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return ((head or "unknown") + ("+dirty" if dirty else "")
            + ("+mixed" if foreign else ""))
