"""Cold start on sim.disks, with and without a fleet policy (issue 30).

    python -m tests.bench.predict_fleet [--hosts 4] [--drives 2000] [--json out.json]

A fleet of `--hosts` hosts (seeds 2000, 2001, ...) has run a year; their drive-days are
written to a fleet store in its layout (records portions of 30 days, `info`), and
`mlfs fleet train` (mlfs.fleet.train.train, a LocalCluster of 2 workers) trains one
predictor from them.  Then new hosts (seeds 0-4, never seen) start, each a year long:

- **with the fleet policy**: the policy runs from day 0, as the proxy runs it (window
  features from each drive's rows so far; an alert at p >= the proxy's 0.5);
- **alone**: what `mlfs train` does on the host's own rows, refitting every 30 days
  (`fit_predictor`: no model until 20 positive rows, i.e. the first failure it has seen);
  until then the model alerts on nothing;
- **challenged**: what `mlfs train --fleet` does: the fleet policy from day 0, challenged
  at every refit by the host's own (`trainers.predictor.challenge`, log loss on the
  host's newest rows) and dropped for the host's own model once that wins.

Both are scored with the one rule (`mlfs.base.outcomes`) against SMART's threshold trip on
the same drive-days, over the first 90 days and over the year: recall, false alarms per
drive-day, and the proxy's efficiency (the rule's cost over the model's, a missed failure
costing 100 false alarms: sim.disks' target).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from mlfs.backends.sim_disks import RECORDS, SimDisks, smart_threshold_rule
from mlfs.trainers.predictor.learner import challenge, fit_predictor

from mlfs.abi import window_features
from mlfs.base.outcomes import efficiency
from mlfs.core.models.kinds.predictor.inputs import PredictionPolicy
from mlfs.core.models.kinds.predictor.proxy import ALERT_THRESHOLD
from tests.bench.predict import FEATURES, HORIZON, evaluate, judged_rows, simulate, subset

FLEET_SEEDS_FROM = 2000
NEW_HOSTS = (0, 1, 2, 3, 4)
REFIT_DAYS = 30
PERIODS = (90, 365)


def write_store(store: Path, hosts: int, drives: int, days: int) -> None:
    """The fleet's hosts' drive-days in the store's layout (what `fleet push` ships)."""
    target = SimDisks.targets["failure"]
    info = {"knobs": {}, "features": {}, "targets": {"failure": target.describe()},
            "records": RECORDS}
    for i in range(hosts):
        host = f"bench{i}"
        columns = simulate(FLEET_SEEDS_FROM + i, drives, days)
        (store / "info" / "sim.disks").mkdir(parents=True, exist_ok=True)
        (store / "info" / "sim.disks" / f"{host}.json").write_text(json.dumps(info))
        folder = store / "subsystem=sim.disks" / f"host={host}" / "kind=records"
        folder.mkdir(parents=True, exist_ok=True)
        for n, start in enumerate(range(0, days, 30)):
            rows = (columns["tick"] >= start) & (columns["tick"] < start + 30)
            table = {k: v[rows] for k, v in columns.items()}
            table["host_id"] = np.full(int(rows.sum()), host)
            pq.write_table(pa.table(table), folder / f"{n:010d}.parquet")


def fleet_policy(args) -> tuple[PredictionPolicy, dict]:
    from mlfs.fleet.train import train

    root = Path(tempfile.mkdtemp(prefix="mlfs-bench-fleet-"))
    try:
        write_store(root, args.hosts, args.drives, args.days)
        card = train(str(root), "sim.disks", n_workers=2, folds=0,
                     progress=lambda line: print(f"  fleet train {line}", flush=True))
        text = (root / "policies" / "sim.disks" / f"{card['version']:010d}.txt").read_bytes()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return PredictionPolicy(text, RECORDS), card


def policy_p(policy: PredictionPolicy, columns) -> np.ndarray:
    cols = dict(columns)
    cols.update(window_features(cols["drive_id"], cols["tick"], cols, policy.windows))
    matrix = np.column_stack([np.asarray(cols[n], dtype=np.float64)
                              for n in policy.feature_names])
    return policy.booster.predict(matrix, num_threads=1)


def alone_p(columns) -> tuple[np.ndarray, int | None]:
    """The host's own trainer: refit every REFIT_DAYS on the rows before, predict after."""
    p = np.zeros(len(columns["tick"]))
    first = None
    for start in range(REFIT_DAYS, int(columns["tick"].max()) + 1, REFIT_DAYS):
        seen = subset(columns, columns["tick"] < start)
        learner, _ = fit_predictor(seen, "drive_id", "failed", HORIZON, FEATURES)
        if learner is None:
            continue
        first = start if first is None else first
        ahead = (columns["tick"] >= start) & (columns["tick"] < start + REFIT_DAYS)
        cols = subset(columns, columns["tick"] < start + REFIT_DAYS)
        names = learner.features[len(FEATURES):]
        cols.update(window_features(cols["drive_id"], cols["tick"], cols, names))
        mine = cols["tick"] >= start
        p[ahead] = learner.predict(subset(cols, mine))
    return p, first


def challenged_p(policy: PredictionPolicy, columns, p_prior: np.ndarray,
                 p_alone: np.ndarray) -> tuple[np.ndarray, int | None]:
    """The fleet policy until a refit's challenge drops it, then the host's own (the
    same refits as `alone_p`): the probabilities and the day it was dropped (None)."""
    p = p_prior.copy()
    for start in range(REFIT_DAYS, int(columns["tick"].max()) + 1, REFIT_DAYS):
        seen = subset(columns, columns["tick"] < start)
        verdict = challenge(policy.text.decode(), seen, "drive_id", "failed", HORIZON,
                            FEATURES)
        if verdict["chosen"] == "local":
            later = columns["tick"] >= start
            p[later] = p_alone[later]
            return p, start
    return p, None


def scored(columns, alerts, days: int, target) -> dict:
    keep = columns["tick"] < days
    part = subset(columns, keep)
    rows = judged_rows(part) | part["failed"]
    part = subset(part, rows)
    model = evaluate(part, alerts[keep][rows])
    rule = evaluate(part, smart_threshold_rule(part))
    return {"failures": model.events, "recall": round(model.recall, 4),
            "false_alarms": model.false_alarms,
            "false_alarm_rate": model.false_alarm_rate,
            "rule_recall": round(rule.recall, 4), "rule_false_alarms": rule.false_alarms,
            "efficiency": round(efficiency(model, rule, target.miss_cost,
                                           target.false_alarm_cost), 3)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--drives", type=int, default=2000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    started = time.monotonic()
    target = SimDisks.targets["failure"]
    policy, card = fleet_policy(args)
    results: dict = {"fleet": {"hosts": args.hosts, "drives": args.drives, "days": args.days,
                               "seeds_from": FLEET_SEEDS_FROM, "rows": card["rows"],
                               "positives": card["positives"],
                               "train_seconds": card["seconds"]},
                     "alert_threshold": ALERT_THRESHOLD, "refit_days": REFIT_DAYS,
                     "hosts": {}}
    for seed in NEW_HOSTS:
        columns = simulate(seed, args.drives, args.days)
        p_prior = policy_p(policy, columns)
        with_fleet = p_prior >= ALERT_THRESHOLD
        p_alone, first = alone_p(columns)
        alone = p_alone >= ALERT_THRESHOLD
        p_challenged, dropped = challenged_p(policy, columns, p_prior, p_alone)
        challenged = p_challenged >= ALERT_THRESHOLD
        results["hosts"][seed] = {
            "first_local_model_day": first, "fleet_policy_dropped_day": dropped,
            **{f"first_{d}_days": {"with_fleet_policy": scored(columns, with_fleet, d, target),
                                   "alone": scored(columns, alone, d, target),
                                   "challenged": scored(columns, challenged, d, target)}
               for d in PERIODS}}
        print(f"seed {seed}: first local model on day {first}; the fleet policy dropped on "
              f"day {dropped}")
        for d in PERIODS:
            for side in ("with_fleet_policy", "alone", "challenged"):
                f = results["hosts"][seed][f"first_{d}_days"][side]
                print(f"  first {d:3d} days {side:17} failures {f['failures']:3d} recall "
                      f"{f['recall']:.3f} (rule {f['rule_recall']:.3f}) false alarms "
                      f"{f['false_alarms']:5d} (rule {f['rule_false_alarms']}) efficiency "
                      f"{f['efficiency']}")
    results["seconds"] = round(time.monotonic() - started, 1)
    print(f"{results['seconds']} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
    return results


if __name__ == "__main__":
    main()
