"""The Prometheus text exposition of a mount serving several subsystems and models.

`promtool check metrics` (Debian's prometheus package, installed by .ci/setup)
is the reference linter; prometheus_client's parser is what most scrapers in
Python use and the one that split a family whose samples were scattered.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.harness import FAST_CONFIG, Mount, new_model, wait_for, write_errno

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

TWO_SUBSYSTEMS = FAST_CONFIG + """
[[subsystem]]
backend = "sim.readahead"
name = "sim.second"
seed = 2
tick_seconds = 0.02
"""

MODELS = ("alpha", "beta", "gamma")


@pytest.fixture
def two_subsystems(mount_root):
    m = Mount(mount_root, TWO_SUBSYSTEMS).start()
    try:
        for sub in ("sim.readahead", "sim.second"):
            # one started model per knob (the others would get EBUSY); the rest idle
            for index, name in enumerate(MODELS):
                new_model(m.mountpoint / sub, name, start=index == 0)
            first = m.mountpoint / sub / "models" / MODELS[0]
            assert write_errno(first / "mode", b"collaboration\n") == 0
            assert write_errno(first / "recommend", b"read_ahead_kb=512\n") == 0
        yield m
    finally:
        m.kill()


def _page(m: Mount) -> str:
    sub = m.mountpoint / "sim.second" / "models" / MODELS[0]
    wait_for(lambda: (sub / "efficiency").read_text() != "nan\n", what="an efficiency")
    return (m.mountpoint / "metrics").read_text()


def test_promtool_finds_nothing_to_lint_with_two_subsystems_and_six_models(two_subsystems):
    if not os.access(PROMTOOL, os.X_OK):
        pytest.skip("needs promtool: apt-get install prometheus")
    page = _page(two_subsystems)
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=page, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr)


def test_each_family_is_one_block_that_prometheus_client_reads_as_one(two_subsystems):
    from prometheus_client.parser import text_string_to_metric_families

    page = _page(two_subsystems)
    typed = [line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")]
    assert len(typed) == len(set(typed)), "a family declared twice"
    # every sample line follows its own family's TYPE line, never another's
    current = None
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
        elif not line.startswith("#"):
            name = line.split("{")[0].split()[0]
            assert name == current or name in (f"{current}_sum", f"{current}_count",
                                               f"{current}_bucket"), line
    families = list(text_string_to_metric_families(page))
    assert len(families) == len(typed)
    by_name = {f.name: f for f in families}
    ticks = {s.labels["subsystem"] for s in by_name["mlfs_ticks"].samples}
    assert ticks == {"sim.readahead", "sim.second"}
    efficiency = {(s.labels["subsystem"], s.labels["model"])
                  for s in by_name["mlfs_model_efficiency"].samples}
    assert len(efficiency) == 6
    error = by_name["mlfs_model_feedback_abs_error"]
    assert error.type == "summary"
    assert {s.name for s in error.samples} == {"mlfs_model_feedback_abs_error_sum",
                                               "mlfs_model_feedback_abs_error_count"}
    ticks_took = by_name["mlfs_tick_duration_seconds"]  # a histogram per subsystem
    assert ticks_took.type == "histogram"
    infinite = [s for s in ticks_took.samples
                if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
    counts = {s.labels["subsystem"]: s.value for s in ticks_took.samples
              if s.name.endswith("_count")}
    assert {s.labels["subsystem"]: s.value for s in infinite} == counts
    assert all(v > 0 for v in counts.values())
    reads = by_name["mlfs_fuse_operation_seconds"]  # this very page's reads were timed
    assert {"lookup", "open", "read"} <= {s.labels["operation"] for s in reads.samples}
    build = by_name["mlfs_build_info"].samples
    assert [(s.labels, s.value) for s in build] == [({"version": _version()}, 1.0)]
    for name in ("process_cpu_seconds", "process_resident_memory_bytes",
                 "process_start_time_seconds", "process_open_fds", "process_max_fds"):
        assert by_name[name].samples[0].value > 0, name
    start = by_name["process_start_time_seconds"].samples[0].value
    assert abs(start - os.stat(f"/proc/{two_subsystems.pid}").st_mtime) < 120


def _version() -> str:
    from mlfs import __version__

    return __version__
