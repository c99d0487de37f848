"""The real Linux backends against the real /proc and /sys, without FUSE.

What users trust these backends with is their running kernel, so most of
these tests pin the safety promises of backends/linux/__init__.py: observe-only
never writes; an allowed knob is written within bounds and restored by
release() and close(); a crash (the object dropped without close, or a
process killed with SIGKILL) is repaired by the next construction; a value
changed behind mlfs's back is left alone; a refused write is reported once
and not hammered.

Block tests create their own loop device and detach it afterwards; vm tests
check that every vm sysctl they may touch is back to its original value at
the end (and put it back themselves if not, before failing).
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import mlfs.backends.linux.files as kernel
import pytest
from mlfs.backends import create_subsystems
from mlfs.backends.linux.block import LinuxBlock, auto_devices, current_scheduler
from mlfs.backends.linux.vm import BULK_MIN_MB_PER_S, LinuxVM
from mlfs.backends.linux.vm import FEATURES as VM_FEATURES

from mlfs.abi import Subsystem

REPO = Path(__file__).resolve().parents[2]
VM = Path("/proc/sys/vm")
VM_FILES = ("swappiness", "dirty_ratio", "dirty_background_ratio", "vfs_cache_pressure",
            "dirty_bytes", "dirty_background_bytes", "dirty_expire_centisecs",
            "dirty_writeback_centisecs")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="writing sysctls/sysfs needs root")


def read(path: Path) -> str:
    return path.read_text().strip()


def write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value + "\n")


def ledger_entries(state: Path) -> list[dict]:
    directory = state / "ledger"
    if not directory.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


# ---- fixtures ------------------------------------------------------------------------
@pytest.fixture
def queue(loop: str) -> Path:
    return Path("/sys/block") / loop / "queue"


@pytest.fixture
def vm_guard() -> Iterator[dict[str, str]]:
    """The vm sysctls' values before the test; every one must be back after it."""
    if os.geteuid() != 0:
        pytest.skip("writing sysctls needs root")
    before = {name: read(VM / name) for name in VM_FILES}
    yield before
    after = {name: read(VM / name) for name in VM_FILES}
    if after != before:  # put them back ourselves, then fail
        for ratio, size in (("dirty_ratio", "dirty_bytes"),
                            ("dirty_background_ratio", "dirty_background_bytes")):
            if before[size] != "0":
                write(VM / size, before[size])
            else:
                write(VM / ratio, before[ratio])
        for name in ("swappiness", "vfs_cache_pressure", "dirty_expire_centisecs",
                     "dirty_writeback_centisecs"):
            write(VM / name, before[name])
        pytest.fail(f"vm sysctls not restored: before {before}, after {after}")


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every kernel write the backends make, recorded (and still performed).

    linux.files.write_text is the one place the controller and the ledger
    write a kernel file (they call it through the module, so this spy sees it).
    """
    seen: list[tuple[str, str]] = []
    real = kernel.write_text

    def spy(path, value):
        seen.append((str(path), value))
        return real(path, value)

    monkeypatch.setattr(kernel, "write_text", spy)
    return seen


def block(device: str, state: Path | None, **kwargs) -> LinuxBlock:
    return LinuxBlock(device, measure_seconds=0, state_dir=state, **kwargs)


# ---- interface and features ------------------------------------------------------------
def test_vm_declares_the_interface_and_samples_finite_features(tmp_path: Path) -> None:
    # critical_full_avg10=100 turns the critical check off: a busy CI machine may
    # really be under IO pressure, which is not what this test is about
    vm = LinuxVM(measure_seconds=0, critical_full_avg10=100.0, state_dir=tmp_path)
    try:
        assert isinstance(vm, Subsystem) and vm.blocking is True
        assert vm.name == "linux.vm" and vm.backend == "linux.vm"
        assert list(vm.knobs) == ["swappiness", "dirty_ratio", "dirty_background_ratio",
                                  "vfs_cache_pressure", "dirty_expire_centisecs",
                                  "dirty_writeback_centisecs"]
        assert (vm.objective.name, vm.objective.unit, vm.objective.goal) == (
            "psi_memory_some_stall_us_per_s", "us/s", "min")
        assert "observe-only" in vm.description
        assert vm.default_knobs(None) == {n: int(read(VM / n)) for n in vm.knobs}
        for _ in range(3):
            sample = vm.step(vm.default_knobs(None))
            assert list(sample.features) == list(vm.features) == list(VM_FEATURES)
            assert all(type(v) is float and math.isfinite(v) for v in sample.features.values())
            assert sample.objective == sample.features["psi_memory_some_stall_us_per_s"]
            assert 0 < sample.features["mem_available_frac"] <= 1
            assert sample.critical is None
            assert sample.extra == {}
    finally:
        vm.close()


def test_vm_critical_state_when_full_pressure_exceeds_the_level(tmp_path: Path) -> None:
    vm = LinuxVM(measure_seconds=0, critical_full_avg10=-1.0, state_dir=tmp_path)
    sample = vm.step(vm.default_knobs(None))
    assert sample.critical and sample.critical.startswith("PSI memory full avg10")
    relaxed = LinuxVM(measure_seconds=0, critical_full_avg10=100.0, state_dir=tmp_path)
    assert relaxed.step(relaxed.default_knobs(None)).critical is None


def test_block_features_measure_reads_on_the_device(loop: str, tmp_path: Path) -> None:
    sub = block(loop, tmp_path)
    try:
        assert sub.name == f"linux.block.{loop}" and sub.backend == "linux.block"
        assert list(sub.knobs) == ["read_ahead_kb", "nr_requests", "scheduler"]
        assert (sub.objective.name, sub.objective.unit, sub.objective.goal) == (
            "read_mb_per_s", "MB/s", "max")
        sub.step(sub.default_knobs(None))
        subprocess.run(["dd", f"if=/dev/{loop}", "of=/dev/null", "bs=1M", "count=16",
                        "iflag=direct", "status=none"], check=True)
        sample = sub.step(sub.default_knobs(None))
        assert list(sample.features) == list(sub.features)
        assert all(type(v) is float and math.isfinite(v) for v in sample.features.values())
        assert sample.features["reads_per_s"] > 0
        assert sample.objective == sample.features["read_mb_per_s"] > 0
        assert sample.features["read_req_kb"] > 0
        assert 0 <= sample.features["util"] <= 1
    finally:
        sub.close()


def test_auto_devices_are_whole_disks_but_not_loop_ram_zram_dm(loop: str) -> None:
    devices = auto_devices()
    assert loop not in devices
    assert not [d for d in devices if d.startswith(("loop", "ram", "zram", "dm-"))]
    assert all(Path("/sys/block", d, "queue/scheduler").exists() for d in devices)
    subs = create_subsystems([{"backend": "linux.block", "measure_seconds": 0}])
    assert [s.name for s in subs] == [f"linux.block.{d}" for d in devices]
    for sub in subs:
        sub.close()


def test_configuration_errors_are_refused_before_anything_runs(loop: str,
                                                                tmp_path: Path) -> None:
    bad = [
        ({"apply": {"read_ahead_kb": [0, 100000]}}, "must satisfy"),
        ({"apply": {"read_ahead_kb": [64, 16]}}, "must satisfy"),
        ({"apply": {"read_ahead_kb": 64}}, r"must be \[lo, hi\]"),
        ({"apply": {"bogus": [1, 2]}}, "unknown knob"),
        ({"apply": {"scheduler": ["no-such-elevator"]}}, "not offered"),
        ({"objective": "nothing"}, "not a feature"),
        ({"goal": "up"}, "goal"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            block(loop, tmp_path, **kwargs)
    with pytest.raises(ValueError, match="state directory"):
        block(loop, None, apply={"read_ahead_kb": [16, 4096]})
    with pytest.raises(ValueError, match="unknown setting"):
        create_subsystems([{"backend": "linux.block", "devices": [loop], "speed": 1}])
    with pytest.raises(ValueError, match="not a whole disk"):
        create_subsystems([{"backend": "linux.block", "devices": ["../etc"]}])
    with pytest.raises(ValueError, match="must satisfy"):
        LinuxVM(apply={"swappiness": [0, 201]}, state_dir=tmp_path)


# ---- observe-only ------------------------------------------------------------------------
def test_observe_only_vm_never_writes(tmp_path: Path, writes: list) -> None:
    before = {name: read(VM / name) for name in VM_FILES}
    vm = LinuxVM(measure_seconds=0, state_dir=tmp_path)
    knob = vm.knobs["swappiness"]
    assert knob.min == knob.max == knob.default == int(before["swappiness"])
    requests = [{"swappiness": 0}, {"swappiness": 200, "dirty_ratio": 5},
                {"dirty_background_ratio": 1, "vfs_cache_pressure": 1000},
                {"swappiness": 200}, vm.default_knobs(None)]
    refused: dict[str, list[str]] = {}
    for request in requests * 4:
        sample = vm.step(request)
        assert "foreign" not in sample.extra
        for name, reason in sample.extra.get("refused", {}).items():
            assert "observe-only" in reason
            refused.setdefault(name, []).append(reason)
    vm.release(list(vm.knobs))
    vm.close()
    assert writes == []
    assert {name: read(VM / name) for name in VM_FILES} == before
    assert ledger_entries(tmp_path) == []
    # once per distinct value: swappiness 0 and 200, dirty_ratio 5, ...
    assert len(refused["swappiness"]) == 2
    assert len(refused["dirty_ratio"]) == len(refused["vfs_cache_pressure"]) == 1


def test_observe_only_block_never_writes(loop: str, queue: Path, tmp_path: Path,
                                         writes: list) -> None:
    files = ("read_ahead_kb", "nr_requests", "scheduler")
    before = {name: read(queue / name) for name in files}
    sub = block(loop, tmp_path)
    assert sub.knobs["scheduler"].choices == (current_scheduler(loop),)
    assert sub.knobs["read_ahead_kb"].min == sub.knobs["read_ahead_kb"].max
    for request in [{"read_ahead_kb": 16}, {"nr_requests": 64},
                    {"scheduler": "mq-deadline"}, {"read_ahead_kb": 4096}] * 5:
        sub.step(request)
    sub.release(list(sub.knobs))
    sub.close()
    assert writes == []
    assert {name: read(queue / name) for name in files} == before
    assert ledger_entries(tmp_path) == []


# ---- applying and restoring ----------------------------------------------------------------
def test_allowed_knob_is_written_within_bounds_and_restored_by_release_and_close(
        loop: str, queue: Path, tmp_path: Path, writes: list) -> None:
    original = read(queue / "read_ahead_kb")
    sub = block(loop, tmp_path, apply={"read_ahead_kb": [16, 4096]})
    knob = sub.knobs["read_ahead_kb"]
    assert (knob.min, knob.max, knob.default) == (16, 4096, int(original))
    assert "read_ahead_kb in [16, 4096]" in sub.description
    assert sub.knobs["nr_requests"].min == sub.knobs["nr_requests"].max  # not allowed

    sample = sub.step({"read_ahead_kb": 512})
    assert sample.extra == {}
    assert read(queue / "read_ahead_kb") == "512"
    [entry] = ledger_entries(tmp_path)
    assert (entry["knob"], entry["original"]) == ("read_ahead_kb", original)
    assert entry["path"] == str(queue / "read_ahead_kb")
    assert sub.default_knobs(None)["read_ahead_kb"] == int(original)  # default = original

    # outside the configured bounds (the proxy would say EINVAL; here it is the backend)
    sample = sub.step({"read_ahead_kb": 8192})
    assert "outside the configured" in sample.extra["refused"]["read_ahead_kb"]
    assert read(queue / "read_ahead_kb") == "512"
    sample = sub.step({"read_ahead_kb": "1_024"})  # only plain decimals reach the kernel
    assert "outside the configured" in sample.extra["refused"]["read_ahead_kb"]
    # a knob the configuration does not list is never written
    sample = sub.step({"read_ahead_kb": 512, "nr_requests": 64})
    assert "observe-only" in sample.extra["refused"]["nr_requests"]

    sub.release(["read_ahead_kb"])  # a model stopped: original at once
    assert read(queue / "read_ahead_kb") == original
    assert ledger_entries(tmp_path) == []

    sub.step({"read_ahead_kb": 1024})
    assert read(queue / "read_ahead_kb") == "1024"
    sub.step(sub.default_knobs(None))  # a default tick puts the original back
    assert read(queue / "read_ahead_kb") == original
    sub.step({"read_ahead_kb": 2048})
    sub.close()  # unmount
    assert read(queue / "read_ahead_kb") == original
    assert ledger_entries(tmp_path) == []
    sub.step({"read_ahead_kb": 256})  # nothing is written after close
    assert read(queue / "read_ahead_kb") == original
    assert {path for path, _ in writes} == {str(queue / "read_ahead_kb")}


def test_vm_sysctl_is_written_and_restored(tmp_path: Path, vm_guard: dict) -> None:
    original = int(vm_guard["swappiness"])
    target = original + 1 if original < 200 else original - 1
    vm = LinuxVM(measure_seconds=0, state_dir=tmp_path, apply={"swappiness": [0, 200]})
    try:
        assert vm.step({"swappiness": target}).extra == {}
        assert read(VM / "swappiness") == str(target)
        assert [e["original"] for e in ledger_entries(tmp_path)] == [str(original)]
        vm.release(["swappiness"])
        assert read(VM / "swappiness") == str(original)
        vm.step({"swappiness": target})
        assert read(VM / "swappiness") == str(target)
    finally:
        vm.close()
    assert read(VM / "swappiness") == str(original)
    assert ledger_entries(tmp_path) == []


def test_vm_block_io_features_count_direct_reads_that_bypass_the_page_cache(
        loop: str, tmp_path: Path) -> None:
    # O_DIRECT reads never touch the page cache (dirtied/written stay put) but
    # are block I/O: the feature that tells a phase of uncached reads apart
    vm = LinuxVM(measure_seconds=0, critical_full_avg10=100.0, state_dir=tmp_path)
    try:
        vm.step(vm.default_knobs(None))
        started = time.monotonic()
        subprocess.run(["dd", f"if=/dev/{loop}", "of=/dev/null", "bs=1M", "count=32",
                        "iflag=direct", "status=none"], check=True)
        sample = vm.step(vm.default_knobs(None))
        window = time.monotonic() - started + 0.5
        # at least the 32 MiB dd read, as a rate over at most the time since the last step
        # (a consistency check of the figure against the clock, not a speed limit)
        read_mb = sample.features["block_read_mb_per_s"] * window
        assert read_mb >= 32 * 1.048576
        assert sample.features["block_write_mb_per_s"] >= 0
    finally:
        vm.close()


def test_vm_write_size_is_what_the_application_asks_of_write(tmp_path: Path) -> None:
    # dd's write(2) size, whatever the page cache makes of it (to /dev/null: no
    # dirty pages at all); the machine's other writers make a few small calls
    vm = LinuxVM(measure_seconds=0, critical_full_avg10=100.0, state_dir=tmp_path)
    try:
        sizes = {}
        for block, count in (("1M", 2048), ("64k", 4096)):
            vm.step(vm.default_knobs(None))
            subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", f"bs={block}",
                            f"count={count}", "status=none"], check=True)
            sample = vm.step(vm.default_knobs(None))
            sizes[block] = sample.features["write_kb_per_call"]
            assert sample.features["write_calls_per_s"] > 0
        assert 512 <= sizes["1M"] <= 1024
        assert 32 <= sizes["64k"] <= 64
    finally:
        vm.close()


def test_vm_bulk_write_size_is_the_big_writers_call_size_beside_small_calls_and_idle_windows(
        tmp_path: Path) -> None:
    # a 1 MiB writer and, in the same window, 400,000 calls of 16 bytes (a chatty
    # logger), each a live process when the window ends (a reaped child's counts
    # fold into its parent's, so each dd runs under a shell that then waits)
    def writer(block: str, count: int) -> subprocess.Popen:
        return subprocess.Popen(
            ["sh", "-c", f"dd if=/dev/zero of=/dev/null bs={block} count={count} "
             "status=none && echo done && exec sleep 30"], stdout=subprocess.PIPE)

    def bytes_per_s(features: dict) -> float:
        return features["write_kb_per_call"] * 1024 * features["write_calls_per_s"]

    vm = LinuxVM(measure_seconds=0, critical_full_avg10=100.0, state_dir=tmp_path)
    writers: list[subprocess.Popen] = []
    try:
        vm.step(vm.default_knobs(None))
        # The window is the whole machine's: a parallel test writing at a bulk writer's
        # rate in the quiet window below is, by the rule, that window's bulk writer (the
        # suite once read its 64 KiB there).  So the pair of windows is taken again
        # until the quiet one was quiet, and made half a second long, so that the
        # small writes of the machine's daemons stay under the rate.
        for _attempt in range(5):
            # 1 GiB, so that another process's bulk write cannot hold the median byte
            pair = [writer("1M", 1024), writer("16", 400_000)]
            writers += pair
            for proc in pair:
                assert proc.stdout.readline() == b"done\n"
            features = vm.step(vm.default_knobs(None)).features
            assert features["write_kb_per_call"] < 8
            # the shell's own "done" is one more call of 5 bytes in the writer's counts
            assert 1020 <= features["bulk_write_kb_per_call"] <= 1024
            # a window without a bulk writer (a checkpoint writer waiting in fdatasync)
            # keeps the last one's size, while the mean reads the few calls there are
            time.sleep(0.5)
            features = vm.step(vm.default_knobs(None)).features
            if bytes_per_s(features) < BULK_MIN_MB_PER_S * 1e6:
                break
        else:
            pytest.fail("another process wrote at a bulk writer's rate in all 5 quiet "
                        "windows")
        assert 1020 <= features["bulk_write_kb_per_call"] <= 1024
        # the small writer alone (16 MB in about a second: a bulk writer's rate) reads its
        # own size on both; as much as the big writer wrote, so that the other tests'
        # writes in the same machine-wide window (3.2 MB here gave 9 KiB on a loaded
        # machine) cannot hold its median byte
        writers.append(writer("16", 1_000_000))
        assert writers[-1].stdout.readline() == b"done\n"
        features = vm.step(vm.default_knobs(None)).features
        assert features["bulk_write_kb_per_call"] < 1
    finally:
        for proc in writers:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        vm.close()


def test_writeback_timers_are_written_within_bounds_and_restored(
        tmp_path: Path, vm_guard: dict) -> None:
    expire = int(vm_guard["dirty_expire_centisecs"])
    target = 1500 if expire != 1500 else 1600
    vm = LinuxVM(measure_seconds=0, state_dir=tmp_path, critical_full_avg10=100.0,
                 apply={"dirty_expire_centisecs": [100, 12000],
                        "dirty_writeback_centisecs": [50, 3000]})
    try:
        knobs = vm.default_knobs(None)
        assert vm.step({**knobs, "dirty_expire_centisecs": target}).extra == {}
        assert read(VM / "dirty_expire_centisecs") == str(target)
        # 0 ("never wake the flusher") is outside the configured bounds: refused, not written
        refused = vm.step({**knobs, "dirty_writeback_centisecs": 0}).extra
        assert "dirty_writeback_centisecs" in refused["refused"]
        assert read(VM / "dirty_writeback_centisecs") == vm_guard["dirty_writeback_centisecs"]
    finally:
        vm.close()
    assert read(VM / "dirty_expire_centisecs") == str(expire)
    assert ledger_entries(tmp_path) == []
    with pytest.raises(ValueError, match="dirty_writeback_centisecs"):
        LinuxVM(apply={"dirty_writeback_centisecs": [0, 100]}, state_dir=tmp_path)


def test_dirty_ratio_restores_the_bytes_form_when_that_was_in_use(
        tmp_path: Path, vm_guard: dict) -> None:
    limit = str(256 << 20)
    write(VM / "dirty_bytes", limit)  # the system uses dirty_bytes; dirty_ratio reads 0
    try:
        vm = LinuxVM(measure_seconds=0, state_dir=tmp_path, apply={"dirty_ratio": [5, 40]})
        assert vm.default_knobs(None)["dirty_ratio"] == 0
        vm.step(vm.default_knobs(None))  # the default (0 = bytes form) writes nothing
        assert read(VM / "dirty_bytes") == limit
        vm.step({"dirty_ratio": 15})
        assert (read(VM / "dirty_ratio"), read(VM / "dirty_bytes")) == ("15", "0")
        [entry] = ledger_entries(tmp_path)
        assert entry["alt_original"] == limit
        vm.close()
        assert (read(VM / "dirty_ratio"), read(VM / "dirty_bytes")) == ("0", limit)
    finally:
        if vm_guard["dirty_bytes"] == "0":
            write(VM / "dirty_ratio", vm_guard["dirty_ratio"])
        else:
            write(VM / "dirty_bytes", vm_guard["dirty_bytes"])


def test_scheduler_switch_is_restored_with_the_nr_requests_it_reset(
        loop: str, queue: Path, tmp_path: Path) -> None:
    before = {n: read(queue / n) for n in ("scheduler", "nr_requests")}
    start = current_scheduler(loop)
    other = "mq-deadline" if start != "mq-deadline" else "none"
    sub = block(loop, tmp_path, apply={"scheduler": [other], "nr_requests": [4, 2048]})
    assert sub.knobs["scheduler"].choices == (other,)
    sub.step({"nr_requests": 64})
    assert read(queue / "nr_requests") == "64"
    sample = sub.step({"nr_requests": 64, "scheduler": other})  # resets nr_requests
    assert current_scheduler(loop) == other and sample.extra == {}
    sample = sub.step({"nr_requests": 64, "scheduler": other})
    assert "foreign" not in sample.extra  # mlfs's own coupled change is not foreign
    sub.close()
    assert {n: read(queue / n) for n in ("scheduler", "nr_requests")} == before


# ---- crashes ---------------------------------------------------------------------------------
def test_crash_is_repaired_by_the_next_construction(loop: str, queue: Path,
                                                    tmp_path: Path) -> None:
    before = {n: read(queue / n) for n in ("read_ahead_kb", "scheduler", "nr_requests")}
    start = current_scheduler(loop)
    other = "mq-deadline" if start != "mq-deadline" else "none"
    apply = {"read_ahead_kb": [16, 4096], "scheduler": [other], "nr_requests": [4, 2048]}
    crashed = block(loop, tmp_path, apply=apply)
    crashed.step({"read_ahead_kb": 1024, "scheduler": other, "nr_requests": 32})
    assert read(queue / "read_ahead_kb") == "1024"
    assert current_scheduler(loop) == other and read(queue / "nr_requests") == "32"
    del crashed  # SIGKILL: no close(), no restore
    gc.collect()
    assert read(queue / "read_ahead_kb") == "1024"
    assert len(ledger_entries(tmp_path)) == 3

    # an observe-only construction repairs it too: recovery does not need `apply`
    again = block(loop, tmp_path)
    assert {n: read(queue / n) for n in before} == before
    assert ledger_entries(tmp_path) == []
    assert again.step(again.default_knobs(None)).extra == {}
    again.close()


def test_a_live_owner_keeps_its_ledger_entries(loop: str, queue: Path,
                                               tmp_path: Path) -> None:
    original = read(queue / "read_ahead_kb")
    owner = block(loop, tmp_path, apply={"read_ahead_kb": [16, 4096]})
    owner.step({"read_ahead_kb": 64})
    bystander = LinuxVM(measure_seconds=0, state_dir=tmp_path)  # same state dir
    assert read(queue / "read_ahead_kb") == "64"
    assert len(ledger_entries(tmp_path)) == 1
    bystander.close()
    owner.close()
    assert read(queue / "read_ahead_kb") == original


def test_sigkilled_process_is_repaired_by_the_next_one(loop: str, queue: Path,
                                                       tmp_path: Path) -> None:
    original = read(queue / "read_ahead_kb")
    script = (
        "import os, signal\n"
        "from mlfs.backends.linux.block import LinuxBlock\n"
        f"sub = LinuxBlock({loop!r}, measure_seconds=0, state_dir={str(tmp_path)!r},\n"
        "                 apply={'read_ahead_kb': [16, 4096]})\n"
        "sub.step({'read_ahead_kb': 2048})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert read(queue / "read_ahead_kb") == "2048"
    [entry] = ledger_entries(tmp_path)
    assert entry["owner"]["pid"] != os.getpid()
    sub = block(loop, tmp_path)
    assert read(queue / "read_ahead_kb") == original
    assert ledger_entries(tmp_path) == []
    sub.close()


# ---- someone else's change ------------------------------------------------------------------
def test_foreign_change_is_left_alone_and_the_knob_no_longer_touched(
        loop: str, queue: Path, tmp_path: Path, writes: list) -> None:
    sub = block(loop, tmp_path, apply={"read_ahead_kb": [16, 4096]})
    sub.step({"read_ahead_kb": 512})
    write(queue / "read_ahead_kb", "256")  # the administrator steps in
    sample = sub.step({"read_ahead_kb": 512})
    assert "behind mlfs's back" in sample.extra["foreign"]["read_ahead_kb"]
    assert ledger_entries(tmp_path) == []
    count = len(writes)
    for value in (512, 1024, 16):
        sample = sub.step({"read_ahead_kb": value})
        assert "foreign" not in sample.extra  # reported once
    assert len(writes) == count and read(queue / "read_ahead_kb") == "256"
    knob = sub.knobs["read_ahead_kb"]
    assert knob.min == knob.max == knob.default == 256  # shown as no longer applicable
    assert sub.default_knobs(None)["read_ahead_kb"] == 256
    sub.release(["read_ahead_kb"])
    sub.close()
    assert read(queue / "read_ahead_kb") == "256"  # the other party owns it now


def test_foreign_change_during_a_crash_is_left_alone(loop: str, queue: Path,
                                                     tmp_path: Path) -> None:
    crashed = block(loop, tmp_path, apply={"read_ahead_kb": [16, 4096]})
    crashed.step({"read_ahead_kb": 512})
    del crashed
    gc.collect()
    write(queue / "read_ahead_kb", "64")
    sub = block(loop, tmp_path, apply={"read_ahead_kb": [16, 4096]})
    assert read(queue / "read_ahead_kb") == "64"
    assert ledger_entries(tmp_path) == []
    sample = sub.step({"read_ahead_kb": 128})
    assert "never wrote" in sample.extra["foreign"]["read_ahead_kb"]
    assert read(queue / "read_ahead_kb") == "64"
    sub.close()


# ---- refusals ----------------------------------------------------------------------------
def test_kernel_refusal_is_reported_once_per_value_and_not_retried(
        loop: str, queue: Path, tmp_path: Path, writes: list) -> None:
    if current_scheduler(loop) != "none":
        pytest.skip("expects a loop device on scheduler none (queue depth 128)")
    original = read(queue / "nr_requests")
    path = str(queue / "nr_requests")
    sub = block(loop, tmp_path, apply={"nr_requests": [4, 2048]})
    sample = sub.step({"nr_requests": 2048})  # deeper than the tag set: EINVAL
    assert "refused" in sample.extra["refused"]["nr_requests"]
    assert "Invalid argument" in sample.extra["refused"]["nr_requests"]
    assert ledger_entries(tmp_path) == []  # nothing changed, nothing to restore
    for _ in range(20):
        assert "refused" not in sub.step({"nr_requests": 2048}).extra
    assert [w for w in writes if w[0] == path] == [(path, "2048")]  # no tight retry
    sample = sub.step({"nr_requests": 1000})  # another refused value: reported
    assert "nr_requests" in sample.extra["refused"]
    assert sub.step({"nr_requests": 64}).extra == {}
    assert read(queue / "nr_requests") == "64"
    sub.close()
    assert read(queue / "nr_requests") == original
