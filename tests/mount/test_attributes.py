"""The mount's layout, modes and text attributes, seen through real shell commands."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from mlfs.abi import ABI_VERSION
from tests.harness import sh, wait_for, write_errno

SUB_ENTRIES = ["control", "dataset", "events", "features", "info", "knobs", "models",
               "objective"]
MODEL_ENTRIES = ["control", "efficiency", "efficiency_vs_incumbent", "errors", "feedback",
                 "incumbent", "kind", "knobs", "mode", "mode_switching", "policy", "recommend",
                 "recommendations", "state"]
MODEL_MODES = {
    "control": 0o200, "state": 0o444, "kind": 0o644, "mode": 0o644, "mode_switching": 0o444,
    "knobs": 0o644, "recommend": 0o200, "policy": 0o644, "efficiency": 0o444,
    "efficiency_vs_incumbent": 0o444, "incumbent": 0o444, "errors": 0o444,
    "recommendations": 0o755, "feedback": 0o755,
}


def perm(path) -> tuple[int, int, int, bool]:
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, stat.S_ISDIR(st.st_mode)


def test_root_and_subsystem_entries_have_the_spec_modes_and_owner(shared_mount):
    root, sub = shared_mount.mountpoint, shared_mount.sub
    assert sorted(os.listdir(root)) == ["backends", "control", "errors", "events", "host",
                                        "metrics", "sim.readahead", "version"]
    assert sorted(os.listdir(sub)) == SUB_ENTRIES
    assert os.listdir(sub / "knobs") == ["read_ahead_kb"]
    expected = {
        root: (0o755, True), root / "version": (0o444, False),
        root / "events": (0o444, False), root / "metrics": (0o444, False),
        root / "backends": (0o444, False), root / "host": (0o444, False),
        root / "control": (0o200, False), root / "errors": (0o444, False),
        sub: (0o755, True), sub / "info": (0o444, False), sub / "control": (0o200, False),
        sub / "objective": (0o644, False), sub / "knobs": (0o755, True),
        sub / "knobs/read_ahead_kb": (0o444, False), sub / "events": (0o444, False),
        sub / "dataset": (0o755, True), sub / "models": (0o755, True),
        sub / "features": (0o444, False),
    }
    for path, (mode, is_dir) in expected.items():
        assert perm(path) == (mode, 0, 0, is_dir), path


def test_model_directory_has_exactly_the_spec_files_and_modes(shared_mount, shared_models):
    model = shared_models("layout", start=False)
    assert perm(model) == (0o755, 0, 0, True)
    assert sorted(os.listdir(model)) == MODEL_ENTRIES
    for name, mode in MODEL_MODES.items():
        assert perm(model / name)[:3] == (mode, 0, 0), name


def test_dataset_portions_are_read_only_regular_files_owned_by_root(shared_mount):
    dataset = shared_mount.sub / "dataset"
    portion = wait_for(lambda: sorted(dataset.glob("*.parquet")), what="a sealed portion")[0]
    assert re.fullmatch(r"\d{10}\.parquet", portion.name)
    st = os.stat(portion)
    assert stat.S_ISREG(st.st_mode)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o444, 0, 0)


def test_text_attributes_are_ascii_and_end_in_a_newline(shared_mount, shared_models):
    model = shared_models("texts", start=False)
    sub = shared_mount.sub
    single = {
        shared_mount.mountpoint / "version": r"mlfs \d+\.\d+\.\d+",
        sub / "knobs/read_ahead_kb": r"\d+",
        sub / "objective": r"nan|-?\d+(\.\d+)?(e[-+]\d+)?",
        sub / "features": r'\{"tick": \d+, "features": \{.*\}\}',
        model / "state": "initialized", model / "mode": "learning",
        model / "mode_switching": "auto", model / "knobs": "read_ahead_kb",
        model / "efficiency": "nan",
    }
    for path, pattern in single.items():
        text = path.read_bytes()
        assert text.endswith(b"\n") and text.count(b"\n") == 1, (path, text)
        assert text.isascii()
        assert re.fullmatch(pattern, text.decode().strip()), (path, text)
    for path in (sub / "info", shared_mount.mountpoint / "metrics"):
        text = path.read_bytes()
        assert text.isascii() and text.endswith(b"\n"), path
    assert (model / "errors").read_text() == ""


def test_info_describes_backend_objective_knobs_and_features(shared_mount):
    info = json.loads((shared_mount.sub / "info").read_text())
    assert info["backend"] == "sim.readahead"
    assert info["abi"] == ABI_VERSION  # the interface version; `version` stays one value
    assert (shared_mount.mountpoint / "version").read_text().count("\n") == 1
    assert info["tick_seconds"] == pytest.approx(0.02)
    assert info["objective"] == {"name": "throughput", "unit": "MB/s", "goal": "max"}
    assert info["knobs"]["read_ahead_kb"] == {"type": "int", "min": 0, "max": 4096,
                                              "default": 128, "unit": "KiB"}
    assert set(info["features"].values()) <= {"int64", "float64"}
    assert "mem_pressure" in info["features"]


def test_backends_lists_every_installed_backend_one_line_each(shared_mount):
    lines = (shared_mount.mountpoint / "backends").read_text().splitlines()
    names = [line.split(" ", 1)[0] for line in lines]
    assert {"sim.readahead", "linux.vm", "linux.block"} <= set(names)
    assert names == sorted(names) and all(len(line.split(" ", 1)) == 2 for line in lines)


def test_knob_file_shows_the_value_in_effect(shared_mount, shared_models):
    knob = shared_mount.sub / "knobs/read_ahead_kb"
    assert knob.read_text() == "128\n"
    model = shared_models("knobvalue")
    assert write_errno(model / "mode", b"recommendation\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=777\n") == 0
    wait_for(lambda: knob.read_text() == "777\n", what="the recommended value in effect")
    assert write_errno(model / "control", b"stop\n") == 0
    wait_for(lambda: knob.read_text() == "128\n", what="the default back after stop")


READ_ONLY = ["version", "metrics", "events", "backends", "errors", "sim.readahead/info",
             "sim.readahead/knobs/read_ahead_kb", "sim.readahead/events"]
MODEL_READ_ONLY = ["state", "mode_switching", "efficiency", "errors"]


def test_root_is_refused_writes_to_read_only_files(shared_mount, shared_models):
    model = shared_models("readonly", start=False)
    paths = [shared_mount.mountpoint / p for p in READ_ONLY]
    paths += [model / p for p in MODEL_READ_ONLY]
    paths.append(wait_for(lambda: sorted((shared_mount.sub / "dataset").glob("*.parquet")),
                          what="a portion")[0])
    for path in paths:
        before = path.read_bytes() if path.name not in ("events", "metrics") else None
        done = sh(f"echo x > {path}")
        assert done.returncode == 1, path
        assert "Permission denied" in done.stderr, (path, done.stderr)
        if before is not None and path.name not in ("read_ahead_kb", "efficiency"):
            assert path.read_bytes() == before, path
    assert (model / "state").read_text() == "initialized\n"


def test_reading_write_only_files_is_refused(shared_mount, shared_models):
    model = shared_models("writeonly", start=False)
    for path in (model / "recommend", model / "control", shared_mount.sub / "control",
                 shared_mount.mountpoint / "control"):
        done = sh(f"cat {path}")
        assert done.returncode == 1
        assert "Permission denied" in done.stderr, path


def test_files_cannot_be_created_removed_or_renamed(shared_mount, shared_models):
    sub = shared_mount.sub
    model = shared_models("nochange", start=False)
    for script in (f"touch {sub}/newfile", f"rm -f {sub}/info", f"rm -f {model}/state",
                   f"mv {sub}/info {sub}/info2", f"ln -s info {sub}/link"):
        done = sh(script)
        assert done.returncode != 0, script
    assert sorted(os.listdir(sub)) == SUB_ENTRIES
    assert sorted(os.listdir(model)) == MODEL_ENTRIES


@pytest.mark.parametrize("name", ["BAD", "a" * 65, "-dash", ".dot", "_under", "sp ace",
                                  "uni\u00e9"])
def test_mkdir_of_a_bad_model_name_is_einval(shared_mount, name):
    models = shared_mount.sub / "models"
    done = sh(f"mkdir '{models}/{name}'")
    assert done.returncode == 1
    assert "Invalid argument" in done.stderr, done.stderr
    assert name not in os.listdir(models)


def test_mkdir_accepts_names_up_to_64_characters(shared_mount, shared_models):
    for name in ("a" * 64, "x0.y_z-9"):
        path = shared_models(name, start=False)
        assert (path / "state").read_text() == "initialized\n"
        assert name in os.listdir(shared_mount.sub / "models")


def test_mkdir_of_an_existing_model_is_eexist(shared_mount, shared_models):
    shared_models("twice", start=False)
    done = sh(f"mkdir {shared_mount.sub}/models/twice")
    assert done.returncode == 1 and "File exists" in done.stderr


def test_mkdir_outside_models_is_refused(shared_mount, shared_models):
    model = shared_models("outside", start=False)
    root, sub = shared_mount.mountpoint, shared_mount.sub
    for parent in (root, sub, sub / "knobs", sub / "dataset", model, model / "feedback"):
        before = sorted(os.listdir(parent))
        done = sh(f"mkdir {parent}/extra")
        assert done.returncode == 1, parent
        assert done.stderr, parent
        assert sorted(os.listdir(parent)) == before


def test_rmdir_of_a_non_model_directory_is_refused(shared_mount):
    sub = shared_mount.sub  # (rmdir of `sub` itself unloads it: tests/mount/test_loading.py)
    for path in (sub / "dataset", sub / "models", sub / "knobs"):
        assert sh(f"rmdir {path}").returncode == 1, path
        assert path.is_dir()


def test_rmdir_removes_a_started_model_within_a_second(shared_mount, shared_models):
    models = shared_mount.sub / "models"
    model = shared_models("gone")
    assert write_errno(model / "recommend", b"read_ahead_kb=300\n") == 0
    assert sh(f"ls {models}").stdout.split().count("gone") == 1
    done = sh(f"rmdir {model}")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: "gone" not in sh(f"ls {models}").stdout.split(), timeout=1.5,
             what="ls forgetting the removed model")
    wait_for(lambda: not os.path.exists(model), timeout=1.5, what="stat failing")
    assert not (shared_mount.state_dir / "sim.readahead/models/gone").exists()
    # the knob it controlled is free again
    other = shared_models("after-gone")
    assert (other / "state").read_text() == "started\n"


def test_a_recreated_model_is_a_fresh_proxy(shared_mount, shared_models):
    model = shared_models("again")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=bad\n") != 0
    assert write_errno(model / "recommend", b"read_ahead_kb=300\n") == 0
    wait_for(lambda: list((model / "recommendations").glob("*.parquet")),
             what="a journal portion")
    assert sh(f"rmdir {model}").returncode == 0
    assert sh(f"mkdir {model}").returncode == 0
    assert (model / "state").read_text() == "initialized\n"
    assert (model / "mode").read_text() == "learning\n"
    assert (model / "mode_switching").read_text() == "auto\n"
    assert (model / "errors").read_text() == ""
    assert (model / "efficiency").read_text() == "nan\n"
    assert os.listdir(model / "recommendations") == []
    assert os.listdir(model / "feedback") == []


METRIC_LINE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})? '
    r'(-?\d+(\.\d+)?([eE][-+]?\d+)?|NaN|[+-]Inf)$')


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* \S", line), line
            continue
        match = METRIC_LINE.match(line)
        assert match, f"not Prometheus text format: {line!r}"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                 match.group(3) or ""))
        out.setdefault(match.group(1), []).append((labels, float(match.group(5))))
    return out


def test_metrics_are_prometheus_text_with_ticks_rows_portions_and_models(shared_mount,
                                                                         shared_models):
    model = shared_models("metered")
    assert write_errno(model / "mode", b"collaboration\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=nope\n") != 0
    wait_for(lambda: float((model / "efficiency").read_text()) > 0
             if (model / "efficiency").read_text() != "nan\n" else False,
             what="an efficiency")
    text = (shared_mount.mountpoint / "metrics").read_text()
    metrics = parse_metrics(text)
    sub = {"subsystem": "sim.readahead"}

    def value(name: str, **labels: str) -> float:
        found = [v for lab, v in metrics[name] if labels.items() <= lab.items()]
        assert len(found) == 1, (name, labels, metrics.get(name))
        return found[0]

    assert value("mlfs_ticks_total", **sub) > 0
    assert value("mlfs_dataset_rows_total", **sub) > 0
    assert value("mlfs_dataset_portions", **sub) >= 1
    statuses = {lab["status"] for lab, _ in metrics["mlfs_recommendations_total"]}
    assert {"accepted", "rejected"} <= statuses
    assert value("mlfs_recommendations_total", status="rejected") >= 1
    assert value("mlfs_model_efficiency", model="metered", **sub) > 0
    modes = {lab["mode"]: v for lab, v in metrics["mlfs_model_mode"]
             if lab["model"] == "metered"}
    assert modes == {"emergency": 0, "learning": 0, "collaboration": 1, "recommendation": 0}
    assert value("mlfs_model_ml_ticks_total", model="metered", **sub) > 0
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert {"mlfs_ticks_total", "mlfs_model_efficiency"} <= typed


_GETDENTS64 = {"x86_64": 217, "aarch64": 61}


def _getdents(fd: int, size: int) -> list[str]:
    """One getdents64(2) call with a small buffer: a listing read in several steps."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(size)
    got = libc.syscall(_GETDENTS64[os.uname().machine], fd, buf, size)
    assert got >= 0, os.strerror(ctypes.get_errno())
    names, pos = [], 0
    while pos < got:
        _ino, _off, reclen, _type = struct.unpack_from("QqHB", buf.raw, pos)
        names.append(buf.raw[pos + 19:pos + reclen].split(b"\0")[0].decode())
        pos += reclen
    return names


def test_removing_entries_during_a_listing_never_skips_the_others(shared_mount):
    if os.uname().machine not in _GETDENTS64:
        pytest.skip("getdents64 syscall number unknown here")
    models = shared_mount.sub / "models"
    names = [f"list{i:03d}" for i in range(80)]
    for name in names:
        (models / name).mkdir()
    try:
        fd = os.open(models, os.O_RDONLY | os.O_DIRECTORY)
        try:
            seen = _getdents(fd, 1024)
            assert 0 < len(seen) < len(names), "the first step must not read everything"
            removed = [n for n in names[:10] if n in seen]
            for name in removed:
                os.rmdir(models / name)
            while batch := _getdents(fd, 1024):
                seen += batch
        finally:
            os.close(fd)
        missing = set(names) - set(removed) - set(seen)
        assert not missing, f"live entries skipped by the listing: {sorted(missing)}"
        assert len(seen) == len(set(seen)), "an entry was listed twice"
    finally:
        for name in names:
            try:
                os.rmdir(models / name)
            except FileNotFoundError:
                pass
