"""Third-party backends: a package installed with pip appears in `mlfs backends` and mounts.

The package is tests/plugin/mlfs-backend-example (its own pyproject.toml and
an entry point in the group `mlfs.backends`), installed with `pip install
--no-deps --target DIR` and put on PYTHONPATH: a separate installation beside
the mlfs under test, as `pip install` puts it into site-packages (~5 s, the
isolated build of a flit package).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mlfs.abi import ABI_VERSION
from tests.harness import FAST_CONFIG, REPO, Mount, mlfs_command, sh, wait_for, write_errno

EXAMPLE = REPO / "tests" / "plugin" / "mlfs-backend-example"

PLUGIN_CONFIG = FAST_CONFIG + """
[[subsystem]]
backend = "example.cache"
name = "cache.one"
seed = 3
tick_seconds = 0.02
"""


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """The example backend installed by pip into its own directory."""
    target = tmp_path_factory.mktemp("plugin-site")
    source = tmp_path_factory.mktemp("plugin-src") / "src"
    # build from a copy: a build backend may write into the source tree
    subprocess.run(["cp", "-r", str(EXAMPLE), str(source)], check=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "mlfs_backend_example" / "__init__.py").is_file()
    return target


def _backends(env_path: str) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command("backends", "--json"), capture_output=True, text=True,
                          timeout=60, cwd=REPO,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})


def test_an_installed_plugin_is_listed_with_its_package_settings_types_and_defaults(plugin_path):
    done = _backends(str(plugin_path))
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    by_name = {b["name"]: b for b in listing["backends"]}
    assert {"sim.readahead", "linux.vm", "linux.block", "example.cache"} <= set(by_name)
    example = by_name["example.cache"]
    assert example["package"] == "mlfs-backend-example"
    assert "drifting working set" in example["description"]
    settings = {s["name"]: s for s in example["settings"]}
    assert settings["seed"] == {"name": "seed", "type": "integer 0..2147483648", "default": 0}
    assert settings["tick_seconds"]["default"] == 0.05
    assert listing["problems"] == []
    # without the plugin on the path, it is not there
    assert "example.cache" not in _backends("").stdout


def test_a_plugin_that_fails_to_import_or_clashes_is_reported_and_never_a_crash(
        tmp_path, plugin_path):
    # an installed distribution whose entry point names a module that raises on import
    site = tmp_path / "site"
    dist = site / "mlfs_backend_broken-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mlfs-backend-broken\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text("[mlfs.backends]\nbroken.one = mlfs_broken\n"
                                           "linux.vm = mlfs_broken\n")
    (site / "mlfs_broken.py").write_text("raise RuntimeError('needs libfoo 2')\n")
    done = _backends(f"{site}:{plugin_path}")
    assert done.returncode == 0, done.stderr
    names = [b["name"] for b in json.loads(done.stdout)["backends"]]
    assert "example.cache" in names and "broken.one" not in names
    assert "mlfs-backend-broken" in done.stderr and "needs libfoo 2" in done.stderr
    assert "Traceback" not in done.stderr
    # a name clash keeps mlfs's own backend and says so
    vm = next(b for b in json.loads(done.stdout)["backends"] if b["name"] == "linux.vm")
    assert vm["package"] == "mlfs"
    assert "'linux.vm' of package mlfs-backend-broken ignored: mlfs registers it too" in (
        done.stderr)
    # a configuration naming it is refused in one line, before any daemon starts
    config = tmp_path / "broken.toml"
    config.write_text('[[subsystem]]\nbackend = "broken.one"\n')
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    refused = subprocess.run(
        mlfs_command("mount", str(mountpoint), "--config", str(config),
                     "--state-dir", str(tmp_path / "state")),
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert refused.returncode != 0
    assert "mlfs-backend-broken" in refused.stderr and "needs libfoo 2" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "state" / "mlfs.pid").exists()


def test_a_plugin_backend_mounts_and_serves_dataset_rows(mount_root, plugin_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(plugin_path))
    m = Mount(mount_root, PLUGIN_CONFIG)
    m.start()
    try:
        sub = m.mountpoint / "cache.one"
        info = json.loads((sub / "info").read_text())
        assert info["backend"] == "example.cache" and info["abi"] == ABI_VERSION
        assert info["knobs"]["size_kb"]["default"] == 256
        listed = (m.mountpoint / "backends").read_text().splitlines()
        assert any(line.startswith("example.cache simulated cache") for line in listed)
        assert (sub / "knobs" / "size_kb").read_text() == "256\n"
        assert write_errno(sub / "control", b"prepare_dataset\n") == 0
        portions = wait_for(lambda: sorted((sub / "dataset").glob("*.parquet")),
                            what="a sealed portion")
        table = pq.read_table(portions[0])
        assert table.num_rows > 0
        assert {"knob_size_kb", "working_set_kb", "hit_ratio", "objective"} <= set(
            table.column_names)
        assert set(table.column("knob_size_kb").to_pylist()) == {256}
    finally:
        m.kill(signal.SIGTERM)


def install_plugin(site: Path, backend: str, module: str, source: str) -> None:
    """A one-module plugin `module` registering `backend`, as pip would lay it out."""
    dist = site / f"mlfs_backend_{module}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlfs-backend-{module}\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[mlfs.backends]\n{backend} = {module}\n")
    (site / f"{module}.py").write_text(source)


BAD_COLUMNS = '''
from mlfs.abi import Objective, Sample, Subsystem

class Bad(Subsystem):
    name, backend, description, tick_seconds = "bad.one", "bad.columns", "bad", 0.05
    objective = Objective("x", "", "max")
    knobs = {}
    features = {"tick": "int64"}

    def step(self, knobs):
        return Sample(features={"tick": 1}, objective=0.0)

def check(settings):
    return settings, ["bad.one"]

def factory(settings):
    return [Bad()]
'''


def test_a_plugin_subsystem_the_core_cannot_serve_fails_the_mount_in_one_line(
        tmp_path, mount_root):
    site = tmp_path / "site"
    install_plugin(site, "bad.columns", "mlfs_bad", BAD_COLUMNS)
    config = tmp_path / "bad.toml"
    config.write_text('[[subsystem]]\nbackend = "bad.columns"\n')
    mountpoint = mount_root / "mnt"
    mountpoint.mkdir()
    state = mount_root / "state"
    done = subprocess.run(
        mlfs_command("mount", str(mountpoint), "--config", str(config), "--state-dir",
                     str(state)),
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "feature 'tick': column tick is taken by the core" in done.stderr
    assert "Traceback" not in (state / "mlfs.log").read_text()
    assert not os.path.ismount(mountpoint)


STUCK = '''
from mlfs.abi import Objective, Sample, Subsystem

class Stuck(Subsystem):
    name, backend, description, tick_seconds = "stuck.one", "stuck.probe", "stuck", 0.05
    objective = Objective("x", "", "max")
    knobs = {}
    features = {"x": "float64"}

    def step(self, knobs):
        return Sample(features={"x": 1.0}, objective=0.0)

def check(settings):
    return settings, ["stuck.one"]

def factory(settings):
    with open(settings["wait_for"]) as fifo:  # a device probe that never answers
        fifo.read()
    return [Stuck()]
'''


def test_a_load_stuck_in_its_backend_times_out_and_the_kill_switch_still_answers(
        tmp_path, mount_root, monkeypatch):
    """A backend's constructor that never returns must not hold MOUNT/control: the kernel
    serialises writes to one file, so `echo emergency` would wait behind the load."""
    site = tmp_path / "site"
    install_plugin(site, "stuck.probe", "mlfs_stuck", STUCK)
    fifo = tmp_path / "probe"
    os.mkfifo(fifo)
    monkeypatch.setenv("PYTHONPATH", str(site))
    mount = Mount(mount_root, FAST_CONFIG)
    mount.start()
    try:
        model = mount.sub / "models" / "m"
        assert sh(f"mkdir {model} && echo start > {model}/control").returncode == 0
        stuck = subprocess.Popen(["bash", "-c", f"echo 'load stuck.probe wait_for={fifo}' > "
                                  + shlex.quote(str(mount.mountpoint / "control"))],
                                 stderr=subprocess.PIPE, text=True)
        wait_for(lambda: "mlfs_loads_waiting 1" in (mount.mountpoint / "metrics").read_text(),
                 what="the load waiting in its backend")
        # the kernel serialises writes to one file: the switch waits for the load's
        # own time-out (2 s), never for the backend, which is still stuck below
        assert write_errno(mount.mountpoint / "control", b"emergency") == 0
        assert stuck.wait(timeout=30) != 0
        assert "Connection timed out" in stuck.stderr.read()
        assert (model / "mode").read_text() == "emergency\n"
        assert not (mount.mountpoint / "stuck.one").exists()
        assert "did not answer within 2 s" in (mount.mountpoint / "errors").read_text()
        metrics = (mount.mountpoint / "metrics").read_text()
        assert "mlfs_loads_abandoned_total 1" in metrics and "mlfs_loads_stuck 1" in metrics
        # the probe answers after all: what it built is closed, never served
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        wait_for(lambda: "mlfs_loads_stuck 0" in (mount.mountpoint / "metrics").read_text(),
                 what="the abandoned load ended")
        assert not (mount.mountpoint / "stuck.one").exists()
        assert write_errno(mount.mountpoint / "control", b"auto") == 0
    finally:
        mount.kill(signal.SIGTERM)
