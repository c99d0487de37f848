"""The anomaly kind on sim.disks: an isolation forest against the threshold rules.

    python -m tests.bench.anomaly [--drives 5000] [--days 365] [--test-seeds 2 3 4]

The forest is what `mlfs train --kind anomaly` fits (`mlfs.trainers.anomaly.learner.
fit_anomaly`: unsupervised on every numeric record column, its alerting level the
candidate that cost least at the target's costs on the rows whose outcome is known),
fitted on a training seed (seed 1) and exported to the daemon's JSON format; the test
seeds are scored by the daemon's own numpy scorer (`mlfs.core.models.kinds.anomaly.
forest.score`) and judged with the proxy's counting rule (`mlfs.base.outcomes.score`,
horizon 30 days) against
- SMART's threshold trip (the target's rule: what `smartctl -H` says), and
- Backblaze's rule of thumb (any raw value of SMART 5, 187, 188, 197 or 198 above 0).
A rule is one operating point; the forest is a curve, so it is also read at Backblaze's
false-alarm rate on the same rows (`at backblaze's rate`: the level that gives that rate
there, the whole curve read at one point).  Figures per seed and pooled: recall of the
labelled anomalies (failures), false alarms per 1,000 drive-days, median lead in days.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mlfs.backends.sim_disks import (
    RECORDS,
    DrivePopulation,
    SimDisks,
    backblaze_rule,
    smart_threshold_rule,
)
from mlfs.trainers.anomaly.learner import default_features, fit_anomaly

from mlfs.base.outcomes import (
    Score,
    event_ticks_mask,
    next_event_ticks,
    positive_ticks,
    score,
    threshold_at_false_alarm_rate,
)
from mlfs.core.models.kinds.anomaly.forest import score as forest_score
from mlfs.core.models.kinds.anomaly.forest import verify_forest

TARGET = SimDisks.targets["failure"].describe()
HORIZON = int(TARGET["horizon_ticks"])


def drive_days(seed: int, drives: int, days: int) -> dict[str, np.ndarray]:
    columns = DrivePopulation(drives=drives, seed=seed).days(days)
    columns["tick"] = columns["day"]
    return columns


def judge(columns: dict, alerts: np.ndarray) -> Score:
    return score(columns["drive_id"], columns["tick"], columns["failed"], alerts, HORIZON)


def row(name: str, s: Score) -> dict:
    return {"method": name, "events": s.events, "caught": s.caught, "recall": s.recall,
            "false_alarms": s.false_alarms, "negatives": s.negatives,
            "false_alarms_per_1000": 1000.0 * s.false_alarms / max(1, s.negatives),
            "median_lead_days": s.median_lead}


def pooled(name: str, scores: list[Score]) -> dict:
    leads = tuple(x for s in scores for x in s.lead_ticks)
    return row(name, Score(sum(s.events for s in scores), sum(s.caught for s in scores),
                           sum(s.false_alarms for s in scores),
                           sum(s.negatives for s in scores), leads))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drives", type=int, default=5000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--train-seed", type=int, default=1)
    parser.add_argument("--test-seeds", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    started = time.perf_counter()
    features = default_features(RECORDS, TARGET)
    train = drive_days(args.train_seed, args.drives, args.days)
    text, figures = fit_anomaly(train, features, TARGET, seed=0)
    forest = verify_forest(text.encode())
    print(f"forest: {forest.trees} trees, depth {forest.depth}, {len(text)} bytes of JSON, "
          f"alert_score {forest.alert_score:.4f} chosen on seed {args.train_seed} "
          f"({figures['events']} failures known), {time.perf_counter() - started:.0f} s")
    per_method: dict[str, list[Score]] = {}
    rows = []
    for seed in args.test_seeds:
        test = drive_days(seed, args.drives, args.days)
        x = np.column_stack([test[f].astype(np.float64) for f in features])
        scores = forest_score(forest, x)
        nxt = next_event_ticks(test["drive_id"], test["tick"], test["failed"])
        negative = ~positive_ticks(test["tick"], nxt, HORIZON) & ~event_ticks_mask(
            test["tick"], nxt)
        backblaze = backblaze_rule(test)
        rate = float((backblaze & negative).sum() / negative.sum())
        methods = {
            "SMART threshold rule": smart_threshold_rule(test),
            "Backblaze rule": backblaze,
            "forest (its level)": scores >= forest.alert_score,
            "forest at Backblaze's rate": scores >= threshold_at_false_alarm_rate(
                scores, negative, rate),
        }
        for name, alerts in methods.items():
            s = judge(test, alerts)
            per_method.setdefault(name, []).append(s)
            rows.append(dict(row(name, s), seed=seed))
    print(f"\n{args.drives} drives x {args.days} days per seed, test seeds "
          f"{args.test_seeds}, horizon {HORIZON} days (pooled over the seeds)\n")
    print("| method | failures | caught | recall | false alarms / 1,000 drive-days "
          "| median lead (days) |")
    print("|---|---:|---:|---:|---:|---:|")
    summary = []
    for name, scores in per_method.items():
        p = pooled(name, scores)
        summary.append(p)
        print(f"| {name} | {p['events']} | {p['caught']} | {p['recall']:.3f} | "
              f"{p['false_alarms_per_1000']:.2f} | {p['median_lead_days']:.1f} |")
    print("\nper seed: " + "; ".join(
        f"{r['seed']} {r['method']}: recall {r['recall']:.3f}, "
        f"{r['false_alarms_per_1000']:.2f}/1000" for r in rows))
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"pooled": summary, "per_seed": rows, "forest": figures}, fh, indent=1,
                      default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
