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

from .layout import MAX_DOCUMENT_BYTES, POLICIES, STATUS, policy_path, policy_version
from .manifest import consistent, objects
from .store import Store

log = logging.getLogger("mlfs.fleet")


def published_cards(store: Store) -> dict[str, list[int]]:
    """subsystem -> the versions that have a card in `policies/<S>/`, oldest first (one
    listing of the store's policies)."""
    out: dict[str, list[int]] = {}
    for key in store.list(f"{POLICIES}/"):
        parts = key.split("/")
        found = policy_version(parts[-1]) if len(parts) == 3 else None
        if found and found[1] == "json":
            out.setdefault(parts[1], []).append(found[0])
    return {s: sorted(v) for s, v in out.items()}


def collect(url: str) -> dict:
    store = Store(url)
    hosts: dict[str, dict] = {}
    for path in store.list(f"{STATUS}/"):
        if path.count("/") != 1 or not path.endswith(".json"):
            continue
        try:
            record = json.loads(store.get(path, MAX_DOCUMENT_BYTES))
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
        try:
            with store.open(path) as f:
                rows = pq.ParquetFile(f).metadata.num_rows
        except (OSError, ValueError) as exc:  # removed or replaced since it was checked
            log.error("%s: object ignored: %s", path, str(exc)[:200])
            continue
        entry = data.setdefault(subsystem, {}).setdefault(host, {"rows": 0, "portions": 0})
        entry["rows"] += rows
        entry["portions"] += 1
    policies: dict[str, dict] = {}
    for subsystem, cards in published_cards(store).items():
        for version in reversed(cards):
            try:
                card = json.loads(store.get(policy_path(subsystem, version, "json"),
                                            MAX_DOCUMENT_BYTES))
                if not isinstance(card, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                log.error("%s policy %d: card ignored: %s", subsystem, version, str(exc)[:200])
                continue
            policies[subsystem] = {
                "version": card.get("version"), "rows": card.get("rows"),
                "hosts": len(card.get("hosts", {})), "created": card.get("created"),
                "validation_mae": (card.get("validation") or {}).get("mae")}
            break
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
