"""One suite for every kind of model, on real mounts (as S3QL runs one suite over every
backend): lifecycle, modes, feedback, refusal of bad input.

It is parametrized over `mlfs.core.models.kinds.KINDS`: a kind added to the registry
is checked here with no edit of this file, from its entry alone (`ModelKind.files`,
and `ModelKind.conformance`: a subsystem that it serves, a valid and an invalid input
for `recommend`).  A kind's author runs

    pytest -p no:cacheprovider tests/mount/test_kind_conformance.py

and is done when it passes.  Each kind gets one mount (module scope); each test makes
its own models.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from mlfs.core.models.kinds import KINDS, ModelKind
from mlfs.fs.operations import MAX_BUFFERED_WRITE
from tests.harness import (
    FAST_MOUNT,
    Mount,
    mlfs_command,
    new_mount_root,
    read_rows,
    sh,
    wait_for,
    write_errno,
)

#: the files every model directory has, whatever its kind
#: every kind's files; `incumbent` and `efficiency_vs_incumbent` too, since every kind
#: is judged against the simplest thing that works besides the default (docs/ABI.md)
SHARED_FILES = {"control", "state", "kind", "mode", "mode_switching", "recommend", "policy",
                "efficiency", "efficiency_vs_incumbent", "incumbent", "errors",
                "recommendations", "feedback"}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind_mount(request):
    """(the kind's entry, a mount serving its conformance subsystem)."""
    kind = KINDS[request.param]
    root = new_mount_root()
    mount = Mount(root, FAST_MOUNT + kind.conformance.subsystem_config)
    mount.start()
    try:
        yield kind, mount
    finally:
        mount.kill(signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kind_mount_clean(kind_mount):
    """The kind's mount; the models a test made are removed after it (a started knob
    model owns its knobs: the next test's could not start)."""
    yield kind_mount
    kind, mount = kind_mount
    for model in (subsystem(kind, mount) / "models").iterdir():
        sh(f"rmdir {model}")


def subsystem(kind: ModelKind, mount: Mount) -> Path:
    return mount.mountpoint / kind.conformance.subsystem


def make_model(kind: ModelKind, mount: Mount, name: str, start: bool = False) -> Path:
    """mkdir a model and make it `kind` (a plain mkdir makes the subsystem's first)."""
    model = subsystem(kind, mount) / "models" / name
    model.mkdir()
    if (model / "kind").read_text() != kind.name + "\n":
        assert write_errno(model / "kind", kind.name.encode() + b"\n") == 0, errors(model)
    assert (model / "kind").read_text() == kind.name + "\n"
    if start:
        assert write_errno(model / "control", b"start\n") == 0, errors(model)
    return model


def errors(model: Path) -> list[str]:
    return (model / "errors").read_text().splitlines()


def refused(model: Path, file: str, data: bytes) -> tuple[int, list[str]]:
    """Write `data` into `file`: (the errno, the `errors` lines it added)."""
    before = len(errors(model))
    code = write_errno(model / file, data)
    return code, errors(model)[before:]


def test_the_subsystem_lists_the_kind_in_info(kind_mount_clean):
    kind, mount = kind_mount_clean
    info = json.loads((subsystem(kind, mount) / "info").read_text())
    assert kind.name in info["kinds"]


def test_lifecycle_mkdir_start_stop_rmdir(kind_mount_clean):
    kind, mount = kind_mount_clean
    model = make_model(kind, mount, "life")
    assert (model / "state").read_text() == "initialized\n"
    assert {p.name for p in model.iterdir()} == SHARED_FILES | {f.name for f in kind.files}
    assert write_errno(model / "control", b"start\n") == 0
    assert (model / "state").read_text() in ("started\n", "running\n")
    assert write_errno(model / "control", b"start\n") == 0  # started already: nothing to do
    assert write_errno(model / "control", b"stop\n") == 0
    assert (model / "state").read_text() == "stopped\n"
    assert write_errno(model / "control", b"start\n") == 0
    assert sh(f"rmdir {model}").returncode == 0
    assert not model.exists()
    again = make_model(kind, mount, "life")  # a new model under the old name
    assert (again / "state").read_text() == "initialized\n"
    assert errors(again) == []
    assert sh(f"rmdir {again}").returncode == 0


def test_a_started_model_keeps_its_kind(kind_mount_clean):
    kind, mount = kind_mount_clean
    model = make_model(kind, mount, "kept", start=True)
    served = json.loads((subsystem(kind, mount) / "info").read_text())["kinds"]
    for other in [k for k in served if k != kind.name]:
        code, lines = refused(model, "kind", other.encode() + b"\n")
        assert code == errno.EBUSY and "kind" in lines[-1]
    code, lines = refused(model, "kind", b"no-such-kind\n")
    assert code == errno.EINVAL and "no-such-kind" in lines[-1]
    assert (model / "kind").read_text() == kind.name + "\n"
    assert (model / "state").read_text() in ("started\n", "running\n")


def test_modes_pin_release_and_refuse(kind_mount_clean):
    kind, mount = kind_mount_clean
    model = make_model(kind, mount, "modes", start=True)
    assert (model / "mode").read_text() == "learning\n"
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert (model / "mode").read_text() == "collaboration\n"
    assert (model / "mode_switching").read_text() == "pinned\n"
    code, lines = refused(model, "mode", b"sideways\n")
    assert code == errno.EINVAL and "mode" in lines[-1] and "sideways" in lines[-1]
    assert (model / "mode").read_text() == "collaboration\n"  # a refusal changes nothing
    # pinned to emergency, the mode machine refuses every input
    assert write_errno(model / "mode", b"emergency\n") == 0
    code, lines = refused(model, "recommend", kind.conformance.valid_input)
    assert code == errno.EBUSY and "recommend" in lines[-1] and "emergency" in lines[-1]
    assert write_errno(model / "mode", b"auto\n") == 0
    assert (model / "mode_switching").read_text() == "auto\n"


def test_a_valid_input_is_fed_back(kind_mount_clean):
    kind, mount = kind_mount_clean
    model = make_model(kind, mount, "fed", start=True)
    assert write_errno(model / "recommend", kind.conformance.valid_input) == 0, errors(model)
    assert errors(model) == []
    wait_for(lambda: list((model / "feedback").glob("*.parquet")),
             what=f"a {kind.name} model's feedback portion")
    rows = read_rows(model / "feedback")
    assert rows and {row["model"] for row in rows} == {"fed"}
    wait_for(lambda: list((model / "recommendations").glob("*.parquet")),
             what="the journal's portion")
    journal = read_rows(model / "recommendations")
    assert any(row["status"] == "accepted" for row in journal)


def test_bad_input_is_refused_with_its_errno_and_a_line(kind_mount_clean):
    kind, mount = kind_mount_clean
    model = make_model(kind, mount, "bad")
    # not started: no input is taken
    code, lines = refused(model, "recommend", kind.conformance.valid_input)
    assert code == errno.EINVAL and "not started" in lines[-1]
    assert write_errno(model / "control", b"start\n") == 0
    code, lines = refused(model, "recommend", kind.conformance.invalid_input)
    assert code == errno.EINVAL and lines[-1].split()[1] == "recommend"
    code, lines = refused(model, "control", b"explode\n")
    assert code == errno.EINVAL and "explode" in lines[-1]
    # a policy that is no model, and one past the upload bound: refused, none installed
    code, lines = refused(model, "policy", b"tree\nnot a model at all\n")
    assert code == errno.EINVAL and "policy" in lines[-1]
    before = len(errors(model))
    fd = os.open(model / "policy", os.O_WRONLY)
    try:
        chunk = b"x" * (1 << 20)
        with pytest.raises(OSError) as raised:
            for _ in range(MAX_BUFFERED_WRITE // len(chunk) + 1):
                os.write(fd, chunk)
        assert raised.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    lines = errors(model)[before:]
    assert lines and "policy" in lines[0] and "over" in lines[0]
    assert (model / "policy").read_bytes() == b""
    assert (model / "state").read_text() in ("started\n", "running\n")


def test_mlfs_train_refuses_a_kind_with_no_trainer_or_not_served(kind_mount_clean):
    kind, mount = kind_mount_clean
    sub = kind.conformance.subsystem
    others = [name for name in KINDS if name != kind.name]
    info = json.loads((subsystem(kind, mount) / "info").read_text())
    for wanted, reason in [("no-such-kind", "has no trainer"),
                           *[(o, "not " + o) for o in others if o not in info["kinds"]]]:
        done = subprocess.run(mlfs_command("train", str(mount.mountpoint), sub, "--kind",
                                           wanted, "--max-seconds", "30", "--wait", "5"),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and reason in done.stderr, done.stderr
        assert not (subsystem(kind, mount) / "models" / "lgbm").exists()  # nothing made
