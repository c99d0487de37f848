"""The capture row of `mlfs bench` says why it did not run, and never ends the bench."""

from __future__ import annotations

import subprocess

from mlfs.bench import capture
from mlfs.bench.plan import QUICK
from mlfs.client import MountFailed


class _Session:
    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path

    def scratch(self, parent):
        return self.tmp_path

    def mount(self, name, config, state_dir):  # pragma: no cover - never reached here
        raise AssertionError


def test_where_the_capture_cannot_run_the_row_is_skipped_with_the_reason(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(capture, "unavailable", lambda: "needs root (a loop device, BPF)")
    row = capture.bench_capture(_Session(tmp_path), QUICK)
    assert row.key == "bio_capture" and row.skipped == "needs root (a loop device, BPF)"
    assert row.met is None and not row.measured


def test_a_failed_run_becomes_a_skipped_row_with_what_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "unavailable", lambda: None)
    for error in (MountFailed("mlfs mount failed (exit 1): ", "BPF load refused"),
                  subprocess.CalledProcessError(1, ["fio"]), OSError(16, "Device busy")):
        def failing(*args, error=error):
            raise error
        monkeypatch.setattr(capture, "capture_runs", failing)
        row = capture.bench_capture(_Session(tmp_path), QUICK)
        assert row.skipped.startswith("the capture run failed: "), row.skipped
        assert row.met is None


def test_the_summary_judges_every_request_recorded_against_the_device_and_fio():
    runs = [{"capture": False, "iops": 100.0},
            {"capture": True, "iops": 90.0, "iops_ratio": 0.9, "records": 10, "requests": 10,
             "total_ios": 10, "lost": 0, "cpu_share": 0.1},
            {"capture": False, "iops": 100.0},
            {"capture": True, "iops": 80.0, "iops_ratio": 0.8, "records": 9, "requests": 10,
             "total_ios": 10, "lost": 0, "cpu_share": 0.2}]
    figures = capture.summary(runs)
    assert figures["every_request_recorded"] is False
    assert figures["iops_ratio"] == 0.85 and figures["cpu_share_max"] == 0.2
    runs[3]["records"] = 10
    assert capture.summary(runs)["every_request_recorded"] is True
