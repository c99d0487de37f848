"""The layering, checked: the import-linter contracts in pyproject.toml hold.

The contracts name modules as pip installs them (`mlfs.backends`, `mlfs.trainers`
inside the package), while a checkout keeps backends/ and trainers/ beside mlfs/.  The
mapping between the two is declared once, in pyproject.toml, so the layout checked here
is the one pip makes from it: the checkout installed (no dependencies, no build
isolation) into a temporary directory once per run, and lint-imports and the circle
check run there.  The same contracts then hold for the checkout and for an installed copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


@pytest.fixture(scope="module")
def installed_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout as `pip install` lays it out (site-packages style), in a temporary
    directory.  setuptools builds in a temporary build directory too (DIST_EXTRA_CONFIG),
    so a module deleted from the checkout cannot linger in a stale build/ and be checked."""
    root = tmp_path_factory.mktemp("installed")
    work = tmp_path_factory.mktemp("build")
    extra = work / "build.cfg"
    extra.write_text(f"[build]\nbuild_base = {work / 'build'}\n"
                     f"[egg_info]\negg_base = {work}\n")
    env = dict(os.environ, DIST_EXTRA_CONFIG=str(extra), PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-compile", "--no-index", "--target", str(root / "site"), str(REPO)],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "site"


def test_import_contracts_hold(installed_layout: Path) -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is missing (pip install -e '.[test]')")
    env = dict(os.environ, PYTHONPATH=str(installed_layout))
    done = subprocess.run([lint, "--no-cache", "--no-logo", "--config",
                           str(REPO / "pyproject.toml")],
                          cwd=installed_layout, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in done.stdout, done.stdout


def test_the_trainers_contract_forbids_every_module_but_client_and_shared_rules(
        installed_layout: Path) -> None:
    # the trainers' contract lists what is forbidden; a module added to mlfs later
    # must land on that list (or be allowed here, on purpose), not slip past it
    allowed = {"mlfs.abi", "mlfs.base", "mlfs.client", "mlfs.trainers", "mlfs.__init__"}
    package = installed_layout / "mlfs"
    modules = {f"mlfs.{p.stem}" for p in package.glob("*.py")}
    modules |= {f"mlfs.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    forbidden = set(contracts()["trainers"]["forbidden_modules"])
    assert modules - allowed - forbidden == set(), "add them to the trainers contract"
    assert forbidden <= modules | {"pyfuse3"}, "the contract names modules that do not exist"


def test_tests_outside_tests_mount_are_not_marked_mount(request: pytest.FixtureRequest) -> None:
    # tests/mount/conftest.py marks by path: -m "not mount" keeps the tests without FUSE
    assert request.node.get_closest_marker("mount") is None


#: finds every import circle (strongly connected set of two or more modules) with
#: grimp, import-linter's own graph builder; imports under `if TYPE_CHECKING:` count
#: (they tie the modules as much as a run-time import does)
_CIRCLES = """
import json, sys
import grimp
graph = grimp.build_graph("mlfs", exclude_type_checking_imports=False)
index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]
def visit(start):
    work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
    index[start] = low[start] = counter[0]; counter[0] += 1
    stack.append(start); on_stack.add(start)
    while work:
        node, children = work[-1]
        for child in children:
            if child not in index:
                index[child] = low[child] = counter[0]; counter[0] += 1
                stack.append(child); on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                break
            if child in on_stack:
                low[node] = min(low[node], index[child])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop(); on_stack.discard(member); group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
for module in sorted(graph.modules):
    if module not in index:
        visit(module)
print(json.dumps({"modules": len(graph.modules), "circles": circles}))
"""


def test_no_module_of_mlfs_backends_or_trainers_is_in_an_import_circle(
        installed_layout: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(installed_layout))
    done = subprocess.run([sys.executable, "-c", _CIRCLES], cwd=installed_layout, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["modules"] > 100, found  # the whole package was read, backends included
    assert found["circles"] == [], "import circles: " + "; ".join(
        " <-> ".join(circle) for circle in found["circles"])
