"""`mlfs reports` and `mlfs fleet reports`: the kernel's crash and error reports, listed.

On one host the reports are the files of MOUNT/<subsystem>/reports/ (one per
signature, kept by the `linux.kmsg` backend).  Across a fleet they are merged from the
shipped kernel-log rows of every host (`kind=records` of the store): one line per
signature with the hosts it hit, the kernel releases, first and last seen, how often,
and one example, ordered as syzbot's dashboard orders bugs, most hosts first.  What the
store holds was masked on the host before it shipped (mlfs.kmsg.private_masked,
an allow-list).
"""

from __future__ import annotations

import html
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from mlfs.kmsg import REPORTED_KINDS, Report, Reports, printable

KERNEL_LOG_SUBSYSTEM = "linux.kmsg"


#: a fleet's dashboard keeps this many reports per class (a host keeps `BUDGETS`)
FLEET_BUDGETS = {"kernel": 8192, "user": 2048}


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat()


def _listed(report: Report, hosts: list[str], releases: list[str], example: str) -> dict:
    """One dashboard line of `report` (a `mlfs.kmsg.Report`, the one report type)."""
    return {"id": report.id, "kind": report.kind, "title": report.title,
            "count": report.count, "hosts": len(hosts), "host_ids": hosts,
            "releases": releases, "first_seen": _iso(report.first_seen),
            "last_seen": _iso(report.last_seen), "guilty_file": report.guilty_file,
            "example": example, "block": list(report.block)}


def local_reports(mountpoint: Path, subsystem: str = KERNEL_LOG_SUBSYSTEM) -> list[dict]:
    """The reports a mount serves, read through `Report.from_text` (the writer's own
    format), one line each."""
    directory = Path(mountpoint) / subsystem / "reports"
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no reports (is {subsystem} served there?)")
    out = []
    for path in sorted(directory.iterdir()):
        report = Report.from_text(path.name, path.read_text())
        out.append(_listed(report, [report.host], [report.release],
                           report.block[0] if report.block else ""))
    return out


def fleet_reports(url: str, subsystem: str = KERNEL_LOG_SUBSYSTEM) -> list[dict]:
    """Reports over every host's shipped kernel-log rows, merged by the host's own rule.

    Each occurrence (a block's records, in order) goes through `mlfs.kmsg.Reports.seen`
    as on a host: the same signature, or a similar block of the same kind, is one report;
    the hosts and kernel releases it hit are counted beside it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mlfs.fleet.manifest import consistent, objects
    from mlfs.fleet.store import Store

    store = Store(url)
    wanted = ["host_id", "kernel_release", "kind", "signature", "message", "ts", "seq",
              "block"]
    tables = []
    for path in consistent(store, objects(store, subsystem, "records")):
        with store.open(path) as fh:
            table = pq.read_table(fh)
        if not set(wanted) <= set(table.column_names):
            continue
        tables.append(table.select(wanted).filter(pc.is_valid(table.column("block"))))
    if not tables:
        return []
    rows = pa.concat_tables(tables, promote_options="permissive").to_pylist()
    blocks: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        blocks.setdefault((row["host_id"], row["block"]), []).append(row)
    occurrences = []
    for records in blocks.values():
        records.sort(key=lambda r: r["seq"])
        first = records[0]
        if first["seq"] == first["block"] and first["kind"] in REPORTED_KINDS:
            occurrences.append(records)
    occurrences.sort(key=lambda records: records[0]["ts"])
    merged = Reports("", "", FLEET_BUDGETS)
    hosts: dict[str, set[str]] = {}
    releases: dict[str, set[str]] = {}
    examples: dict[str, str] = {}
    for records in occurrences:
        first = records[0]
        report, _ = merged.seen(first["kind"], first["signature"],
                                [r["message"] for r in records], first["ts"].timestamp())
        if report is None:
            continue
        hosts.setdefault(report.id, set()).add(first["host_id"])
        releases.setdefault(report.id, set()).add(first["kernel_release"])
        examples.setdefault(report.id, first["message"])
    out = [_listed(r, sorted(hosts[r.id]), sorted(releases[r.id]), examples[r.id])
           for r in merged.by_id.values() if r.id in hosts]
    return sorted(out, key=lambda r: (-r["hosts"], -r["count"], r["title"]))


def render_text(reports: list[dict]) -> str:
    """One line per report, control characters escaped as dmesg escapes them: a title is
    the kernel's text, which any user's command name reaches (red team K2: an ESC
    sequence in a segfaulting comm set the terminal's title and cleared its screen)."""
    if not reports:
        return "no reports\n"
    lines = [f"{'hosts':>5} {'count':>6}  {'kind':<12} title"]
    for r in reports:
        lines.append(f"{r['hosts']:>5} {r['count']:>6}  {printable(str(r['kind'])):<12} "
                     f"{printable(str(r['title']))}")
    return "\n".join(lines) + "\n"


def _html(value: object) -> str:
    return html.escape(printable(str(value)))


def render_html(reports: list[dict], heading: str) -> str:
    rows = "".join(
        f"<tr><td>{r['hosts']}</td><td>{r['count']}</td><td>{_html(r['kind'])}</td>"
        f"<td>{_html(r['title'])}</td><td>{_html(r.get('first_seen', ''))}"
        f"</td><td>{_html(r.get('last_seen', ''))}</td>"
        f"<td><code>{_html(r.get('example', ''))}</code></td></tr>"
        for r in reports)
    return (f"<!doctype html><meta charset=utf-8><title>{html.escape(heading)}</title>"
            f"<h1>{html.escape(heading)}</h1><table border=1 cellpadding=4><tr><th>hosts</th>"
            "<th>count</th><th>kind</th><th>title</th><th>first seen</th><th>last seen</th>"
            f"<th>example</th></tr>{rows}</table>\n")


def main(reports: list[dict], fmt: str, heading: str) -> int:
    if fmt == "json":  # JSON escapes control characters itself (\u001b)
        json.dump(reports, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif fmt == "html":
        sys.stdout.write(render_html(reports, heading))
    else:
        sys.stdout.write(render_text(reports))
    return 0
