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


def test_every_package_directory_is_installed():
    # an installed copy (the container images, a wheel) holds only the listed packages:
    # a new package missing from the list imports in a checkout and fails installed
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = set()
    for prefix, folder in (("mlfs", "mlfs"), ("mlfs.backends", "backends"),
                           ("mlfs.trainers", "trainers")):
        for marker in (REPO / folder).rglob("__init__.py"):
            parts = marker.parent.relative_to(REPO / folder).parts
            on_disk.add(".".join((prefix, *parts)))
    assert on_disk - set(config["packages"]) == set(), "add them to [tool.setuptools] packages"


def test_a_checkout_imports_its_own_backends_and_trainers():
    done = subprocess.run(
        [sys.executable, "-c", "import mlfs.backends, mlfs.trainers.knob.learner as t; "
         "print(mlfs.backends.__file__); print(t.__file__)"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == [str(REPO / "backends" / "__init__.py"),
                                   str(REPO / "trainers" / "knob" / "learner.py")]


def test_the_mapping_is_kept_only_in_pyproject_no_finder_and_no_run_time_reading():
    # the package-dir table is the one place: mlfs installs no import hook, and the
    # backend registry reads installed metadata, never the checkout's pyproject.toml
    done = subprocess.run(
        [sys.executable, "-c", "import sys, mlfs, mlfs.backends as b; "
         "print([type(f).__module__ for f in sys.meta_path if 'mlfs' in type(f).__module__]); "
         "print(sorted(b.registered()[0]))"],
        cwd="/", capture_output=True, text=True, timeout=60, check=True)
    hooks, names = done.stdout.splitlines()
    assert hooks == "[]"
    assert "'linux.vm'" in names and "'sim.readahead'" in names
    registry = (REPO / "backends" / "__init__.py").read_text()
    assert "pyproject" not in registry.replace("pyproject.toml registers", "")
    assert "tomllib" not in registry


def test_every_built_in_entry_point_is_installed_as_pyproject_declares():
    import importlib.metadata

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "entry-points"]["mlfs.backends"]
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(
        group="mlfs.backends") if ep.dist is not None and ep.dist.name == "mlfs"}
    assert installed == declared, "run `pip install -e .` again after changing entry points"
