"""Which code a benchmark measured: every raw output names its commit (issue 33)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def measured_commit() -> str:
    """The checkout's commit, with "+dirty" when it has uncommitted changes: which
    code a run measured (issue 33: claims must name it)."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")
