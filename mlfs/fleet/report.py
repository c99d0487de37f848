"""`mlfs fleet report`: the fleet as one table, from the store alone.

One row per host, subsystem and model: rows the host shipped, the model's mode
and efficiency as its pusher last saw them, and which policy it runs: `fleet
N` when the policy's sha256 matches the card of published version N, `local`
when the host runs a policy of its own (a fleet policy boosted on local
residuals is local from its first correction), `none` without one.  Then a
summary per subsystem: hosts, rows, how many run each fleet version, modes,
and the mean efficiency of the hosts whose efficiency is known.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter

from .layout import MAX_DOCUMENT_BYTES, policy_path
from .status import collect, published_cards
from .store import Store


def _cards(store: Store) -> dict[str, dict[str, int]]:
    """subsystem -> sha256 -> published version."""
    out: dict[str, dict[str, int]] = {}
    for subsystem, versions in published_cards(store).items():
        for version in versions:
            try:
                card = json.loads(store.get(policy_path(subsystem, version, "json"),
                                            MAX_DOCUMENT_BYTES))
            except (OSError, ValueError):  # missing, a FIFO, too large, not JSON
                continue
            if isinstance(card, dict):
                out.setdefault(subsystem, {})[str(card.get("sha256"))] = version
    return out


def _number(text: str | None) -> float | None:
    """The efficiency as a number; None for `nan` or nothing (JSON has no NaN)."""
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def rows(url: str) -> dict:
    """The report's data: `rows` (one per host, subsystem, model) and `subsystems`."""
    status = collect(url)
    cards = _cards(Store(url))
    table = []
    pairs = {(s, h) for s, per_host in status["subsystems"].items() for h in per_host}
    pairs |= {(s, h) for h, rec in status["hosts"].items() for s in rec.get("models", {})}
    for subsystem, host in sorted(pairs):
        record = status["hosts"].get(host, {})
        shipped = status["subsystems"].get(subsystem, {}).get(host, {}).get("rows", 0)
        models = record.get("models", {}).get(subsystem, {}) or {"": {}}
        for model, shown in sorted(models.items()):
            digest = shown.get("policy_sha256", "")
            version = cards.get(subsystem, {}).get(digest)
            policy = f"fleet {version}" if version else ("local" if digest else "none")
            table.append({
                "host": host, "host_name": record.get("host_name", ""),
                "subsystem": subsystem, "model": model, "rows": shipped,
                "mode": shown.get("mode", ""), "efficiency": _number(shown.get("efficiency")),
                "policy": policy, "fleet_version": version,
                "age_seconds": round(time.time() - record["time"], 1) if record else None})
    summary: dict[str, dict] = {}
    for subsystem in sorted({r["subsystem"] for r in table}):
        mine = [r for r in table if r["subsystem"] == subsystem]
        known = [r["efficiency"] for r in mine if r["efficiency"] is not None]
        summary[subsystem] = {
            "hosts": len({r["host"] for r in mine}),
            "rows": sum(status["subsystems"].get(subsystem, {}).get(h, {}).get("rows", 0)
                        for h in {r["host"] for r in mine}),
            "policies": dict(Counter(r["policy"] for r in mine)),
            "modes": dict(Counter(r["mode"] for r in mine if r["mode"])),
            "mean_efficiency": sum(known) / len(known) if known else None,
            "newest_policy": status["policies"].get(subsystem),
        }
    return {"store": url, "rows": table, "subsystems": summary}


def render(report: dict) -> str:
    lines = [f"fleet report of {report['store']}"]
    lines.append(f"{'host':<18} {'subsystem':<22} {'model':<10} {'rows':>9} "
                 f"{'mode':<15} {'efficiency':>10}  policy")
    for r in report["rows"]:
        eff = "nan" if r["efficiency"] is None else f"{r['efficiency']:.3f}"
        lines.append(f"{r['host']:<18} {r['subsystem']:<22} {r['model'] or '-':<10} "
                     f"{r['rows']:>9} {r['mode'] or '-':<15} {eff:>10}  {r['policy']}")
    for subsystem, s in report["subsystems"].items():
        mean = s["mean_efficiency"]
        shown = ", ".join(f"{k} on {v}" for k, v in sorted(s["policies"].items()))
        modes = ", ".join(f"{v} {k}" for k, v in sorted(s["modes"].items())) or "no model"
        lines.append(f"{subsystem}: {s['hosts']} hosts, {s['rows']} rows; {modes}; "
                     f"policies: {shown}; mean efficiency "
                     f"{'n/a' if mean is None else f'{mean:.3f}'}")
    return "\n".join(lines) + "\n"


def main(url: str, as_json: bool) -> int:
    try:
        report = rows(url)
    except (OSError, ValueError) as exc:
        print(f"mlfs fleet report: {url}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render(report))
    return 0
