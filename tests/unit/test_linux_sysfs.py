"""Declared subsystems (linux.sysfs) against the real /proc and /sys, without FUSE."""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path

import pytest
from mlfs.backends import check_entry, create_subsystems
from mlfs.backends.linux.sysfs import DeclaredSubsystem
from mlfs.backends.linux.vm import FEATURES as VM_FEATURES
from mlfs.backends.linux.vm import LinuxVM

from mlfs.abi import SettingError

REPO = Path(__file__).resolve().parents[2]
VM_DECLARED = REPO / "docs" / "examples" / "linux-vm-declared.toml"


def declared_vm(**overrides) -> dict:
    entry = tomllib.loads(VM_DECLARED.read_text())["subsystem"][0]
    return {**entry, **overrides}


def refusal(entry: dict) -> SettingError:
    with pytest.raises(SettingError) as info:
        check_entry(entry)
    return info.value


def test_the_declared_linux_vm_has_linux_vms_knobs_and_all_its_features_but_three():
    sub, = create_subsystems([declared_vm()])
    try:
        vm = LinuxVM()
        assert sub.name == "vm.declared" and sub.backend == "linux.sysfs"
        assert sub.knobs == vm.knobs  # observe-only: the value in effect, min == max
        # a difference, and sums over every process's /proc/<pid>/io, are beyond a
        # declaration (docs/declared-subsystems.md)
        beyond = {"swap_used_frac", "write_kb_per_call", "bulk_write_kb_per_call",
                  "write_calls_per_s"}
        assert set(VM_FEATURES) - set(sub.features) == beyond
        assert list(sub.features) == [f for f in VM_FEATURES if f not in beyond]
        assert sub.objective == vm.objective and sub.blocking
    finally:
        sub.close()


def test_the_declared_linux_vm_reads_what_the_hand_written_one_reads_in_the_same_window():
    sub, = create_subsystems([declared_vm(measure_seconds=0.3)])
    vm = LinuxVM(measure_seconds=0.3)
    samples = {}

    def run(key, subsystem):
        samples[key] = subsystem.step(subsystem.default_knobs(None))

    threads = [threading.Thread(target=run, args=(k, s)) for k, s in (("d", sub), ("v", vm))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sub.close()
    declared, hand = samples["d"].features, samples["v"].features
    # levels that change slowly: the same figure from the same file
    for name in ("mem_available_frac", "page_cache_frac", "dirty_threshold_mb",
                 *(f"psi_{r}_{k}_avg10" for r in ("cpu", "memory", "io")
                   for k in ("some", "full"))):
        assert declared[name] == pytest.approx(hand[name], rel=0.02, abs=1.0), name
    for name in declared:
        assert declared[name] >= 0, name


def test_declared_features_are_the_numbers_in_the_kernel_files(loop):
    stat = f"/sys/block/{loop}/stat"
    sub = DeclaredSubsystem(
        name="files", measure_seconds=0, objective="swappiness",
        features={
            "swappiness": {"path": "/proc/sys/vm/swappiness"},
            "read_ios": {"path": stat, "field": 0},
            "read_sectors": {"path": f"/sys/block/{loop}/stat", "field": 2, "scale": 0.5},
            "mem_total_kb": {"path": "/proc/meminfo", "key": "MemTotal"},
            "total_over_total": {"path": "/proc/meminfo", "key": "MemTotal",
                                 "divide_by": "MemTotal"},
            "no_such_key": {"path": "/proc/vmstat", "key": "not_a_counter"},
            "pgfault": {"path": "/proc/vmstat", "key": "pgfault"},
            "cpu_some_total": {"path": "/proc/pressure/cpu", "psi": "some total"},
        })
    before_vmstat = _vmstat("pgfault")
    before_psi = _psi_total("cpu")
    features = sub.step({}).features
    after_vmstat, after_psi = _vmstat("pgfault"), _psi_total("cpu")
    fields = Path(stat).read_text().split()
    assert features["swappiness"] == int(Path("/proc/sys/vm/swappiness").read_text())
    assert features["read_ios"] == int(fields[0])
    assert features["read_sectors"] == int(fields[2]) * 0.5
    mem_total = next(int(line.split()[1]) for line in Path("/proc/meminfo").open()
                     if line.startswith("MemTotal:"))
    assert features["mem_total_kb"] == mem_total
    assert features["total_over_total"] == 1.0
    assert features["no_such_key"] == 0.0  # a counter this kernel lacks reads 0
    assert before_vmstat <= features["pgfault"] <= after_vmstat  # counters only grow
    assert before_psi <= features["cpu_some_total"] <= after_psi
    assert sub.step({}).objective == features["swappiness"]


def _vmstat(key: str) -> int:
    return next(int(line.split()[1]) for line in Path("/proc/vmstat").open()
                if line.split()[0] == key)


def _psi_total(resource: str) -> float:
    line = Path(f"/proc/pressure/{resource}").read_text().splitlines()[0]
    return float(line.split("total=")[1])


def test_rates_are_per_second_increases_scaled():
    sub = DeclaredSubsystem(name="rates", measure_seconds=0, objective="faults_per_s",
                            features={"faults_per_s": {"path": "/proc/vmstat",
                                                       "key": ["pgfault", "pgmajfault"],
                                                       "kind": "rate", "scale": 2.0}})
    source = next(iter(sub._sources))
    before = {source: {"pgfault": 100, "pgmajfault": 10}}
    after = {source: {"pgfault": 400, "pgmajfault": 30}}
    assert sub.derive(before, after, 2.0) == {"faults_per_s": (430 - 110) / 2.0 * 2.0}
    # a counter that went backwards (reset) gives 0, never a negative rate
    assert sub.derive(after, before, 2.0) == {"faults_per_s": 0.0}


def test_a_declared_subsystems_objective_is_the_applications_by_default():
    """The core's rule then applies (tests/unit/test_application_objective.py): the
    sample's own objective is never recorded."""
    sub = DeclaredSubsystem(name="app", measure_seconds=0, unit="ops/s",
                            features={"swappiness": {"path": "/proc/sys/vm/swappiness"}})
    assert (sub.objective.name, sub.objective.unit) == ("application", "ops/s")


def test_knob_paths_must_resolve_under_proc_sys_or_sys(tmp_path):
    escape = tmp_path / "escape"
    escape.symlink_to("/etc/hostname")
    inside = tmp_path / "inside"
    inside.symlink_to("/proc/sys/vm/swappiness")
    feature = {"f": {"path": "/proc/loadavg"}}
    for path in ("/etc/hostname", str(escape), "/proc/loadavg", "relative/path",
                 "/proc/sys/vm/../../../etc/hostname", "/proc/sys/vm/no_such_knob"):
        error = refusal({"backend": "linux.sysfs", "features": feature,
                         "knobs": {"k": {"path": path, "range": [0, 1]}}})
        assert error.key == "knobs.k.path", (path, error)
    # a symlink that resolves into /proc/sys is the file it names
    assert check_entry({"backend": "linux.sysfs", "features": feature,
                        "knobs": {"k": {"path": str(inside), "range": [0, 200]}}}) == [
        "linux.sysfs"]
    error = refusal({"backend": "linux.sysfs", "features": {"f": {"path": "/etc/hostname"}}})
    assert error.key == "features.f.path"


@pytest.mark.parametrize("entry, key", [
    ({"features": {}}, "features"),
    ({"features": {"f": {"path": "/proc/loadavg", "colour": 1}}}, "features.f"),
    ({"features": {"f": {"path": "/proc/loadavg", "kind": "speed"}}}, "features.f.kind"),
    ({"features": {"f": {"path": "/proc/pressure/io", "psi": "some avg11"}}}, "features.f.psi"),
    ({"features": {"f": {"path": "/proc/loadavg", "key": "a", "psi": "some total"}}},
     "features.f"),
    ({"features": {"f": {"path": "/proc/loadavg", "scale": float("nan")}}}, "features.f.scale"),
    ({"features": {"tick": {"path": "/proc/loadavg"}}}, "features.tick"),
    ({"objective": "nothing"}, "objective"),
    ({"critical": {"nothing": 1}}, "critical.nothing"),
    ({"knobs": {"k": {"path": "/proc/sys/vm/swappiness"}}}, "knobs.k"),
    ({"knobs": {"k": {"path": "/proc/sys/vm/swappiness", "range": [5, 1]}}}, "knobs.k.range"),
    ({"knobs": {"k": {"path": "/proc/sys/vm/swappiness", "range": [0, 200],
                      "apply": [0, 300]}}}, "knobs"),
    ({"knobs": {"k": {"path": "/proc/sys/vm/swappiness", "range": [0, 200],
                      "apply": [10, 100], "default": 5}}}, "knobs.k.default"),
    ({"knobs": {"k": {"path": "/proc/sys/vm/swappiness", "range": [0, 200],
                      "default": 60}}}, "knobs.k.default"),
    ({"state_dir": "/tmp"}, "state_dir"),
])
def test_a_wrong_declaration_is_refused_naming_the_key(entry, key):
    full = {"backend": "linux.sysfs", "features": {"f": {"path": "/proc/loadavg"}}, **entry}
    assert refusal(full).key == key


def test_a_declared_knob_is_written_within_apply_and_restored_on_close(loop, tmp_path):
    path = Path(f"/sys/block/{loop}/queue/read_ahead_kb")
    original = path.read_text().strip()
    sub, = create_subsystems([{
        "backend": "linux.sysfs", "name": "ra", "measure_seconds": 0,
        "objective": "reads",
        "knobs": {"read_ahead_kb": {"path": str(path), "range": [0, 65536],
                                    "apply": [16, 4096]}},
        "features": {"reads": {"path": f"/sys/block/{loop}/stat", "field": 0}},
    }], state_dir=str(tmp_path))
    try:
        assert sub.knobs["read_ahead_kb"].min == 16 and sub.knobs["read_ahead_kb"].max == 4096
        sub.step({"read_ahead_kb": 1024})
        assert path.read_text().strip() == "1024"
        ledger = list((tmp_path / "ledger").glob("*.json"))
        assert len(ledger) == 1 and os.path.realpath(path) in ledger[0].read_text()
        refused = sub.step({"read_ahead_kb": 8192}).extra  # outside apply: never written
        assert "read_ahead_kb" in refused["refused"]
        assert path.read_text().strip() == "1024"
    finally:
        sub.close()
    assert path.read_text().strip() == original
    assert list((tmp_path / "ledger").glob("*.json")) == []


def test_a_fixed_default_policy_is_the_default_algorithm_and_is_restored_on_close(loop, tmp_path):
    path = Path(f"/sys/block/{loop}/queue/read_ahead_kb")
    original = path.read_text().strip()
    fixed = 256 if original != "256" else 512
    sub = DeclaredSubsystem(
        name="ra", measure_seconds=0, objective="reads", state_dir=tmp_path,
        knobs={"read_ahead_kb": {"path": str(path), "range": [0, 65536], "apply": [16, 4096],
                                 "default": fixed}},
        features={"reads": {"path": f"/sys/block/{loop}/stat", "field": 0}})
    try:
        assert sub.knobs["read_ahead_kb"].default == fixed  # what info shows
        assert sub.default_knobs(None) == {"read_ahead_kb": fixed}
        sub.step(sub.default_knobs(None))
        assert path.read_text().strip() == str(fixed)
    finally:
        sub.close()
    assert path.read_text().strip() == original


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup v1 memory group (removed afterwards)."""
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "memory.stat").exists():
        pytest.skip("needs root and the cgroup v1 memory controller")
    group = root / f"mlfs-test-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        group.rmdir()


def test_a_cgroup_file_is_a_declared_knob_and_memory_stat_a_feature(memory_cgroup, tmp_path):
    knob = memory_cgroup / "memory.swappiness"
    original = knob.read_text().strip()
    want = "30" if original != "30" else "40"
    sub = DeclaredSubsystem(
        name="cg", measure_seconds=0, objective="limit", state_dir=tmp_path,
        knobs={"swappiness": {"path": str(knob), "range": [0, 100], "apply": [0, 100]}},
        features={"limit": {"path": str(memory_cgroup / "memory.stat"),
                            "key": "hierarchical_memory_limit"}})
    try:
        sample = sub.step({"swappiness": int(want)})
        assert knob.read_text().strip() == want
        stat = dict(line.split() for line in (memory_cgroup / "memory.stat").open())
        assert sample.features["limit"] == float(int(stat["hierarchical_memory_limit"]))
    finally:
        sub.close()
    assert knob.read_text().strip() == original


def test_a_bracketed_choice_file_is_a_declared_choice_knob(loop, tmp_path):
    path = Path(f"/sys/block/{loop}/queue/scheduler")
    original = next(w[1:-1] for w in path.read_text().split() if w.startswith("["))
    other = "mq-deadline" if original != "mq-deadline" else "none"
    sub = DeclaredSubsystem(
        name="sched", measure_seconds=0, objective="reads", state_dir=tmp_path,
        knobs={"scheduler": {"path": str(path), "choices": ["none", "mq-deadline"],
                             "apply": ["none", "mq-deadline"]}},
        features={"reads": {"path": f"/sys/block/{loop}/stat", "field": 0}})
    try:
        knob = sub.knobs["scheduler"]
        assert knob.type == "choice" and knob.default == original
        assert set(knob.choices) == {"none", "mq-deadline"}
        sub.step({"scheduler": other})
        assert f"[{other}]" in path.read_text()
        assert "scheduler" in sub.step({"scheduler": "bfq"}).extra["refused"]  # not in apply
    finally:
        sub.close()
    assert f"[{original}]" in path.read_text()
