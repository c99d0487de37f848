"""`mlfs fleet status`: what the fleet store holds, per host and subsystem.

Everything comes from the store alone (an operator's view needs no access to
the hosts): rows and portions per host and subsystem from the Parquet footers
of the shipped dataset portions, each host's last status record (written by its
pusher after every pass: last push, backlog, losses, models' mode and
efficiency), and the newest published policy of each subsystem with its card.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import pyarrow.parquet as pq

from .layout import POLICIES, STATUS, policy_version
from .manifest import consistent, objects
from .store import Store


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


log = logging.getLogger("mlfs.fleet")


def collect(url: str) -> dict:
    store = Store(url)
    fs = store.fs
    hosts: dict[str, dict] = {}
    for path in fs.glob(store.path(f"{STATUS}/*.json")):
        try:
            record = json.loads(fs.cat_file(path))
            host = record["host_id"]
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.error("%s: status ignored: %s", path, str(exc)[:200])
            continue
        if host != path.rsplit("/", 1)[-1].removesuffix(".json"):
            log.error("%s: status ignored: it names host %r", path, str(host)[:40])
            continue
        hosts[host] = record
    data: dict[str, dict[str, dict]] = {}
    # the trust rule every reader of the store uses: objects a manifest names that are
    # missing, unreadable or hold another host's rows are ignored (and logged)
    for path in consistent(store, objects(store, "*", "dataset")):
        parts = path.split("/")
        subsystem = parts[-4].split("=", 1)[1]
        host = parts[-3].split("=", 1)[1]
        with fs.open(path, "rb") as f:
            rows = pq.ParquetFile(f).metadata.num_rows
        entry = data.setdefault(subsystem, {}).setdefault(host, {"rows": 0, "portions": 0})
        entry["rows"] += rows
        entry["portions"] += 1
    policies: dict[str, dict] = {}
    for folder in fs.glob(store.path(f"{POLICIES}/*")):
        versions = [policy_version(_name(p)) for p in fs.ls(folder, detail=False)]
        cards = sorted(v for v, suffix in filter(None, versions) if suffix == "json")
        if cards:
            card = json.loads(fs.cat_file(f"{folder}/{cards[-1]:010d}.json"))
            policies[_name(folder)] = {
                "version": card.get("version"), "rows": card.get("rows"),
                "hosts": len(card.get("hosts", {})), "created": card.get("created"),
                "validation_mae": card.get("validation", {}).get("mae")}
    return {"store": url, "hosts": hosts, "subsystems": data, "policies": policies}


def render(status: dict) -> str:
    now = time.time()
    lines = [f"fleet store {status['store']}: {len(status['hosts'])} hosts reporting"]
    lines.append(f"{'host':<20} {'last push':>10} {'backlog':>8} {'lost':>6}  state")
    for host, record in sorted(status["hosts"].items()):
        age = now - record.get("time", 0)
        state = f"failing: {record['error']}" if record.get("failing") else "ok"
        lines.append(f"{host:<20} {age:>9.0f}s {record.get('backlog', 0):>8} "
                     f"{record.get('lost', 0):>6}  {state}")
    for subsystem, per_host in sorted(status["subsystems"].items()):
        policy = status["policies"].get(subsystem)
        mae = policy and policy["validation_mae"]
        shown = (f"policy {policy['version']} ({policy['rows']} rows, {policy['hosts']} hosts, "
                 f"held-out-host MAE {'n/a' if mae is None else f'{mae:.4g}'})"
                 if policy else "no policy")
        lines.append(f"{subsystem}: {sum(h['rows'] for h in per_host.values())} rows from "
                     f"{len(per_host)} hosts; {shown}")
        for host, entry in sorted(per_host.items()):
            models = status["hosts"].get(host, {}).get("models", {}).get(subsystem, {})
            shown_models = ", ".join(f"{m} {v['mode']} {v['efficiency']}"
                                     for m, v in sorted(models.items())) or "no model"
            lines.append(f"  {host:<20} {entry['rows']:>9} rows {entry['portions']:>6} portions"
                         f"  {shown_models}")
    return "\n".join(lines) + "\n"


def main(url: str, as_json: bool) -> int:
    try:
        status = collect(url)
    except (OSError, ValueError) as exc:
        print(f"mlfs fleet status: {url}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(status, indent=2) + "\n" if as_json else render(status))
    return 0
