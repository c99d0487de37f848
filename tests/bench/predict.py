"""Drive-failure prediction on sim.disks: a learned predictor against SMART's own rules.

    python -m tests.bench.predict [--drives 10000] [--days 365] [--json out.json]

Three predictors are trained on the drive-days of training seeds and judged on seeds they
never saw, with the one scoring rule (`mlfs.base.outcomes.score`):

- **learned**: what `mlfs train` fits (`mlfs.trainers.predictor.learner.fit_predictor`: its window
  features, negatives down-sampled to NEGATIVES_PER_POSITIVE a positive, calibrated,
  ROUNDS rounds of NUM_LEAVES leaves);
- **learned without windows**: the same on the record fields alone (what it fitted
  before window features existed), to show what they bring;
- **offline**: the upper reference, a LightGBM classifier trained offline on the same rows
  and features with nothing down-sampled, the same rounds and leaves.

Against the SMART threshold trip (the default rule: what `smartctl -H` says) and
Backblaze's rule of thumb (any raw value of SMART 5, 187, 188, 197 or 198 above zero).

Operating points.  A rule is one point (a recall at a false-alarm rate per drive-day); a
model is a curve.  Two honest ways to compare at the same false-alarm rate, both shown:
1. *deployable*: each model's alerting threshold is chosen on a validation seed (never a
   test seed) to give the rule's false-alarm rate there, then applied to the test seeds;
   the false-alarm rate it reaches on them is printed beside its recall;
2. *curve*: each model's recall at exactly the rule's pooled false-alarm rate on the
   test seeds, read off its ROC curve there (no threshold is carried anywhere: it is the
   whole curve read at one point).
Every seed is printed and written to the JSON.  The targets (issue 30): recall at least
twice the threshold rule's at the same false-alarm rate, and within 5 % (relative) of
the offline model's.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mlfs.backends.sim_disks import (
    RECORDS,
    DrivePopulation,
    backblaze_rule,
    smart_threshold_rule,
)
from mlfs.trainers.predictor.learner import (
    EventLearner,
    calibration,
    fit_predictor,
    label_rows,
)

from mlfs.abi import window_features
from mlfs.base.outcomes import (
    event_ticks_mask,
    next_event_ticks,
    positive_ticks,
    score,
    threshold_at_false_alarm_rate,
)

HORIZON = 30
FEATURES = [name for name in RECORDS if name not in ("drive_id", "failed")]
TRAIN_SEEDS = (1000, 1001)
VALIDATION_SEED = 1002
TEST_SEEDS = (0, 1, 2, 3, 4)
#: false-alarm rates per drive-day at which every model's recall is also shown
FIXED_RATES = (1e-5, 1e-4, 1e-3)
RULES = {"smart_threshold": smart_threshold_rule, "backblaze": backblaze_rule}


def simulate(seed: int, drives: int, days: int) -> dict[str, np.ndarray]:
    columns = DrivePopulation(drives=drives, seed=seed).days(days)
    columns["tick"] = columns.pop("day")
    return columns


def judged_rows(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Rows whose outcome is known: not within the horizon of the data's end."""
    return columns["tick"] <= columns["tick"].max() - HORIZON


def subset(columns: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {name: values[rows] for name, values in columns.items()}


def evaluate(columns, alerts):
    return score(columns["drive_id"], columns["tick"], columns["failed"], alerts, HORIZON)


def negatives(columns) -> np.ndarray:
    nxt = next_event_ticks(columns["drive_id"], columns["tick"], columns["failed"])
    return ~positive_ticks(columns["tick"], nxt, HORIZON) & ~event_ticks_mask(columns["tick"],
                                                                              nxt)


def merge(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several seeds' rows as one dataset (drive ids kept apart per seed)."""
    return {k: np.concatenate([p[k] if k != "drive_id" else p[k].astype(np.int64) + i * 10**8
                               for i, p in enumerate(parts)]) for k in parts[0]}


def offline_model(columns: dict[str, np.ndarray], features: list[str], rounds: int,
                  ) -> EventLearner:
    """The upper reference: every usable row, no down-sampling, `rounds` rounds."""
    label, usable = label_rows(columns["drive_id"], columns["tick"], columns["failed"],
                               HORIZON)
    usable &= judged_rows(columns) | label
    return EventLearner(features, negative_rate=1.0, rounds=rounds, num_leaves=31).fit(
        columns, label, usable)


def train_models(args) -> tuple[dict[str, EventLearner], list[str], dict]:
    merged = merge([simulate(s, args.drives, args.days) for s in TRAIN_SEEDS])
    models: dict[str, EventLearner] = {}
    timings = {}
    started = time.monotonic()
    bare, _ = fit_predictor(dict(merged), "drive_id", "failed", HORIZON, FEATURES, windows=[])
    models["learned_without_windows"] = bare
    timings["learned_without_windows"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    learned, figures = fit_predictor(merged, "drive_id", "failed", HORIZON, FEATURES)
    models["learned"] = learned
    timings["learned"] = round(time.monotonic() - started, 1)
    windows = learned.features[len(FEATURES):]
    started = time.monotonic()
    models["offline"] = offline_model(merged, learned.features, learned.rounds)
    timings["offline"] = round(time.monotonic() - started, 1)
    figures["fit_seconds"] = timings
    return models, windows, figures


def with_windows(columns, windows):
    columns.update(window_features(columns["drive_id"], columns["tick"], columns, windows))
    return columns


def margin(model: EventLearner, columns) -> np.ndarray:
    """The model's raw score (the log-odds): the probability's order without its ties at
    1.0 (a sigmoid rounds every log-odds above 37 to 1.0, and the offline reference,
    fitted on every row, gets there); thresholds are chosen on it."""
    return model.booster.predict(model._matrix(columns), raw_score=True, num_threads=1)


def recall_at(scores_p, rows, rate) -> tuple[list, list]:
    """A model's recall at `rate` on the test rows, the curve read at it: the operating
    points just at or below the rate and just above it (tree models give tied scores, so
    the curve is a staircase and the rate itself may lie on a step)."""
    p = np.concatenate([s for s in scores_p])
    neg = np.concatenate([r["negative"] for r in rows])
    below = threshold_at_false_alarm_rate(p, neg, rate)
    above = float(np.max(p[neg][p[neg] < below])) if (p[neg] < below).any() else below
    return ([evaluate(r["columns"], sp >= below) for sp, r in zip(scores_p, rows, strict=True)],
            [evaluate(r["columns"], sp >= above) for sp, r in zip(scores_p, rows, strict=True)])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drives", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    started = time.monotonic()
    models, windows, training = train_models(args)

    # four times the drives: the threshold rule allows about one false alarm per million
    # drive-days, so the threshold matching it needs millions of negatives to be stable
    validation = simulate(VALIDATION_SEED, 4 * args.drives, args.days)
    v = subset(with_windows(validation, windows), judged_rows(validation))
    v_neg = negatives(v)
    rule_rates = {name: evaluate(v, rule(v)).false_alarm_rate for name, rule in RULES.items()}
    thresholds: dict[str, dict[str, float]] = {}
    for model_name, model in models.items():
        p_val = margin(model, v)
        thresholds[model_name] = {
            **{name: threshold_at_false_alarm_rate(p_val, v_neg, fa)
               for name, fa in rule_rates.items()},
            **{f"{rate:g}": threshold_at_false_alarm_rate(p_val, v_neg, rate)
               for rate in FIXED_RATES}}
    del validation, v

    results: dict = {"horizon_days": HORIZON, "drives": args.drives, "days": args.days,
                     "train_seeds": TRAIN_SEEDS, "validation_seed": VALIDATION_SEED,
                     "test_seeds": TEST_SEEDS, "window_features": windows,
                     "training": training, "validation_rule_false_alarm_rates": rule_rates,
                     "thresholds": thresholds, "seeds": {}}
    pooled: dict[str, list] = {}
    rows: list[dict] = []
    probabilities: dict[str, list[np.ndarray]] = {name: [] for name in models}
    cal_p, cal_y = [], []
    for seed in TEST_SEEDS:
        test = with_windows(simulate(seed, args.drives, args.days), windows)
        t = subset(test, judged_rows(test) | test["failed"])
        rows.append({"columns": t, "negative": negatives(t)})
        row = {}
        for name, rule in RULES.items():
            row[name] = evaluate(t, rule(t))
        for model_name, model in models.items():
            p = margin(model, t)
            probabilities[model_name].append(p)
            for point, threshold in thresholds[model_name].items():
                label = (f"{model_name}_at_{point}_rate" if point in RULES
                         else f"{model_name}_at_{point}")
                row[label] = evaluate(t, p >= threshold)
            if model_name == "learned":
                lab, use = label_rows(t["drive_id"], t["tick"], t["failed"], HORIZON)
                cal_p.append(model.predict(t)[use])
                cal_y.append(lab[use])
        for name, s in row.items():
            pooled.setdefault(name, []).append(s)
        results["seeds"][seed] = {name: _figures(s) for name, s in row.items()}
    results["pooled"] = {name: _figures_pooled(scores) for name, scores in pooled.items()}
    # the curve read at each rule's pooled false-alarm rate on the test seeds
    curve: dict = {}
    for name in RULES:
        rate = results["pooled"][name]["false_alarm_rate"]
        for model_name in models:
            scores, over = recall_at(probabilities[model_name], rows, rate)
            curve[f"{model_name}_at_{name}_rate"] = {
                "pooled": _figures_pooled(scores),
                "seeds": {seed: _figures(s) for seed, s in zip(TEST_SEEDS, scores,
                                                                strict=True)},
                "next_step_up": {"pooled": _figures_pooled(over),
                                 "seeds": {seed: _figures(s) for seed, s in
                                           zip(TEST_SEEDS, over, strict=True)}}}
    results["curve"] = curve
    results["calibration"] = calibration(np.concatenate(cal_p), np.concatenate(cal_y))
    results["seconds"] = round(time.monotonic() - started, 1)
    _print(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
    return results


def _figures(s) -> dict:
    return {"events": s.events, "caught": s.caught, "recall": round(s.recall, 4),
            "false_alarms": s.false_alarms, "false_alarm_rate": s.false_alarm_rate,
            "median_lead_days": s.median_lead}


def _figures_pooled(scores) -> dict:
    events = sum(s.events for s in scores)
    caught = sum(s.caught for s in scores)
    fa = sum(s.false_alarms for s in scores)
    neg = sum(s.negatives for s in scores)
    leads = [x for s in scores for x in s.lead_ticks]
    return {"events": events, "caught": caught, "recall": round(caught / events, 4),
            "false_alarms": fa, "false_alarm_rate": fa / neg,
            "median_lead_days": float(np.median(leads)) if leads else None}


def _line(name: str, f: dict) -> str:
    lead = f["median_lead_days"] if f["median_lead_days"] is not None else "-"
    return (f"{name:48} {f['events']:6d} {f['recall']:7.3f} {f['false_alarms']:6d} "
            f"{f['false_alarm_rate']:11.2e} {lead:>6}")


def _print(results: dict) -> None:
    print(f"horizon {results['horizon_days']} days, {results['drives']} drives x "
          f"{results['days']} days per seed, test seeds {list(results['seeds'])}")
    head = f"{'rule / model':48} {'events':>6} {'recall':>7} {'FAs':>6} {'FA/drv-day':>11} " \
           f"{'lead':>6}"
    print("deployable: thresholds chosen on the validation seed")
    print(head)
    for name, f in results["pooled"].items():
        print(_line(name, f))
    print("per seed (recall, false alarms):")
    for name in results["pooled"]:
        print(f"  {name:46} " + "  ".join(
            f"{s[name]['recall']:.3f}/{s[name]['false_alarms']}"
            for s in results["seeds"].values()))
    print("curve: each model read at the rule's pooled false-alarm rate on the test seeds")
    print(head)
    for name, c in results["curve"].items():
        for label, part in ((name, c), ("  next step up", c["next_step_up"])):
            print(_line(label, part["pooled"]) + "   per seed: " + " ".join(
                f"{s['recall']:.3f}/{s['false_alarms']}" for s in part["seeds"].values()))
    pooled, curve = results["pooled"], results["curve"]
    base = pooled["smart_threshold"]["recall"]
    for model in ("learned", "learned_without_windows", "offline"):
        dep = pooled[f"{model}_at_smart_threshold_rate"]["recall"]
        cur = curve[f"{model}_at_smart_threshold_rate"]["pooled"]["recall"]
        print(f"{model} / smart_threshold recall at its false-alarm rate: deployable "
              f"x{dep / base:.2f}, curve x{cur / base:.2f}")
    for how, get in (("deployable", lambda m: pooled[f"{m}_at_smart_threshold_rate"]),
                     ("curve", lambda m: curve[f"{m}_at_smart_threshold_rate"]["pooled"])):
        mine, ref = get("learned")["recall"], get("offline")["recall"]
        print(f"learned / offline recall ({how}, at the threshold rule's rate): "
              f"{mine / ref:.3f}" if ref else f"offline recall 0 ({how})")
    print("calibration (mean p, observed, rows):",
          ", ".join(f"({a:.4f}, {b:.4f}, {n})" for a, b, n in results["calibration"][-4:]))
    print(f"{results['seconds']} s")


if __name__ == "__main__":
    main()
