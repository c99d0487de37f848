"""`mlfs report` without a mount: from a state directory after umount, and `demo --keep`."""

from __future__ import annotations

import json
import os
import re
import subprocess

from tests.harness import REPO, mlfs_command, new_model, read_rows, wait_for, write_errno


def run_mlfs(*args: str, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command(*args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


#: what `bash .ci/setup --demo` does not install (the test and plots extras)
NOT_IN_THE_DEMO_SETUP = ("duckdb", "polars", "pandas", "hypothesis", "prometheus_client",
                         "matplotlib", "shtab", "build_manpages", "pytest")

SITECUSTOMIZE = f"""
import sys
BLOCKED = {NOT_IN_THE_DEMO_SETUP!r}
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed by .ci/setup --demo")
        return None
sys.meta_path.insert(0, _Blocker())
"""


def demo_setup_env(tmp_path) -> dict:
    """This interpreter as `.ci/setup --demo` leaves it: without the extras (children too)."""
    site = tmp_path / "demo-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": f"{site}:{REPO}"}


def points(page: str) -> int:
    objective = re.search(r'<svg class="chart objective-chart"[^>]*>.*?</svg>', page, re.S)
    assert objective, "the objective chart"
    return objective.group(0).count('<circle class="pt ')


def test_report_reads_the_state_directory_after_umount(mount, tmp_path):
    model = new_model(mount.sub, "offline")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    wait_for(lambda: any(r["model"] == "offline" for r in read_rows(mount.sub / "dataset")),
             what="a sealed portion with the model's rows")
    done = mount.umount()
    assert done.returncode == 0, done.stderr
    state = mount.state_dir
    info = json.loads((state / "sim.readahead" / "info.json").read_text())
    assert info["objective"] == {"name": "throughput", "unit": "MB/s", "goal": "max"}
    rows = read_rows(state / "sim.readahead" / "dataset")
    out = tmp_path / "offline.html"
    done = run_mlfs("report", str(state), "sim.readahead", "--model", "offline", "--all",
                    "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert points(page) == len(rows) > 0
    assert "throughput" in page and 'class="pt ml"' in page
    assert f"{len(rows)} of {len(rows)} rows" in done.stdout


def test_report_refuses_a_directory_that_is_neither_a_mount_nor_a_state(tmp_path):
    done = run_mlfs("report", str(tmp_path), "sim.readahead", "--out", str(tmp_path / "x.html"))
    assert done.returncode == 1
    assert "neither an mlfs mount" in done.stderr and not (tmp_path / "x.html").exists()


def test_demo_keep_leaves_a_state_directory_that_report_reads(mount_root, tmp_path):
    """The demo runs with only the demo's set-up installed, and --keep keeps its run."""
    kept = tmp_path / "run"
    env = demo_setup_env(tmp_path)
    blocked = run_mlfs("report", "--help", env=env)
    assert blocked.returncode == 0
    probe = subprocess.run([mlfs_command()[0], "-c", "import duckdb"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert "not installed by .ci/setup --demo" in probe.stderr, "the blocker works"
    done = run_mlfs("demo", "--seconds", "4", "--keep", str(kept), timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"mlfs report {kept} sim.readahead" in done.stdout
    assert list((kept / "sim.readahead" / "dataset").glob("*.parquet"))
    assert not (kept / "mlfs.pid").exists(), "the demo's daemon ended"
    out = tmp_path / "demo.html"
    report = run_mlfs("report", str(kept), "sim.readahead", "--all", "--out", str(out))
    assert report.returncode == 0, report.stderr
    assert points(out.read_text()) == len(read_rows(kept / "sim.readahead" / "dataset"))
    again = run_mlfs("demo", "--seconds", "1", "--keep", str(kept))
    assert again.returncode == 2 and "not empty" in again.stderr
