"""The learning loop in virtual time: ML vs default vs best static vs oracle.

Drives the real proxy (`mlfs.core.mount.exchange`) on `sim.readahead` without a
mount, with the trainer's learner (`trainers.learner`) fed exactly what the
mount would give it: sealed dataset portions, sealed feedback portions, and
policy uploads / exploration recommendations through the proxy's own entry
points.  Scores every run against counterfactuals on the same workload.

The cadence is `mlfs demo`'s (simulator ticks of 0.05 s, the default `[store]`):
a dataset portion every 10 s (200 ticks), then a refit and an upload; a feedback
portion every 2 s (40 ticks), which corrects the learner as the worker does on each
one (`trainers.worker`, `scan_feedback`) and gives its explorations their newest
features.  (Feedback used to come only with the dataset, every 200 ticks: the
trainer then steered its explorations by features up to 200 ticks old, often of
the phase before; docs/results/learning-34.md.)

    .venv/bin/python -m tests.bench.learning --seeds 0 1 2 --ticks 6000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from mlfs.backends.sim_readahead import SimReadahead
from mlfs.backends.sim_replay import Counterfactuals
from mlfs.trainers.knob.learner import ROLLED_OUT_MODES, KnobLearner
from mlfs.trainers.schedule import TrainerSchedule

from mlfs.config import load_config
from mlfs.core.mount.exchange import Exchange
from tests.bench.provenance import measured_commit


def run_seed(seed: int, ticks: int, fit_every: int = 200,
             initial_policy: str | None = None, keep_rows: bool = False,
             corrections: bool = True) -> dict:
    """One run; `initial_policy` (a fleet policy's text) is adopted and uploaded
    before the first tick, then corrected in level by feedback and challenged at
    each refit, as `mlfs train --fleet` does (trainers/knob/worker.py: an adopted learner
    never refits until the challenge drops its prior).
    `keep_rows` returns the run's dataset rows too (`rows`, a pyarrow Table), e.g. to
    ship them to a fleet store (tests/bench/fleet_quality.py).  `corrections=False`
    keeps an adopted policy exactly as adopted: the learner still reads the rows (the
    exploration schedule needs them) but never corrects or re-uploads."""
    config = load_config(None)
    subsystem = SimReadahead(seed=seed)
    feedback_every = max(1, round(config.store.feedback_seal_seconds / subsystem.tick_seconds))
    with tempfile.TemporaryDirectory(prefix="mlfs-bench-") as state:
        exchange = Exchange(config, Path(state), [subsystem])
        runtime = exchange.runtimes["sim.readahead"]
        proxy = runtime.create_model("lgbm")
        proxy.start()
        learner = KnobLearner(runtime.info(), seed=seed)
        schedule = TrainerSchedule(learner, seed=seed)
        policy_live = False
        if initial_policy is not None:
            learner.adopt(initial_policy)
            proxy.set_policy(initial_policy.encode())
            policy_live = True
        first_recommendation = None
        within_95 = None
        started = time.perf_counter()
        modes = []
        next_decision = 0  # the tick the schedule decides again
        exploring_until = -1  # the tick an exploration's ttl runs out
        exploring = np.zeros(ticks, dtype=bool)  # ticks an exploration may have run
        for t in range(ticks):
            if t >= next_decision:  # paced as the worker paces (`ticks_to_next_decision`)
                # what the worker reads from `features` before it decides
                sample = json.loads(runtime.features_text())
                if sample["tick"] is not None:
                    learner.note_features(sample["tick"], sample["features"])
                steer = schedule.decide(proxy.mode, policy_live=policy_live)
                next_decision = t + schedule.ticks_to_next_decision(steer)
                if steer is not None:
                    proxy.recommend(steer.line().encode())
                    if steer.exploring:
                        exploring_until = t + steer.ttl
            exploring[t] = t < exploring_until
            runtime.tick()
            modes.append(proxy.mode)
            if proxy.mode == "recommendation" and first_recommendation is None:
                first_recommendation = t
            if (t + 1) % feedback_every == 0 and (t + 1) % fit_every:
                feedback = proxy.feedback.seal_now()
                if feedback and not (learner.adopted and not corrections):
                    table = pq.read_table(feedback.path)
                    if learner.fitted:
                        learner.correct(table)
                    else:
                        learner.add_feedback(table)
            if (t + 1) % fit_every == 0:
                portion = runtime.dataset.seal_now()
                if portion:
                    learner.add_dataset(pq.read_table(portion.path))
                feedback = proxy.feedback.seal_now()
                if learner.adopted and not corrections:
                    continue
                if feedback and learner.fitted:
                    learner.correct(pq.read_table(feedback.path))
                if learner.adopted:
                    # dropped when learning alone predicts better, unless it wins
                    learner.challenge(rolled_out=proxy.mode in ROLLED_OUT_MODES)
                if learner.adopted:
                    if feedback and learner.fitted:
                        proxy.set_policy(learner.policy_text().encode())
                elif learner.fit().get("fitted") and learner.knob_aware:
                    proxy.set_policy(learner.policy_text().encode())
                    policy_live = True
        seconds = time.perf_counter() - started
        switched = [t for t in range(1, ticks) if modes[t] != modes[t - 1]]
        transitions = [(t, why, mode) for t, (_, mode, why)
                       in zip(switched, proxy.mode_history, strict=False)]
        runtime.dataset.seal_now()
        table = runtime.dataset.read_all()
        exchange.close()
    applied = np.array(table.column("knob_read_ahead_kb").to_pylist())
    source = [c == "ml" or None for c in table.column("controller").to_pylist()]
    tick_numbers = np.array(table.column("tick").to_pylist())
    assert (tick_numbers == np.arange(ticks)).all()
    cf = Counterfactuals(seed, ticks, applied)
    rec_ticks = np.array([t for t, m in enumerate(modes) if m == "recommendation"])
    # ticks until a trailing 500-tick window is within 95% of the oracle
    window = 500
    run_c = np.convolve(cf.applied, np.ones(window), "valid")
    oracle_c = np.convolve(cf.table.max(axis=1), np.ones(window), "valid")
    hits = np.nonzero(run_c >= 0.95 * oracle_c)[0]
    within_95 = int(hits[0] + window) if len(hits) else None
    # the explorations' cost: what their ML ticks lost against the default on the same
    # ticks, as a share of the default's objective over the whole run and in learning
    ml_source = np.array([v is not None for v in source])
    explored = exploring & ml_source
    lost = np.clip(cf.default - cf.applied, 0.0, None)
    learning_ticks = np.array([m == "learning" for m in modes])
    exploration_cost = {
        "explored_ticks": int(explored.sum()),
        "of_run": round(float(lost[explored].sum() / cf.default.sum()), 4),
        "of_learning": round(float(lost[explored & learning_ticks].sum()
                                   / max(cf.default[learning_ticks].sum(), 1e-9)), 4),
    }
    last = np.arange(ticks // 2, ticks)
    second_half_modes = {m: modes[ticks // 2:].count(m) / len(last) for m in set(modes)}
    out = {
        "commit": measured_commit(),
        "transitions": transitions,
        "second_half_modes": {m: round(v, 3) for m, v in sorted(second_half_modes.items())},
        "seed": seed, "ticks": ticks, "seconds": round(seconds, 2),
        "ticks_to_recommendation": first_recommendation,
        "exploration_cost": exploration_cost,
        "ticks_to_95pct_oracle": within_95,
        "whole_run": cf.score(np.arange(ticks)).__dict__ | cf.score(np.arange(ticks)).ratios(),
        "second_half": cf.score(last).__dict__ | cf.score(last).ratios(),
    }
    if len(rec_ticks):
        out["recommendation_mode"] = cf.score(rec_ticks).__dict__ | cf.score(rec_ticks).ratios()
    if keep_rows:
        out["rows"] = table
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ticks", type=int, default=6000)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = []
    for seed in args.seeds:
        result = run_seed(seed, args.ticks)
        results.append(result)
        half = result["second_half"]
        print(f"seed {seed}: {result['seconds']} s; recommendation at tick "
              f"{result['ticks_to_recommendation']}; 95% of oracle at "
              f"{result['ticks_to_95pct_oracle']}; second half: ml {half['run']:.0f} MB/s, "
              f"x{half['vs_default']:.3f} default, x{half['vs_best_static']:.3f} best static "
              f"({half['best_static_kb']} KiB), {half['vs_oracle']:.3f} of oracle; "
              f"modes {result['second_half_modes']}; exploration cost "
              f"{result['exploration_cost']['of_learning']:.2%} of the default in learning, "
              f"{result['exploration_cost']['of_run']:.2%} of the run",
              flush=True)
    keys = ("vs_default", "vs_best_static", "vs_oracle")
    print("\nmedian over seeds (second half):",
          {k: round(float(np.median([r["second_half"][k] for r in results])), 3) for k in keys})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
