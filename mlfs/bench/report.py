"""The report: the markdown table and what is recorded about the host."""

from __future__ import annotations

import contextlib
import math
import os
import platform
from pathlib import Path
from typing import Any


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _cell(figures: dict[str, dict[str, Any]] | None) -> str:
    if not figures:
        return "—"
    return "<br>".join(f"{name} {_fmt(s['median'])} [{_fmt(s['min'])}–{_fmt(s['max'])}]"
                       for name, s in figures.items())


def markdown(report: dict[str, Any]) -> str:
    """The table users read: median [min–max] of repetitions, ratio, target, met."""
    host = report["host"]
    lines = [
        f"# mlfs bench — {report['date']}",
        "",
        f"Command: `{report['command']}`  ",
        f"Host: Linux {host['kernel']}, {host['cpus']} CPUs, {host['memory_gb']:.0f} GB RAM, "
        f"Python {host['python']}, mlfs {report['mlfs_version']}"
        f"{' (quick run)' if report['quick'] else ''}; load average "
        f"{host['loadavg_start'][0]:.1f} at the start, {host['loadavg_end'][0]:.1f} at the end "
        f"({report['seconds']:.0f} s)  ",
        "Figures: median [min–max] over repetitions. Ratio: speed through mlfs / speed of "
        "the same-run reference (1.0 = as fast; for times, reference time / mlfs time).",
        "",
        "| what | measured | reference (same run) | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        if row["skipped"]:
            lines.append(f"| {row['what']} | skipped: {row['skipped']} | | | {row['target']} "
                         "| — |")
            continue
        ratio = row["ratio"]
        ratio_text = (f"{ratio['median']:.3g}× [{ratio['min']:.3g}–{ratio['max']:.3g}]"
                      if ratio else "—")
        met = {True: "yes", False: "**no**", None: "—"}[row["met"]]
        lines.append(f"| {row['what']} | {_cell(row['measured'])} | {_cell(row['reference'])} "
                     f"| {ratio_text} | {row['target']} | {met} |")
    lines += ["", "Notes:", ""]
    lines += [f"- **{row['key']}**: {row['note']}" for row in report["rows"] if row["note"]]
    return "\n".join(lines) + "\n"


def host_info() -> dict[str, Any]:
    memory = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    versions = {}
    for name in ("pyfuse3", "trio", "pyarrow", "polars", "duckdb"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:
            versions[name] = None
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "memory_gb": memory,
            "python": platform.python_version(), "versions": versions,
            "loadavg_start": os.getloadavg()}
