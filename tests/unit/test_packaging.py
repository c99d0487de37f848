"""What gets installed: everything under `mlfs`, and a checkout runs its own code."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_installed_packages_claim_no_generic_top_level_name():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "mlfs" or p.startswith("mlfs.") for p in config["packages"])
    assert config["package-dir"]["mlfs.backends"] == "backends"
    assert config["package-dir"]["mlfs.trainers"] == "trainers"


def test_a_checkout_imports_its_own_backends_and_trainers():
    done = subprocess.run(
        [sys.executable, "-c", "import mlfs.backends, mlfs.trainers.knob.learner as t; "
         "print(mlfs.backends.__file__); print(t.__file__)"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == [str(REPO / "backends" / "__init__.py"),
                                   str(REPO / "trainers" / "knob" / "learner.py")]
