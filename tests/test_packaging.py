"""What a packager and a new user read first: LICENSE, extras, README links, .ci/setup."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.harness import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_license_file_is_the_mit_text_pyproject_declares():
    assert PYPROJECT["license"] == "MIT" and PYPROJECT["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Permission is hereby granted" in text


def test_extras_offer_plots_and_docs_and_tests_pull_in_what_they_run():
    extras = PYPROJECT["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plots"])
    assert {d.split(">")[0] for d in extras["docs"]} == {"argparse-manpage", "shtab"}
    assert "mlfs[docs]" in extras["test"]  # tests/test_cli.py regenerates the man page
    assert any(d.startswith("prometheus-client") for d in extras["test"])
    for runtime in PYPROJECT["dependencies"]:
        assert not runtime.startswith(("matplotlib", "argparse-manpage", "shtab"))
    assert "Operating System :: POSIX :: Linux" in PYPROJECT["classifiers"]


def test_fleet_extra_brings_dask_distributed_and_is_part_of_the_test_extra():
    extras = PYPROJECT["optional-dependencies"]
    assert any(d.startswith("dask[") and "distributed" in d for d in extras["fleet"])
    assert "mlfs[fleet]" in extras["test"]  # .ci/setup installs '.[test]'
    for runtime in PYPROJECT["dependencies"]:
        assert not runtime.startswith(("dask", "distributed"))  # one host needs no cluster
    import lightgbm.dask  # noqa: F401  (what `mlfs fleet train` runs on)


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md", *sorted(
    str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_markdown_links_point_at_files_inside_the_repository(name):
    path = REPO / name
    text = path.read_text()
    outside = "/".join(("..", "shared"))  # the sibling folder the project must not cite
    assert outside not in text, f"{name} cites a folder outside the repository"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert not target.startswith(("http:", "https:")), f"{name}: external link {target}"
        if target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO) and resolved.exists(), f"{name}: {target}"


def test_ci_setup_has_a_demo_subset_and_ci_run_is_the_readme_test_command():
    setup = (REPO / ".ci/setup").read_text()
    assert "iptables" in setup and "--demo" in setup
    assert (REPO / ".ci/run").read_text().strip().endswith(
        "bash .ci/setup && .venv/bin/python -m pytest -q")
    readme = (REPO / "README.md").read_text()
    assert "bash .ci/setup --demo && .venv/bin/mlfs demo" in readme
    assert "bash .ci/setup && .venv/bin/python -m pytest -q" in readme
    for heading in ("## Install", "## A first look"):
        assert heading in readme
    wrong = subprocess.run(["bash", str(REPO / ".ci/setup"), "--bogus"], capture_output=True,
                           text=True, timeout=30)
    assert wrong.returncode == 2 and "usage" in wrong.stderr  # before installing anything
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", "-S", "warning", str(REPO / ".ci/setup"),
                               str(REPO / "tools/gen-cli-docs")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout


def test_every_pin_of_the_constraints_file_is_inside_pyprojects_ranges():
    """What CI tests (constraints.txt) is what the package allows (pyproject's ranges),
    and every core dependency has an upper bound (the next major is untested)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for name, extra in project["optional-dependencies"].items():
        if name == "plots":  # not installed by .ci/setup, so not tested: no pin
            continue
        wanted += [Requirement(r) for r in extra if not r.startswith("mlfs[")]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    for requirement in wanted:
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"{requirement.name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pinned, prereleases=True), (requirement, pinned)
    for requirement in (Requirement(r) for r in project["dependencies"]):
        assert any(s.operator == "<" for s in requirement.specifier), requirement
