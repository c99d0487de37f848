"""Fleet cold start: a new host starting from a fleet policy against one learning alone.

Everything on real mounts and real commands.  Fleet hosts (sim.readahead, their
own seeds) each run `mlfs train` alone for `--host-ticks` ticks and are pushed
with `mlfs fleet push --once`; `mlfs fleet train` (LocalCluster) publishes the
fleet policy.  Then for every newcomer seed two mounts run side by side, same
seed, same workload, the mode machine's default settings: one with
`mlfs train MOUNT sim.readahead --fleet STORE` (pull, then keep learning
locally), one with plain `mlfs train` (learning alone).

The orchestration and the scoring are mlfs.fleet.demo's (shared with
`mlfs demo --fleet N`); this file adds the seeds, the virtual-time run and the JSON.

Per run, from the mount's own dataset (one row per tick: tick, mode, applied
read_ahead_kb): the first tick in recommendation mode, and the first tick at
which the trailing 500-tick window's noise-free throughput is >= 95 % of the
oracle's (the definition of tests/bench/learning.py; the counterfactuals are
replayed from the seed by `backends.sim_replay.Counterfactuals`).  The fleet
hosts learning alone are reported too (more alone samples).

Why `--tick 0.05` and not the shortest tick the daemon accepts (0.001 s): the
trainer gates its work on wall time as well as rows (FIT_MIN_ROWS 200,
FIT_MIN_SECONDS 2 in trainers/knob/cadence.py, POLICY_MIN_SECONDS 5 in
trainers/knob/worker.py).  At 0.05 s a
tick the 200-row gate (10 s) is the binding one, as at 1 tick/s, so the
learner's cadence in ticks is that of a real host; below 0.025 s the 5 s policy
gate would make learning alone look slower in ticks than it is.

    .venv/bin/python -m tests.bench.fleet_coldstart --seeds 1 2 3 \\
        --json bench-results/fleet-coldstart.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from mlfs.fleet.demo import WINDOW, run_hosts, summary, train_round
from tests.harness import REPO


def hosts(root: Path, runs: list[tuple[str, int, list[str]]], ticks: int, tick: float,
          store: Path | None = None) -> list[dict]:
    """mlfs.fleet.demo.run_hosts on this checkout's code, each result printed."""
    results = run_hosts(root, runs, ticks, tick, store, cwd=REPO)
    for result in results:
        print(json.dumps(result), flush=True)
    return results


def virtual(store: Path, seeds: list[int], ticks: int) -> dict:
    """The same comparison in virtual time (tests/bench/learning.py's loop: the real
    proxy and learner, no mount, no wall clock): the fleet policy the real run
    published, adopted from tick 0, against learning alone.  Immune to the CPU
    contention that delays a real trainer in ticks."""
    from mlfs.fleet.demo import demo_key
    from mlfs.fleet.pull import fetch
    from tests.bench.learning import run_seed

    # the key the demo's fleet round signed with (mlfs.fleet.demo.demo_key)
    policy = fetch(str(store), "sim.readahead", trusted_keys=[f"{demo_key(store)}.pub"])
    results = []
    for seed in seeds:
        for arm, initial in (("fleet", policy.text), ("alone", None)):
            r = run_seed(seed, ticks, initial_policy=initial)
            result = {"seed": seed, "arm": arm, "ticks": ticks,
                      "ticks_to_recommendation": r["ticks_to_recommendation"],
                      "ticks_to_95pct_oracle": r["ticks_to_95pct_oracle"],
                      "second_half_vs_oracle": round(r["second_half"]["vs_oracle"], 4),
                      "whole_run_vs_oracle": round(r["whole_run"]["vs_oracle"], 4),
                      "transitions": r["transitions"][:8]}
            results.append(result)
            print(json.dumps(result), flush=True)
    return {"policy_version": policy.version, "results": results,
            "summary": {"fleet": summary(results, "fleet"), "alone": summary(results, "alone")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet-seeds", type=int, nargs="+", default=[101, 102, 103])
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--host-ticks", type=int, default=3000)
    parser.add_argument("--ticks", type=int, default=3000)
    parser.add_argument("--tick", type=float, default=0.05)
    parser.add_argument("--store", type=Path, help="reuse a store with a published policy")
    parser.add_argument("--virtual-seeds", type=int, nargs="*", default=[],
                        help="also compare in virtual time on these seeds")
    parser.add_argument("--virtual-ticks", type=int, default=4000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mlfs-coldstart-", dir="/tmp"))
    os.chmod(root, 0o755)
    out: dict = {"tick_seconds": args.tick, "window": WINDOW, "command": " ".join(
        ["python -m tests.bench.fleet_coldstart", *(argv or [])]), "results": []}
    try:
        store = args.store
        if store is None:
            store = root / "store"
            out["results"] += hosts(
                root, [(f"fleet{s}", s, []) for s in args.fleet_seeds], args.host_ticks,
                args.tick, store)
            out["fleet_train"] = train_round(store, cwd=REPO, scratch=root)
            print(json.dumps(out["fleet_train"]), flush=True)
        for seed in args.seeds:
            out["results"] += hosts(
                root, [(f"new{seed}", seed, ["--fleet", str(store)]),
                       (f"alone{seed}", seed, [])], args.ticks, args.tick)
            if args.json:  # partial figures survive a late stop
                args.json.write_text(json.dumps(out, indent=2) + "\n")
        if args.virtual_seeds:
            out["virtual"] = virtual(store, args.virtual_seeds, args.virtual_ticks)
        new = [r for r in out["results"] if r["name"].startswith(("new", "alone"))]
        out["summary"] = {"fleet": summary(new, "fleet"), "alone": summary(new, "alone"),
                          "alone_incl_fleet_hosts": summary(out["results"], "alone")}
        print(json.dumps(out["summary"], indent=2))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
