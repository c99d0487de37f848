"""An unprivileged user may read everything and steer nothing (allow_other + modes)."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from tests.harness import sh, wait_for

NOBODY = "setpriv --reuid=nobody --regid=nogroup --clear-groups"


@pytest.fixture(autouse=True)
def _need_setpriv():
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as nobody")


def as_nobody(script: str):
    return sh(f"{NOBODY} bash -c {_quote(script)}")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_nobody_reads_info_knobs_metrics_and_dataset_portions(shared_mount, shared_models):
    sub = shared_mount.sub
    model = shared_models("readable")
    portion = wait_for(lambda: sorted((sub / "dataset").glob("*.parquet")), what="portion")[0]
    scratch = shared_mount.root / "nobody-scratch"  # under a 0755 /tmp directory
    scratch.mkdir(mode=0o777, exist_ok=True)
    scratch.chmod(0o777)
    out = scratch / "copy.parquet"
    done = as_nobody(f"id -u && cat {sub}/info {sub}/knobs/read_ahead_kb "
                     f"{shared_mount.mountpoint}/version {model}/state {model}/mode "
                     f"{model}/errors >/dev/null && cat {shared_mount.mountpoint}/metrics "
                     f"| grep -q mlfs_ticks_total && ls {sub}/models && "
                     f"cp {portion} {out} && head -n1 {sub}/events")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] != "0"
    assert "readable" in done.stdout
    assert pq.read_table(out).num_rows > 0
    assert out.stat().st_uid != 0, "copied by nobody"


@pytest.mark.parametrize("action", [
    "mkdir {sub}/models/intruder",
    "rmdir {model}",
    "echo stop > {model}/control",
    "echo read_ahead_kb=8 > {model}/recommend",
    "echo emergency > {model}/mode",
    "echo read_ahead_kb > {model}/knobs",
    "echo prepare_dataset > {sub}/control",
    "echo discard_dataset > {sub}/control",
    "echo 1.0 > {sub}/objective",
    ": > {model}/policy",
])
def test_nobody_cannot_steer(shared_mount, shared_models, action):
    sub = shared_mount.sub
    model = shared_models("guarded")
    before = {name: (model / name).read_text() for name in ("state", "mode", "knobs")}
    portions = sorted(p.name for p in (sub / "dataset").glob("*.parquet"))
    done = as_nobody(action.format(sub=sub, model=model))
    assert done.returncode != 0
    assert "Permission denied" in done.stderr, done.stderr
    assert {name: (model / name).read_text() for name in before} == before
    assert sorted(p.name for p in (sub / "models").iterdir()) == ["guarded"]
    now = sorted(p.name for p in (sub / "dataset").glob("*.parquet"))
    assert set(portions[1:]) <= set(now), "nothing discarded"
    assert (model / "errors").read_text() == "", "refused by the kernel, not the daemon"
