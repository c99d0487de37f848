"""One conformance suite for every registered backend (as S3QL runs one suite per store).

Parametrized over the registry itself (`mlfs.backends.registered()`): a backend
registered in the entry-point group `mlfs.backends` -- built in, or a plugin
installed beside mlfs -- is picked up with no edit here.  Each backend builds one
small instance from its `Backend.example(env)`: the environment offers a loop
device over a sparse file on a small tmpfs (what a real-knob backend tunes and
traces instead of a real disk) and a scratch directory; a backend that cannot
build here says why (`ExampleUnavailable`) and its tests are skipped with that
reason.  A plug-in author runs

    .venv/bin/python -m pytest -p no:cacheprovider -n 0 \
        tests/mount/test_backend_conformance.py -k NAME

and knows the backend is done when it passes: settings refused with one line
naming the key (and `mlfs config check` exiting 2 on one line), `step` returning
the declared features and records, `close` putting back every knob written,
and a SIGKILLed daemon's changes put back through the ledger by the next mount.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from mlfs.backends.linux.knobs import read_value

from mlfs import backends
from mlfs.abi import (
    NAME,
    Backend,
    ConformanceEnv,
    ExampleUnavailable,
    Knob,
    SettingError,
    Subsystem,
    candidate_values,
)
from tests.harness import FAST_MOUNT, REPO, Mount, mlfs_command, sh, tmpfs, wait_for

#: every registered backend, read at collection: a new one needs no edit here
REGISTERED = sorted(backends.registered()[0])
#: a setting name no backend has
UNKNOWN_KEY = "no_such_setting_conformance"

#: pyarrow's type for each declared record type (`mlfs.abi.RECORD_TYPES`)
ARROW_TYPES = {"int64": pa.int64(), "uint64": pa.uint64(), "int32": pa.int32(),
               "uint32": pa.uint32(), "uint16": pa.uint16(), "uint8": pa.uint8(),
               "float64": pa.float64(), "bool": pa.bool_()}


# ---- the environment: a loop device over a sparse file on a small tmpfs ---------------------
@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConformanceEnv]:
    scratch = tmp_path_factory.mktemp("conformance")
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        yield ConformanceEnv(device=None, scratch=scratch)
        return
    with tmpfs(scratch / "disk", "80M") as disk:
        image = disk / "disk.img"
        with open(image, "wb") as fh:
            fh.truncate(64 << 20)
        done = subprocess.run(["losetup", "--find", "--show", str(image)],
                              capture_output=True, text=True)
        device = done.stdout.strip() if done.returncode == 0 else None
        try:
            yield ConformanceEnv(device=Path(device).name if device else None, scratch=scratch)
        finally:
            if device:
                subprocess.run(["losetup", "-d", device], capture_output=True)


def registered_backend(name: str) -> Backend:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # a built-in is never old-style
        return backends.registered()[0][name].load()


def example(name: str, env: ConformanceEnv) -> dict:
    """The backend's small instance here, or the test skipped with its reason."""
    backend = registered_backend(name)
    if backend.example is None:
        return {}
    try:
        return dict(backend.example(env))
    except ExampleUnavailable as exc:
        pytest.skip(f"{name}: {exc}")


@contextlib.contextmanager
def built(name: str, env: ConformanceEnv, state: Path) -> Iterator[list[Subsystem]]:
    """The example's subsystems with `state` as their state directory, closed after."""
    state.mkdir(exist_ok=True)
    subsystems = backends.create_subsystems([{"backend": name, **example(name, env)}],
                                            state_dir=state)
    try:
        yield subsystems
    finally:
        for subsystem in subsystems:
            subsystem.close()


def ledger(state: Path) -> list[dict]:
    directory = state / "ledger"
    if not directory.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def off_default(knob: Knob) -> object:
    """A value of `knob` other than its default: the grid's neighbour of the default (the
    default itself for a knob held at one value, as one outside `apply` is)."""
    grid = candidate_values(knob)
    others = [v for v in grid if v != knob.default]
    if not others:
        return knob.default
    if knob.type == "choice":
        return others[0]
    above = [v for v in others if v > knob.default]
    return above[0] if above else others[-1]


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {value!r}")


def subsystem_table(name: str, settings: dict) -> str:
    lines = ["[[subsystem]]", f"backend = {json.dumps(name)}"]
    lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


# ---- the typed object ------------------------------------------------------------------------
@pytest.mark.parametrize("name", REGISTERED)
def test_the_module_exports_a_backend_named_as_it_registers(name, env):
    backend = registered_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert backend.description and "\n" not in backend.description
    if backend.settings_for_name is not None:  # only names of its own
        assert backend.settings_for_name(name + ".no/such") is None
    _, names = backend.check(example(name, env))
    assert names and all(NAME.fullmatch(n) for n in names), names


# ---- settings refused with one line naming the key -----------------------------------------
@pytest.mark.parametrize("name", REGISTERED)
def test_an_unknown_setting_is_refused_with_one_line_naming_it(name, env):
    settings = {**example(name, env), UNKNOWN_KEY: 1}
    with pytest.raises(SettingError) as refused:
        backends.check_entry({"backend": name, **settings})
    assert refused.value.key == UNKNOWN_KEY
    assert UNKNOWN_KEY in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("name", REGISTERED)
def test_a_malformed_value_of_every_setting_is_refused_naming_its_key(name, env):
    settings = example(name, env)
    for key in registered_backend(name).settings:
        # NaN passes no check: not a number in range, a word, a string, a table, a list
        with pytest.raises(SettingError) as refused:
            backends.check_entry({"backend": name, **settings, key: math.nan})
        assert refused.value.key.split(".")[0] == key, (key, str(refused.value))
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", REGISTERED)
def test_mlfs_config_check_exits_2_with_one_line_for_a_bad_table(name, env, tmp_path):
    settings = example(name, env)
    good = tmp_path / "good.toml"
    good.write_text(FAST_MOUNT + subsystem_table(name, settings))
    done = subprocess.run(mlfs_command("config", "check", str(good)), capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(FAST_MOUNT + subsystem_table(name, {**settings, UNKNOWN_KEY: 1}))
    done = subprocess.run(mlfs_command("config", "check", str(bad)), capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and UNKNOWN_KEY in done.stderr, done.stderr


# ---- step returns what the subsystem declares ------------------------------------------------
def assert_records_as_declared(declared: dict[str, str], records: object) -> None:
    if isinstance(records, np.ndarray):
        assert set(records.dtype.names or ()) == set(declared)
        return
    assert isinstance(records, pa.RecordBatch | pa.Table), type(records)
    schema = records.schema
    assert set(schema.names) == set(declared), (schema.names, sorted(declared))
    for field, kind in declared.items():
        arrow = schema.field(field).type
        if kind == "string":
            assert pa.types.is_string(arrow) or pa.types.is_large_string(arrow) \
                or pa.types.is_dictionary(arrow), (field, arrow)
        elif kind == "timestamp":
            assert pa.types.is_timestamp(arrow), (field, arrow)
        else:
            assert arrow == ARROW_TYPES[kind], (field, kind, arrow)


@pytest.mark.parametrize("name", REGISTERED)
def test_step_returns_the_declared_features_and_records(name, env, tmp_path):
    with built(name, env, tmp_path / "state") as subsystems:
        assert subsystems, f"{name}'s example built no subsystem"
        for subsystem in subsystems:
            last = None
            for _ in range(3):
                last = subsystem.step(subsystem.default_knobs(last))
                assert set(last.features) == set(subsystem.features)
                for feature, value in last.features.items():
                    assert isinstance(value, int | float) and not isinstance(value, bool), \
                        (feature, value)
                assert isinstance(last.objective, int | float)
                if last.records is not None:
                    assert subsystem.records, "records from a subsystem that declares none"
                    assert_records_as_declared(subsystem.records, last.records)


# ---- close restores every knob it changed ----------------------------------------------------
@pytest.mark.parametrize("name", REGISTERED)
def test_close_restores_every_knob_it_changed(name, env, tmp_path):
    state = tmp_path / "state"
    with built(name, env, state) as subsystems:
        if not any(s.knobs for s in subsystems):
            pytest.skip(f"{name} declares no knobs")
        for subsystem in subsystems:
            knobs = {k: off_default(knob) for k, knob in subsystem.knobs.items()}
            for _ in range(2):
                subsystem.step(knobs)
        written = ledger(state)
        if registered_backend(name).uses_state_dir:
            assert written, "knobs set off their default, but no original was recorded"
    for entry in written:
        assert read_value(entry["path"], entry.get("format", "plain")) == entry["original"], \
            entry
    assert ledger(state) == []


# ---- a crash is repaired through the ledger by the next mount -------------------------------
@pytest.mark.parametrize("name", REGISTERED)
def test_a_sigkilled_daemons_knobs_are_put_back_by_the_next_mount(name, env, mount_root):
    backend = registered_backend(name)
    settings = example(name, env)
    if not backend.uses_state_dir:
        pytest.skip(f"{name} keeps no ledger (it writes no kernel setting)")
    config = FAST_MOUNT + subsystem_table(name, settings)
    sub = backends.check_entry({"backend": name, **settings})[0]
    m = Mount(mount_root, config)
    m.start()
    try:
        info = json.loads((m.mountpoint / sub / "info").read_text())
        changeable = {}
        for knob_name, spec in info["knobs"].items():
            value = off_default(Knob.from_info(knob_name, spec))
            if value != spec["default"]:
                changeable[knob_name] = value
        if not changeable:
            pytest.skip(f"{name}'s example has no knob a model may change")
        knob_name, value = next(iter(changeable.items()))
        model = m.mountpoint / sub / "models" / "conformance"
        done = sh(f"mkdir {model} && echo start > {model}/control && "
                  f"echo recommendation > {model}/mode && "
                  f"echo {knob_name}={value} > {model}/recommend")
        assert done.returncode == 0, done.stderr
        def changed() -> bool:  # the ledger records the original before the write: wait
            return any(read_value(e["path"], e.get("format", "plain")) != e["original"]
                       for e in ledger(m.state_dir))  # for the write itself

        wait_for(changed, what=f"{knob_name}={value} written past its ledger entry")
        m.kill()  # SIGKILL: close never runs
        crashed = ledger(m.state_dir)
        assert crashed
        assert any(read_value(e["path"], e.get("format", "plain")) != e["original"]
                   for e in crashed), "the crash left nothing to repair"
        # the model would pin its value again at once: the next mount runs without it,
        # so what puts the originals back can only be the ledger
        shutil.rmtree(m.state_dir / sub / "models" / "conformance")
        m.start()  # the same state directory
        for entry in crashed:
            assert read_value(entry["path"], entry.get("format", "plain")) == \
                entry["original"], entry
        owners = {json.dumps(e.get("owner"), sort_keys=True) for e in crashed}
        assert not [e for e in ledger(m.state_dir)
                    if json.dumps(e.get("owner"), sort_keys=True) in owners]
    finally:
        m.kill(signal.SIGTERM)


# ---- a plug-in is in the suite with no edit ----------------------------------------------------
def test_a_plugin_installed_beside_mlfs_is_run_by_this_suite_unedited(tmp_path):
    # the example plugin, installed by pip into a directory of its own and put on the path:
    # the suite, collected again in a fresh pytest, runs it like a built-in
    if os.environ.get("MLFS_CONFORMANCE_INNER"):
        pytest.skip("already the inner run")
    source, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(REPO / "tests" / "plugin" / "mlfs-backend-example", source)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(site), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "-rs",
         "-k", "example.cache", str(Path(__file__))],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(site), "MLFS_CONFORMANCE_INNER": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    counts = done.stdout.strip().splitlines()[-1]
    # every test but the crash test (it keeps no ledger: skipped, saying so)
    assert counts.startswith("6 passed, 1 skipped"), done.stdout[-2000:]
    assert "example.cache keeps no ledger" in done.stdout
