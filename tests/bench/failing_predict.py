"""Failure prediction on a real failing disk: lead time and false alarms against two rules.

    python -m tests.bench.failing_predict [--train 6] [--test 3] [--healthy 8]
        [--degrading 16] [--tick 0.5] [--json out.json]          (as root)

Each run is one disk of the project's own (tests/failing_disk.py) under a loop device,
on a schedule drawn from its seed: healthy, degrading (latency rises, sporadic errors,
more and more), then the burst that ends it.  A reader keeps it busy with O_DIRECT 4 KiB
reads at random offsets, and `linux.health` (backends/linux/health.py) is stepped every
`--tick` seconds, as the proxy would, until a few ticks after the burst: every figure is
the kernel's own (the loop device's /sys/block stat, the block layer's completion
errors through the BPF capture, the kernel log's I/O error records).

An `EventLearner` (trainers/predictor/learner.py, what `mlfs train` fits for a predictor) is
trained on the rows of the training schedules, with a few rolling features a trainer
derives from the rows (errors and latency over the last 5 and 20 ticks), and its
alerting threshold is the lowest that raised no alert in any training run's healthy
stage.  On schedules the training never saw, per run:

* lead time: from the first alert to the first tick of the burst (`failure`), seconds;
* false alarm: an alert while the disk was still healthy (before the drawn onset);

for the learned model, the default rule "alert after the first error" (`first_error`)
and a rate threshold (at least `--rate` errors over the last 5 ticks).  Every run is
reported, won or lost.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from mlfs.backends.linux.health import LinuxHealth
from mlfs.trainers.predictor.learner import EventLearner, label_rows

from mlfs.core.models.predictor import Tally, beats, median_lead
from tests.failing_disk import FailingLoop

BASE = ["reads", "read_ms_per_op", "in_flight", "busy_ms", "errors_total"]
ROLLING = ["errors_5", "errors_20", "latency_5", "latency_20", "latency_rise"]
FEATURES = BASE + ROLLING
TRAIN_SEEDS_FROM, TEST_SEEDS_FROM = 100, 900


def _reader(device: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    block = mmap.mmap(-1, 4096)
    try:
        while not stop.is_set():
            try:
                os.preadv(fd, [block], 4096 * rng.randrange(4096))
            except OSError:
                pass
    finally:
        os.close(fd)


def one_disk(seed: int, healthy: float, degrading: float, tick: float) -> dict:
    """One disk's life, stepped tick by tick: its rows and its schedule."""
    with tempfile.TemporaryDirectory(prefix="mlfs-failing-") as root:
        disk = FailingLoop(Path(root), seed=seed, healthy=healthy, degrading=degrading,
                           size_mb=16).start()
        stop = threading.Event()
        reader = threading.Thread(target=_reader, args=(disk.device, stop, seed), daemon=True)
        health = None
        rows: list[dict] = []
        try:
            health = LinuxHealth(devices=[disk.name], tick_seconds=tick, burst_errors=5)
            schedule = disk.schedule()
            started = time.monotonic()
            reader.start()
            bursts = 0
            next_tick = started
            while bursts < 4 and time.monotonic() - started < schedule["failure_s"] + 30:
                next_tick += tick
                time.sleep(max(0.0, next_tick - time.monotonic()))
                table = health.step({}).records
                row = table.to_pylist()[0]
                row["t"] = time.monotonic() - started
                rows.append(row)
                bursts += bool(row["failure"])
        finally:
            stop.set()
            reader.join(timeout=10)
            if health is not None:
                health.close()
            disk.stop()
    return {"seed": seed, "schedule": schedule, "rows": rows,
            "block_errors_counted": health is not None and health.bio is not None}


def columns_of(run: dict) -> dict[str, np.ndarray]:
    """The run's rows as columns, with the rolling features a trainer would derive."""
    rows = run["rows"]
    cols = {name: np.array([r[name] if r[name] is not None else math.nan for r in rows],
                           dtype=np.float64) for name in BASE + ["errors", "errors_logged"]}
    errors = np.where(np.isnan(cols["errors"]), cols["errors_logged"], cols["errors"])
    latency = np.nan_to_num(cols["read_ms_per_op"], nan=0.0)

    def rolling(values: np.ndarray, k: int, how) -> np.ndarray:
        return np.array([how(values[max(0, i - k + 1):i + 1]) for i in range(len(values))])

    cols["errors_5"] = rolling(errors, 5, np.sum)
    cols["errors_20"] = rolling(errors, 20, np.sum)
    cols["latency_5"] = rolling(latency, 5, np.mean)
    cols["latency_20"] = rolling(latency, 20, np.mean)
    first = latency[: max(1, min(10, len(latency)))].mean()
    cols["latency_rise"] = cols["latency_5"] / first if first > 0 else cols["latency_5"]
    cols["failure"] = np.array([bool(r["failure"]) for r in rows])
    cols["first_error"] = np.array([bool(r["first_error"]) for r in rows])
    cols["tick"] = np.arange(len(rows))
    cols["t"] = np.array([r["t"] for r in rows])
    cols["key"] = np.full(len(rows), run["seed"])
    return cols


def judge(cols: dict[str, np.ndarray], alerts: np.ndarray, onset: float) -> dict:
    """Lead time before the first burst tick, and whether an alert came while healthy."""
    burst = np.flatnonzero(cols["failure"])
    first_burst = int(burst[0]) if len(burst) else None
    raised = np.flatnonzero(alerts[:first_burst] if first_burst is not None else alerts)
    lead = None
    if first_burst is not None and len(raised):
        lead = round(float(cols["t"][first_burst] - cols["t"][raised[0]]), 2)
    false_alarm = bool((alerts & (cols["t"] < onset)).any())
    return {"lead_s": lead, "false_alarm": false_alarm, "caught": lead is not None}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=6)
    parser.add_argument("--test", type=int, default=3)
    parser.add_argument("--healthy", type=float, default=8.0)
    parser.add_argument("--degrading", type=float, default=16.0)
    parser.add_argument("--tick", type=float, default=0.5)
    parser.add_argument("--rate", type=int, default=3,
                        help="the rate rule: alert at this many errors over the last 5 ticks")
    parser.add_argument("--horizon", type=int, default=20, help="ticks a warning may lead")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (loop devices, /dev/kmsg, the BPF capture)", file=sys.stderr)
        raise SystemExit(2)
    runs = {"train": [], "test": []}
    for part, first, count in (("train", TRAIN_SEEDS_FROM, args.train),
                               ("test", TEST_SEEDS_FROM, args.test)):
        for seed in range(first, first + count):
            run = one_disk(seed, args.healthy, args.degrading, args.tick)
            runs[part].append(run)
            print(f"{part} seed {seed}: {len(run['rows'])} ticks, onset "
                  f"{run['schedule']['onset_s']:.1f} s, failure {run['schedule']['failure_s']:.1f}"
                  f" s, block-layer errors counted: {run['block_errors_counted']}", flush=True)
    train = [columns_of(r) for r in runs["train"]]
    merged = {name: np.concatenate([c[name] for c in train]) for name in train[0]}
    label, usable = label_rows(merged["key"], merged["tick"], merged["failure"], args.horizon)
    learner = EventLearner(FEATURES, negative_rate=1.0, rounds=100, num_leaves=7).fit(
        merged, label, usable)
    healthy_p = [learner.predict(c)[c["t"] < r["schedule"]["onset_s"]]
                 for c, r in zip(train, runs["train"], strict=True)]
    threshold = float(max((p.max() for p in healthy_p if len(p)), default=0.5)) + 1e-6
    out = {"args": vars(args), "threshold": round(threshold, 4), "runs": []}
    for run in runs["test"]:
        cols = columns_of(run)
        p = learner.predict(cols)
        onset = run["schedule"]["onset_s"]
        out["runs"].append({
            "seed": run["seed"], "ticks": len(run["rows"]), "schedule": run["schedule"],
            "model": judge(cols, p >= threshold, onset),
            "first_error": judge(cols, cols["first_error"], onset),
            "rate": judge(cols, cols["errors_5"] >= args.rate, onset),
        })
    for source in ("model", "first_error", "rate"):
        leads = [r[source]["lead_s"] for r in out["runs"] if r[source]["lead_s"] is not None]
        out[source] = {"caught": f"{len(leads)}/{len(out['runs'])}",
                       "median_lead_s": statistics.median(leads) if leads else None,
                       "false_alarms": sum(r[source]["false_alarm"] for r in out["runs"])}
        print(f"{source:12s} caught {out[source]['caught']}, lead times "
              f"{[r[source]['lead_s'] for r in out['runs']]} s, false alarms "
              f"{out[source]['false_alarms']}", flush=True)
    out["gate"] = gate(out["runs"])
    print(f"gate: {out['gate']['verdict']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


def tally(runs: list[dict], source: str) -> Tally:
    """One source's alerts over the test disks as the proxy's shadow book counts them
    (an event per disk; a false alarm per disk alerted while still healthy)."""
    leads = [r[source]["lead_s"] for r in runs if r[source]["lead_s"] is not None]
    return Tally(events=len(runs), caught=len(leads),
                 false_alarms=sum(r[source]["false_alarm"] for r in runs),
                 negatives=len(runs), leads=leads)


def gate(runs: list[dict]) -> dict:
    """What the proxy's rule gate (`mlfs.core.models.predictor.beats`, the test
    `RuleStanding.policy_proven` makes) decides on these outcomes: recommendation, where
    the model's alerts replace the rule's, only if the model beats the incumbent rule
    ("alert after the first error": with fewer than `rule_incumbent.MIN_EVENTS` events
    no swept rule may replace it); otherwise the model waits in collaboration and the
    rule's alerts stand."""
    model, rule = tally(runs, "model"), tally(runs, "first_error")
    wins = beats(model, rule)
    return {"incumbent": "first_error", "model_beats_incumbent": wins,
            "verdict": ("the model beats the rule: recommendation may replace its alerts"
                        if wins else "the model does not beat the rule: it stays in "
                        "collaboration and the rule's alerts stand")
                       + f" (model {model.caught}/{model.events} caught, "
                         f"{model.false_alarms} false alarms, median lead "
                         f"{median_lead(model):.1f} s; rule {rule.caught}/{rule.events}, "
                         f"{rule.false_alarms}, {median_lead(rule):.1f} s)"}


if __name__ == "__main__":
    main()
