"""Per-request features (linux.bio's BPF ring capture) as linux.block features, on a real
loop device.

No mount: the backend is driven directly, as the proxy drives it, while real
reads (O_DIRECT, so the page cache does not absorb them) hit the loop device.
Needs root, clang, bpftool and libbpf; CI installs them and runs as root.
"""

from __future__ import annotations

import math
import mmap
import os
import random
import signal
from pathlib import Path

import pytest
from mlfs.backends import blktrace
from mlfs.backends.linux.block import LinuxBlock
from mlfs.backends.linux.files import UnavailableError

from tests.harness import wait_for

pytestmark = pytest.mark.skipif(blktrace.tracer_unavailable() is not None,
                                reason=f"block tracepoints: {blktrace.tracer_unavailable()}")

CHUNK = 64 * 1024


def direct_reads(device: str, offsets: list[int], size: int = CHUNK) -> None:
    """Read `size` bytes at each offset, bypassing the page cache."""
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
    fd = os.open(f"/dev/{device}", os.O_RDONLY | os.O_DIRECT)
    try:
        for offset in offsets:
            assert os.preadv(fd, [buf], offset) == size
    finally:
        os.close(fd)
        buf.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def traced(loop: str, tmp_path: Path):
    sub = LinuxBlock(loop, measure_seconds=0, state_dir=tmp_path, tracepoints=True)
    try:
        yield sub
    finally:
        sub.close()


def settle(traced: LinuxBlock, requests: int) -> None:
    """Wait until the capture handed over `requests` read requests in all (the loader
    flushes its ring at least every 100 ms; the backend's next snapshot sees them)."""
    wait_for(lambda: (traced.tracer.totals() or {}).get("requests", 0) >= requests,
             what=f"{requests} read requests captured")


def test_trace_features_tell_a_sequential_stream_from_random_reads(traced: LinuxBlock,
                                                                   loop: str) -> None:
    assert set(blktrace.TRACE_FEATURES) <= set(traced.features)
    assert "traced" in traced.description
    size = 64 << 20
    traced.step(traced.default_knobs(None))
    before = traced.tracer.totals()["requests"]
    direct_reads(loop, list(range(0, 32 << 20, CHUNK)))  # 512 requests, front to back
    settle(traced, before + 512)
    seq = traced.step(traced.default_knobs(None)).features
    rng = random.Random(7)
    direct_reads(loop, [rng.randrange(size // CHUNK) * CHUNK for _ in range(400)])
    settle(traced, before + 912)
    rnd = traced.step(traced.default_knobs(None)).features
    for features in (seq, rnd):
        assert list(features) == list(traced.features)
        assert all(math.isfinite(v) for v in features.values())
        assert features["trace_reads_per_s"] > 0
        assert features["trace_read_kb"] == pytest.approx(CHUNK / 1024, rel=0.05)
        assert features["trace_await_us"] > 0
        assert 0 <= features["trace_slow_share"] <= 1
    assert seq["trace_seq_share"] > 0.9
    assert rnd["trace_seq_share"] < 0.2
    assert seq["trace_run_kb"] > 2048  # one 32 MiB run (a few, if ext4 or a wrap cut it)
    assert rnd["trace_run_kb"] < 2 * CHUNK / 1024
    # the same requests, counted by the stat counters, agree on the number
    assert seq["trace_reads_per_s"] == pytest.approx(seq["reads_per_s"], rel=0.2)


def test_close_ends_the_capture_by_its_pid(loop: str, tmp_path: Path) -> None:
    sub = LinuxBlock(loop, measure_seconds=0, state_dir=tmp_path, tracepoints=True)
    pid = sub.tracer.pid
    assert alive(pid)
    sub.close()
    assert not alive(pid)


def test_a_dead_tracer_gives_missing_values_not_a_dead_subsystem(traced: LinuxBlock,
                                                                 loop: str) -> None:
    traced.step(traced.default_knobs(None))
    os.kill(traced.tracer.pid, signal.SIGKILL)
    wait_for(lambda: traced.tracer.totals() is None, what="the capture's end seen")
    assert traced.tracer.error and "ended" in traced.tracer.error
    direct_reads(loop, [0, CHUNK])
    sample = traced.step(traced.default_knobs(None))
    assert all(math.isnan(sample.features[n]) for n in blktrace.TRACE_FEATURES)
    assert sample.features["reads_per_s"] > 0  # the stat counters go on


def test_tracepoints_true_refuses_to_start_without_the_capture_tools(loop: str,
                                                                     tmp_path: Path,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UnavailableError, match="clang, bpftool, cc missing"):
        LinuxBlock(loop, measure_seconds=0, state_dir=tmp_path, tracepoints=True)
    auto = LinuxBlock(loop, measure_seconds=0, state_dir=tmp_path, tracepoints="auto")
    try:
        assert auto.tracer is None
        assert not set(blktrace.TRACE_FEATURES) & set(auto.features)
    finally:
        auto.close()
    with pytest.raises(ValueError, match="tracepoints must be"):
        LinuxBlock(loop, measure_seconds=0, state_dir=tmp_path, tracepoints="yes")
