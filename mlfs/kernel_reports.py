"""`mlfs reports` and `mlfs fleet reports`: the kernel's crash and error reports, listed.

On one host the reports are the files of MOUNT/<subsystem>/reports/ (one per
signature, kept by the `linux.kmsg` backend).  Across a fleet they are merged from the
shipped kernel-log rows of every host (`kind=records` of the store): one line per
signature with the hosts it hit, the kernel releases, first and last seen, how often,
and one example, ordered as syzbot's dashboard orders bugs, most hosts first.  What the
store holds was masked on the host before it shipped (mlfs.kernel_log.private_masked,
an allow-list).
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

from .kernel_log import REPORTED_KINDS, printable, signature_id

KERNEL_LOG_SUBSYSTEM = "linux.kmsg"


def local_reports(mountpoint: Path, subsystem: str = KERNEL_LOG_SUBSYSTEM) -> list[dict]:
    """The reports a mount serves, each as a dict (its header fields and its block)."""
    directory = Path(mountpoint) / subsystem / "reports"
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no reports (is {subsystem} served there?)")
    out = []
    for path in sorted(directory.iterdir()):
        text = path.read_text()
        head, _, block = text.partition("\n\n")
        item: dict = {"id": path.name}
        for line in head.splitlines():
            key, _, value = line.partition(": ")
            item[key] = int(value) if key == "count" and value.isdigit() else value
        item["hosts"] = 1
        item["example"] = block.splitlines()[0] if block else ""
        item["block"] = block.splitlines()
        out.append(item)
    return sorted(out, key=lambda r: (-r.get("count", 0), r.get("title", "")))


def fleet_reports(url: str, subsystem: str = KERNEL_LOG_SUBSYSTEM) -> list[dict]:
    """Reports merged by signature over every host's shipped kernel-log rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from .fleet.manifest import consistent, objects
    from .fleet.store import Store

    store = Store(url)
    wanted = ["host_id", "kernel_release", "kind", "signature", "message", "ts", "seq",
              "block"]
    tables = []
    for path in consistent(store, objects(store, subsystem, "records")):
        with store.open(path) as fh:
            table = pq.read_table(fh)
        if not set(wanted) <= set(table.column_names):
            continue
        table = table.select(wanted)
        # one occurrence per report: a block's first record, or a one-record report
        table = table.filter(pc.and_(pc.is_in(table.column("kind"),
                                              pa.array(sorted(REPORTED_KINDS))),
                                     pc.equal(table.column("seq"), table.column("block"))))
        tables.append(table)
    if not tables:
        return []
    rows = pa.concat_tables(tables, promote_options="permissive")
    merged: dict[tuple[str, str], dict] = {}
    for row in rows.to_pylist():
        key = (row["kind"], row["signature"])
        item = merged.get(key)
        if item is None:
            item = merged[key] = {"id": signature_id(*key), "kind": key[0], "title": key[1],
                                  "count": 0, "hosts": set(), "releases": set(),
                                  "first_seen": row["ts"], "last_seen": row["ts"],
                                  "example": row["message"]}
        item["count"] += 1
        item["hosts"].add(row["host_id"])
        item["releases"].add(row["kernel_release"])
        if row["ts"] < item["first_seen"]:
            item["first_seen"], item["example"] = row["ts"], row["message"]
        item["last_seen"] = max(item["last_seen"], row["ts"])
    out = []
    for item in merged.values():
        item["host_ids"] = sorted(item.pop("hosts"))
        item["hosts"] = len(item["host_ids"])
        item["releases"] = sorted(item["releases"])
        item["first_seen"] = item["first_seen"].isoformat()
        item["last_seen"] = item["last_seen"].isoformat()
        out.append(item)
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
