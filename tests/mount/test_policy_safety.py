"""A policy is untrusted: on a real mount nothing in one may crash or wedge the daemon.

Before the verifier, a 3-node text with `split_feature=... 100000000` passed
the check process (it only predicted on zeros) and segfaulted lib_lightgbm in
the daemon; one with `right_child=1 0` (a cycle) spun forever on the trio
thread and wedged every file operation; a truncated saved policy.txt aborted
LightGBM at every mount.  Here each is refused with EINVAL and a reason in
`errors`, the daemon keeps answering (`version` is read with a watchdog after
each upload), a bad saved policy.txt or model.json is set aside at mount time,
and fuzzed policy texts never get further than a refusal.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import Mount, new_model, wait_for

COLUMNS = ["sequential_ratio", "mem_pressure", "knob_read_ahead_kb"]
WATCHDOG_SECONDS = 5.0


def real_policy(rounds: int = 4) -> str:
    """A small valid policy on the simulated subsystem's columns."""
    rng = np.random.default_rng(0)
    x = rng.random((300, 3)) * [1, 1, 4096]
    data = lgb.Dataset(x, label=x[:, 0] + x[:, 2] / 4096, feature_name=COLUMNS,
                       params={"verbose": -1})
    return lgb.train({"verbose": -1, "num_leaves": 4, "min_data_in_leaf": 5}, data,
                     num_boost_round=rounds).model_to_string()


def three_node(split_feature: str, right_child: str) -> bytes:
    """The issue's attack shape: one tree, two splits, three leaves."""
    return ("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n"
            "max_feature_idx=2\nobjective=regression\nfeature_names=" + " ".join(COLUMNS) +
            "\nfeature_infos=none none none\n\nTree=0\nnum_leaves=3\nnum_cat=0\n"
            f"split_feature={split_feature}\nthreshold=0.5 0.5\ndecision_type=2 2\n"
            f"left_child=-1 -2\nright_child={right_child}\nleaf_value=1 2 3\nshrinkage=1\n\n\n"
            "end of trees\n").encode()


def upload(path, data: bytes) -> int:
    """What a trainer does: open, write, close (the policy is committed at close).

    0 or the errno of the write or the close.
    """
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    except OSError as exc:
        os.close(fd)
        return exc.errno
    try:
        os.close(fd)
    except OSError as exc:
        return exc.errno
    return 0


def version_answers(mount: Mount, timeout: float = WATCHDOG_SECONDS) -> bool:
    """Read `version` in a thread; False if it does not answer within `timeout`."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(
        (mount.mountpoint / "version").read_text()), daemon=True)
    reader.start()
    reader.join(timeout)
    return bool(got) and got[0].strip() != ""


def assert_serving(mount: Mount) -> None:
    assert mount.alive(), "the daemon died"
    assert version_answers(mount), f"`version` did not answer within {WATCHDOG_SECONDS} s"


def error_lines(model) -> list[str]:
    return (model / "errors").read_text().splitlines()


# ---- attack 1: crafted and truncated policies ---------------------------------------

def test_crafted_and_truncated_policies_are_refused_and_the_daemon_keeps_serving(
        shared_mount, shared_models):
    model = shared_models("crafted")
    valid = real_policy().encode()
    attacks = [
        (three_node("0 100000000", "1 -3"),
         "tree 0: split_feature[1]=100000000 is not below the 3 declared features"),
        (three_node("0 1", "1 0"), "tree 0: right_child[1]=0 makes a cycle"),
        (valid[: len(valid) // 2], "policy does not end with a newline (truncated?)"),
        (valid[: valid.index(b"end of trees")], "no 'end of trees' line"),
    ]
    for number, (text, reason) in enumerate(attacks, start=1):
        assert upload(model / "policy", text) == errno.EINVAL, reason
        assert_serving(shared_mount)
        lines = error_lines(model)
        assert len(lines) == number and " policy " in lines[-1] and reason in lines[-1]
        assert (model / "policy").read_bytes() == b""
    log = (shared_mount.state_dir / "mlfs.log").read_text()
    assert "policy refused (tree 0: right_child[1]=0 makes a cycle)" in log
    # the honest 3-node shape and a real policy still load
    assert upload(model / "policy", three_node("0 1", "1 -3")) == 0
    assert upload(model / "policy", valid) == 0
    assert (model / "policy").read_bytes() == valid
    assert_serving(shared_mount)


def test_saved_state_is_fsynced_before_it_replaces_the_old(shared_mount, shared_models,
                                                           tmp_path):
    """policy.txt and model.json: a temporary file of an unpredictable name (`.NAME.<hex>.tmp`,
    made O_EXCL|O_NOFOLLOW) fsynced, renamed over the file relative to the directory's
    descriptor, the directory fsynced."""
    if shutil.which("strace") is None:
        pytest.skip("strace is missing")
    model = shared_models("durable")
    trace = tmp_path / "trace"
    tracer = subprocess.Popen(["strace", "-f", "-y", "-qq", "-o", str(trace), "-e",
                               "trace=fsync,fdatasync,rename,renameat,renameat2",
                               "-p", str(shared_mount.pid)], stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # attach to every thread
        assert upload(model / "policy", real_policy().encode()) == 0
        assert upload(model / "mode", b"collaboration\n") == 0
        time.sleep(0.2)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    calls = [re.sub(r"^\d+\s+", "", line) for line in trace.read_text().splitlines()]
    directory = str(shared_mount.state_dir / "sim.readahead" / "models" / "durable")
    for name in ("policy.txt", "model.json"):
        tmp = re.compile(rf"{re.escape(directory)}/\.{re.escape(name)}\.[0-9a-f]+\.tmp>")
        synced = [i for i, c in enumerate(calls) if c.startswith("fsync(") and tmp.search(c)]
        renamed = [i for i, c in enumerate(calls) if c.startswith("rename")
                   and f'".{name}.' in c and f'"{name}"' in c and f"<{directory}>" in c]
        dir_synced = [i for i, c in enumerate(calls)
                      if c.startswith("fsync(") and f"<{directory}>" in c]
        assert synced and renamed, (name, calls[-20:])
        assert synced[0] < renamed[0] < max(dir_synced, default=-1), (name, calls[-20:])


# ---- attack 1 at start-up and attack 6: damaged state in the state directory -------

def test_a_bad_saved_policy_and_model_json_are_set_aside_and_the_mount_comes_up(mount_root):
    mount = Mount(mount_root).start()
    try:
        model = new_model(mount.sub, "m")
        assert upload(model / "policy", real_policy().encode()) == 0
        n = new_model(mount.sub, "n", start=False)
        assert upload(n / "mode", b"learning\n") == 0  # pinned, saved in model.json
        mount.umount()
        models = mount.state_dir / "sim.readahead" / "models"
        cycle = three_node("0 1", "1 0")
        (models / "m" / "policy.txt").write_bytes(cycle)
        (models / "n" / "model.json").write_text('{"knobs": 5, "pinned": null}')
        mount.start()
        assert_serving(mount)
        assert (model / "policy").read_bytes() == b""
        assert (models / "m" / "policy.txt.damaged").read_bytes() == cycle
        assert not (models / "m" / "policy.txt").exists()
        [line] = error_lines(model)
        assert "policy.txt tree 0: right_child[1]=0 makes a cycle (set aside as " in line
        assert (n / "mode_switching").read_text() == "auto\n"  # the defaults
        assert (models / "n" / "model.json.damaged").exists()
        [line] = error_lines(n)
        assert "model.json knobs is not a list of knob names" in line
        log = (mount.state_dir / "mlfs.log").read_text()
        assert "policy.txt is damaged (sim.readahead/m: tree 0: right_child[1]=0" in log
        # a truncated policy.txt (what aborted LightGBM at every mount) likewise
        mount.umount()
        valid = real_policy().encode()
        (models / "m" / "policy.txt").write_bytes(valid[: len(valid) * 2 // 3])
        mount.start()
        assert_serving(mount)
        assert (models / "m" / "policy.txt.damaged.1").exists()
        assert "truncated" in error_lines(model)[-1]
    finally:
        mount.kill(signal.SIGTERM)


# ---- fuzzing ------------------------------------------------------------------------

FUZZ = settings(max_examples=24, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
BASE = real_policy(rounds=2)
BASE_LINES = BASE.split("\n")
TREE_LINES = [i for i, line in enumerate(BASE_LINES)
              if "=" in line and not line.startswith(("tree_sizes", "version", "[")) and
              BASE.index(line) < BASE.index("end of trees")]

number = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "3", "4", "-4", "-5", "100000000", "2147483647",
                     "-2147483648", "4294967296", "nan", "inf", "-inf", "1e308", "1e999",
                     "", "x", "1.5", "-0", "--1", "0.5 0.5"]),
    st.integers(-(1 << 40), 1 << 40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def fix_sizes(text: str) -> str:
    starts = [m.start() for m in re.finditer(r"^Tree=\d+$", text, re.M)]
    end = text.find("\nend of trees") + 1
    if not starts or end <= 0:
        return text
    sizes = [b - a for a, b in zip(starts, starts[1:] + [end], strict=True)]
    return re.sub(r"^tree_sizes=.*$", "tree_sizes=" + " ".join(map(str, sizes)), text,
                  count=1, flags=re.M)


@st.composite
def mutated_policy(draw) -> bytes:
    lines = list(BASE_LINES)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["token", "token", "token", "delete", "duplicate", "swap",
                                     "truncate", "bytes", "count"]))
        i = draw(st.sampled_from(TREE_LINES))
        if kind == "token":  # one value of one field
            key, _, value = lines[i].partition("=")
            tokens = value.split(" ") if value else [""]
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[j] = draw(number)
            lines[i] = f"{key}={' '.join(tokens)}"
        elif kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = draw(st.sampled_from(TREE_LINES))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "count":  # an array one value shorter or longer
            key, _, value = lines[i].partition("=")
            lines[i] = f"{key}={value} 1" if draw(st.booleans()) else (
                f"{key}={value.rpartition(' ')[0]}")
        elif kind == "bytes":
            lines[i] = lines[i] + draw(st.sampled_from(["\r", "\x00", "\xff", "=", "\t1"]))
    text = "\n".join(lines)
    if draw(st.booleans()):
        text = fix_sizes(text)  # let the deeper rules be the ones that fire
    if draw(st.integers(0, 5)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("latin-1")


def test_fuzzed_policy_texts_never_crash_or_wedge_the_daemon(shared_mount, shared_models):
    model = shared_models("fuzzed")
    started = time.monotonic()
    outcomes = {"accepted": 0, "refused": 0}

    @FUZZ
    @given(mutated_policy())
    def one(text: bytes) -> None:
        before = len(error_lines(model))
        result = upload(model / "policy", text)
        assert result in (0, errno.EINVAL), os.strerror(result)
        assert_serving(shared_mount)
        if result == 0:
            outcomes["accepted"] += 1
            assert (model / "policy").read_bytes() == text
            assert upload(model / "policy", b"") == 0
        else:
            outcomes["refused"] += 1
            lines = error_lines(model)
            assert len(lines) == min(before + 1, 100)
            reason = lines[-1].split(" policy ", 1)[1]
            assert len(reason.split(":", 1)[0]) > 3, lines[-1]  # a reason, not just the input
    one()
    assert outcomes["refused"] > 0
    assert_serving(shared_mount)
    print(f"fuzz: {outcomes} in {time.monotonic() - started:.1f} s")
    wait_for(shared_mount.alive, timeout=1, what="daemon alive")


# ---- red-team pass 2: a flush is not the end of an upload ---------------------------

def test_an_upload_whose_writer_runs_a_child_mid_way_is_installed_whole(
        shared_mount, shared_models):
    """A child's exec closes its O_CLOEXEC copy of the descriptor, which sends FLUSH:
    the half written so far was committed (refused as truncated) and the rest of the
    writes were dropped while every write and the close returned 0."""
    model = shared_models("forking-writer")
    valid = real_policy().encode()
    fd = os.open(model / "policy", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, valid[:4096])
        subprocess.run(["true"], check=True)  # fork + exec: a FLUSH of the half
        os.write(fd, valid[4096:])
    finally:
        os.close(fd)  # raises if the final commit is refused
    assert (model / "policy").read_bytes() == valid
    assert_serving(shared_mount)


def checking(daemon: int) -> bool:
    """Whether the daemon runs a policy check process (`python -m mlfs.core.models.policy`) now."""
    for task in Path(f"/proc/{daemon}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if b"mlfs.core.models.policy" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return True
            except OSError:
                continue  # ended meanwhile
    return False


def test_a_policy_checked_while_its_model_is_removed_never_reaches_the_successor(
        shared_mount, shared_models):
    """rmdir + mkdir of the same name during the seconds of the check: the upload used to
    return 0 and land in the new model's policy.txt, which it ran after a remount."""
    model = shared_models("replaced")
    valid = real_policy(rounds=40).encode()
    outcome: list[int] = []
    writer = threading.Thread(target=lambda: outcome.append(upload(model / "policy", valid)))
    writer.start()
    # the check (a child process importing LightGBM) takes seconds: remove the model
    # while it runs
    wait_for(lambda: checking(shared_mount.pid), what="the policy check process")
    os.rmdir(model)
    os.mkdir(model)
    writer.join(timeout=60)
    assert outcome in ([errno.ENODEV], [errno.ENOENT]), outcome
    assert (model / "policy").read_bytes() == b""
    saved = shared_mount.state_dir / shared_mount.sub.name / "models" / "replaced" / "policy.txt"
    assert not saved.exists()
    assert_serving(shared_mount)
