"""A whole bench run: every measurement in order, then the table, the JSON and the exit status."""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .capture import bench_capture
from .concurrency import bench_concurrency
from .data import write_portion
from .footprint import bench_footprint
from .harness import Session, fuse_unavailable, mount_config, progress, setup_model, tmpfs_dir
from .ingest import bench_ingest
from .latency import bench_control, bench_events
from .plan import BIG, FULL, PORTION, QUICK, MiB, Plan
from .reads import bench_query, bench_reads, duckdb_query, polars_query
from .records import bench_records
from .report import host_info, markdown
from .stats import Row


def run(plan: Plan, command: str) -> dict[str, Any]:
    """Every measurement in order; the mount-free ones last so mounts end early."""
    from .. import __version__

    reason = fuse_unavailable()
    if reason:
        raise RuntimeError(reason)
    started = time.monotonic()
    report: dict[str, Any] = {
        "mlfs_version": __version__,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "quick": plan.quick, "plan": asdict(plan),
        "host": host_info(), "extra": {}, "rows": [],
    }
    rows: list[Row] = report["rows"]
    session = Session()
    report["workdir"] = str(session.root)  # removed at the end; the smoke test checks
    try:
        state = session.root / "state"
        portion = state / BIG / "dataset" / PORTION
        progress(f"writing a {plan.file_mib} MiB portion into the state directory")
        report["extra"]["portion_rows"] = write_portion(portion, plan.file_mib * MiB)
        config = mount_config(3600.0)  # no sealing mid-run: both query sides see the same
        read_rows, mount = bench_reads(session, plan, state, config, report["extra"])
        rows += read_rows
        mounted_dataset = mount.mountpoint / BIG / "dataset"
        rows.append(bench_query("Polars", polars_query, mounted_dataset, portion.parent,
                                plan.query_reps))
        rows.append(bench_query("DuckDB", duckdb_query, mounted_dataset, portion.parent,
                                plan.query_reps))
        model = setup_model(mount.mountpoint)
        rows.append(bench_control(session, model, plan))
        rows.append(bench_events(session, mount.mountpoint, model, plan))
        progress(f"concurrency: {plan.concurrency_seconds:g} s")
        rows.append(bench_concurrency(mount, model, plan))
        report["extra"]["daemon_after_run"] = (mount.memory_kb() if mount.alive() else {})
        mount.stop()
        rows += bench_footprint(session, plan)
        shm = tmpfs_dir()
        if shm is not None:  # where the control-write time goes: the journal's fsync?
            diag = session.mount("tmpfs-state", config, session.scratch(shm))
            rows.append(bench_control(
                session, setup_model(diag.mountpoint), plan, "control_write_tmpfs_state",
                "control write round trip, state dir on tmpfs (no disk fsync)", judged=False))
            diag.stop()
        rows.append(bench_capture(session, plan))
        rows.append(bench_ingest(session.root, plan))
        rows.append(bench_records(session.root, plan))
    finally:
        session.close()
    report["rows"] = [asdict(r) for r in rows]
    report["seconds"] = round(time.monotonic() - started, 1)
    report["host"]["loadavg_end"] = os.getloadavg()
    return report


def main(quick: bool = False, json_path: str | None = None, as_json: bool = False) -> int:
    """`mlfs bench [--quick] [--json] [--json-out FILE]` (parsed by mlfs.cli.bench): run,
    print the table (`as_json`: the report as JSON instead), write the JSON and the .md
    beside it to `json_path`; 1 when the concurrency run failed."""
    plan = QUICK if quick else FULL

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the cleanup: mounts ended, files removed

    signal.signal(signal.SIGTERM, on_sigterm)
    command = "mlfs bench" + (" --quick" if quick else "") + (" --json" if as_json else "") + (
        f" --json-out {json_path}" if json_path else "")
    try:
        report = run(plan, command)
    except KeyboardInterrupt:
        print("mlfs bench: interrupted (mounts ended, temporary files removed)", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"mlfs bench: {exc}", file=sys.stderr)
        return 1
    table = markdown(report)
    print(json.dumps(report, indent=2, default=str) if as_json else table)
    if json_path:
        path = Path(json_path)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        path.with_suffix(".md").write_text(table)
        progress(f"wrote {path} and {path.with_suffix('.md')}")
    concurrency = next((r for r in report["rows"] if r["key"] == "concurrency"), None)
    if concurrency is not None and concurrency["met"] is False:
        print("mlfs bench: the concurrency run failed (errors, lost events or a wedge)",
              file=sys.stderr)
        return 1
    return 0
