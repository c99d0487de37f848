"""The glue between fio's own reports and an objective (tests/bench/fio_phases.py).

Real fio on a temporary directory: what the experiment writes to a
subsystem's ``objective`` must be the application's jobs' throughput, with
the background (``bg-*``) load left out.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.bench.fio_phases import WORKLOADS, FioStream
from tests.bench.win_harness import wait_for

pytestmark = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")

JOB = """
[global]
directory=${DIR}
time_based
runtime=${RUNTIME}

[app]
rw=write
bs=64k
size=8M
rate=4m

[bg-load]
rw=write
bs=64k
size=8M
rate=16m
"""


def test_stream_reports_the_application_jobs_rate_each_second_without_background_load(
        tmp_path: Path) -> None:
    job = tmp_path / "phase.fio"
    job.write_text(JOB)
    rates: list[float] = []
    summary = FioStream(job, tmp_path, 3, rates.append).wait(timeout=60)
    assert len(rates) >= 2  # one per status interval after the first report
    # fio's rate limit is 4 MiB/s for the app, 16 for the load: only the app counts
    assert all(0 < r < 8 for r in rates[:-1]), rates
    assert 2 < summary["mib_per_s"] < 6
    assert summary["jobs"]["bg-load"]["mib_per_s"] > 10
    assert summary["bytes"] < summary["jobs"]["bg-load"]["mib_per_s"] * (1 << 20) * 3


def test_a_rate_over_several_reports_starts_at_the_first_report_and_keeps_the_jobs_rate(
        tmp_path: Path) -> None:
    # the first report is taken against fio's start, so a phase's own figure
    # replaces the previous phase's after one report, not two; over three
    # reports the app's 4 MiB/s limit still reads as 4, the load still not at all
    job = tmp_path / "phase.fio"
    job.write_text(JOB)
    per_report: list[float] = []
    FioStream(job, tmp_path, 5, per_report.append, rate_seconds=3).wait(timeout=60)
    assert len(per_report) >= 5, per_report
    assert all(1 < r < 6 for r in per_report[1:-1]), per_report
    assert 0 < per_report[0] < 6  # fio's start-up (file layout) is in the first one


def children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1]
                                            .split()[1]) == pid:
                out.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return out


def test_a_stream_cut_short_ends_fio_and_its_job_processes(tmp_path: Path) -> None:
    """On a timeout (an interrupt takes the same path) no fio process is left
    holding the directory: the benchmark's file system can then be unmounted."""
    job = tmp_path / "phase.fio"
    job.write_text(JOB)
    stream = FioStream(job, tmp_path, 60)
    assert wait_for(lambda: len(children(stream.proc.pid)) >= 2, 10.0)  # app and bg-load
    jobs = children(stream.proc.pid)
    with pytest.raises(RuntimeError, match="ran past"):
        stream.wait(timeout=0.5)
    assert stream.proc.returncode is not None
    assert wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in jobs), 5.0)
    stream.reader.join(5)
    assert not stream.reader.is_alive()  # fio's output closed: nobody holds it


def test_every_checked_in_workload_is_a_job_file_fio_accepts(tmp_path: Path) -> None:
    files = sorted(WORKLOADS.glob("*.fio"))
    assert len(files) >= 3
    env = {**os.environ, "DIR": str(tmp_path), "RUNTIME": "1"}
    for path in files:  # fio's own parser, no I/O
        check = subprocess.run(["fio", "--parse-only", str(path)], env=env,
                               capture_output=True, text=True)
        assert check.returncode == 0, (path.name, check.stderr)


def test_every_measured_buffered_writer_in_the_workloads_flushes_at_a_cadence() -> None:
    # fio counts a buffered write when it reaches the page cache: a measured
    # job that never flushes before its end would be rewarded for parking
    # dirty pages (tests/bench/fio_phases.py), so each flushes every N writes,
    # or deletes its file (scratch space: nothing is owed).  The phases whose
    # per-second rate becomes an objective (tests/bench/fio_win.py's candidates)
    # flush within their candidate's MAX_UNFLUSHED_MIB; a sweep-only phase reports
    # over a whole visit, which ends with its fsync
    from tests.bench.fio_win import MAX_UNFLUSHED_MIB, WIN_KNOBS
    from tests.bench.sweep import CANDIDATES

    per_second = {f"{p}.fio": MAX_UNFLUSHED_MIB[c]
                  for c in WIN_KNOBS for p in CANDIDATES[c]["phases"]}
    writers = []
    for path in sorted(WORKLOADS.glob("*.fio")):
        ini = configparser.ConfigParser(allow_no_value=True, inline_comment_prefixes=(";",),
                                        comment_prefixes=(";", "#"), default_section="global")
        ini.read(path)
        for name in ini.sections():
            job = ini[name]
            if name.startswith("bg-") or "write" not in job.get("rw", "") \
                    or job.get("direct") == "1":
                continue
            writers.append(path.name)
            cadence = int(job.get("fsync", 0)) or int(job.get("fdatasync", 0))
            if job.get("unlink") == "1":
                continue  # scratch: deleted, never needed on the device
            assert 0 < cadence <= per_second.get(path.name, 1024), (path.name, name)
    assert "stream-write.fio" in writers


def _dirty_pages(path: Path) -> tuple[int, int]:
    """(dirty, under writeback) pages of `path` in the page cache: cachestat(2) (Linux
    6.5), which counts one file's pages, where /proc/meminfo's Dirty is the whole
    machine's."""
    import ctypes

    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class Stat(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in
                    ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted",
                     "nr_recently_evicted")]

    libc = ctypes.CDLL(None, use_errno=True)
    got, whole = Stat(), Range(0, 0)  # len 0: to the end of the file
    with path.open("rb") as f:
        if libc.syscall(451, f.fileno(), ctypes.byref(whole), ctypes.byref(got), 0) != 0:
            pytest.skip(f"cachestat: {os.strerror(ctypes.get_errno())}")
    return got.nr_dirty, got.nr_writeback


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="cachestat's number is x86_64's")
def test_a_settled_start_leaves_none_of_the_previous_visits_pages_dirty(
        tmp_path: Path) -> None:
    from tests.bench.fio_phases import settle

    written = tmp_path / "previous-visit"
    with written.open("wb") as f:  # buffered, never flushed: what a writer leaves behind
        for _ in range(32):
            f.write(os.urandom(1 << 20))
    dirty_before, _ = _dirty_pages(written)
    if dirty_before == 0:
        pytest.skip(f"{tmp_path} keeps no dirty pages (a memory file system)")
    settle()
    assert _dirty_pages(written) == (0, 0)


def test_every_candidate_whose_knobs_govern_dirty_pages_starts_its_visits_settled() -> None:
    from tests.bench.fio_win import SETTLED_START, WIN_KNOBS

    governs_dirty = {c for c, knobs in WIN_KNOBS.items()
                     if any(k.startswith("dirty_") for k in knobs)}
    assert governs_dirty == {"writeback", "dirty"}
    assert SETTLED_START == governs_dirty
