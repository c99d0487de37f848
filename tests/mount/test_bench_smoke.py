"""`mlfs bench --quick --json --json-out F` runs end to end and writes a well-formed report.

This checks the report's shape, never its speed: the machine running CI is as
shared and noisy as the one the bench was written on, so a speed assertion
would only test the neighbours.  Every row must be there, every figure finite,
every ratio positive, the Markdown table written next to the JSON, and the
bench must leave no mount and no temporary directory behind.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, fuse_unavailable

ROWS = (
    "read_first", "read_repeat", "query_polars", "query_duckdb", "control_write",
    "event_wakeup", "concurrency", "footprint_cpu", "footprint_rss", "ingest",
    "records_ingest", "bio_capture",
)
#: rows that may be skipped, each with its reason: an optional query engine, and the
#: capture where root, fio or the BPF toolchain is missing
MAY_SKIP = ("query_polars", "query_duckdb", "bio_capture")
SUMMARY_KEYS = ("median", "min", "max", "q1", "q3")


def _check_summary(where: str, summary: dict[str, Any]) -> None:
    for key in SUMMARY_KEYS:
        assert math.isfinite(summary[key]), f"{where}.{key} = {summary[key]!r}"
    assert summary["n"] >= 1 and len(summary["values"]) == summary["n"], where
    assert all(math.isfinite(v) for v in summary["values"]), where
    assert summary["min"] <= summary["median"] <= summary["max"], where


def _mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    done = subprocess.run([sys.executable, "-m", "mlfs", "bench", "--quick", "--json",
                           "--json-out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    written = json.loads(out.read_text())
    assert json.loads(done.stdout) == written, "--json prints on stdout what --json-out wrote"
    return written, out


def test_every_row_is_present_with_finite_figures_and_positive_ratios(report):
    data, _ = report
    rows = {row["key"]: row for row in data["rows"]}
    assert set(ROWS) <= set(rows), f"missing rows: {set(ROWS) - set(rows)}"
    for key, row in rows.items():
        assert row["what"] and row["target"], key
        if row["skipped"]:
            assert key in MAY_SKIP, f"{key} skipped: {row['skipped']}"
            continue
        assert row["measured"], key
        for name, summary in row["measured"].items():
            _check_summary(f"{key}.measured[{name}]", summary)
        for name, summary in (row["reference"] or {}).items():
            _check_summary(f"{key}.reference[{name}]", summary)
            assert summary["min"] > 0, f"{key}: a reference of zero"
        if row["ratio"] is not None:
            _check_summary(f"{key}.ratio", row["ratio"])
            assert row["ratio"]["min"] > 0, f"{key}: ratio not positive"
        assert row["met"] in (True, False, None), key


def test_rows_with_a_reference_have_a_ratio_and_targets_are_judged(report):
    data, _ = report
    rows = {row["key"]: row for row in data["rows"]}
    for key in ("read_first", "read_repeat", "control_write", "ingest", "records_ingest"):
        assert rows[key]["reference"] and rows[key]["ratio"], key
    for key in ROWS:
        if not rows[key]["skipped"]:
            assert isinstance(rows[key]["met"], bool), f"{key}: target not judged"
    assert rows["control_write"]["measured"].keys() >= {"p50 ms", "p99 ms"}
    assert rows["event_wakeup"]["measured"].keys() >= {"p50 ms", "p99 ms"}


def test_concurrency_had_no_error_no_lost_event_and_no_wedge(report):
    data, _ = report
    row = next(r for r in data["rows"] if r["key"] == "concurrency")
    assert row["extra"]["errors"] == []
    assert row["extra"]["lost"] == 0
    assert row["extra"]["wedged"] is False
    assert row["met"] is True


def test_markdown_table_is_written_next_to_the_json(report):
    data, out = report
    table = out.with_suffix(".md").read_text()
    assert "| what | measured | reference (same run) | ratio | target | met |" in table
    assert data["command"] in table and data["date"] in table
    for row in data["rows"]:
        assert row["what"] in table


def test_the_bench_leaves_no_mount_and_no_temporary_directory(report):
    data, _ = report
    workdir = data["workdir"]
    assert not os.path.exists(workdir), f"{workdir} was not removed"
    assert workdir not in _mounts(), f"a mount under {workdir} is still there"


def test_the_capture_row_runs_or_says_why_not(report):
    data, _ = report
    from mlfs.bench.capture import unavailable

    row = next(r for r in data["rows"] if r["key"] == "bio_capture")
    why = unavailable()
    if why:
        assert row["skipped"] == why
        return
    assert not row["skipped"], "the capture can run here, so it must have"
    runs = row["extra"]["runs"]
    assert [r["capture"] for r in runs] == [False, True] * (len(runs) // 2), "interleaved"
    for run in (r for r in runs if r["capture"]):
        assert run["total_ios"] > 0 and run["requests"] > 0
        assert run["records"] > 0.9 * run["requests"], run
    assert row["measured"].keys() >= {"records", "device requests", "fio total_ios", "lost",
                                      "cores per 100k ev/s"}
    assert row["reference"].keys() == {"IOPS off"}

