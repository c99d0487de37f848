"""A bench run names the code it measured, even when run from a second checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ASK = "from tests.bench.provenance import measured_commit; print(measured_commit())"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@pytest.fixture
def second_checkout(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the project's git checkout")
    where = tmp_path / "wt"
    git("worktree", "add", "--detach", str(where), "HEAD")
    try:
        yield where
    finally:
        git("worktree", "remove", "--force", str(where))


def measured_from(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ASK], cwd=where, capture_output=True,
                          text=True, timeout=60)


def test_a_run_from_a_second_checkout_that_imports_the_first_ones_trainer_is_marked_mixed(
        second_checkout):
    """The editable install maps mlfs.trainers and mlfs.backends to the first checkout:
    a run from the second measured its core with the first one's trainer, under the
    second one's commit.  It now says so: "+mixed", and the parts, on stderr."""
    import mlfs.trainers
    if REPO not in Path(mlfs.trainers.__path__[0]).resolve().parents:
        pytest.skip("the package is not installed editable from this checkout")
    got = measured_from(second_checkout)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip().endswith("+mixed"), got.stdout
    assert "mlfs.trainers from" in got.stderr and str(REPO / "trainers") in got.stderr


def test_with_its_own_trainer_and_backends_linked_in_it_measures_one_commit(second_checkout):
    (second_checkout / "mlfs" / "trainers").symlink_to("../trainers")
    (second_checkout / "mlfs" / "backends").symlink_to("../backends")
    got = measured_from(second_checkout)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == git("rev-parse", "--short", "HEAD"), got.stdout
    assert "provenance" not in got.stderr
