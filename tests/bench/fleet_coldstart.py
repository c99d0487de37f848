"""Fleet cold start: a new host starting from a fleet policy against one learning alone.

Everything on real mounts and real commands.  Fleet hosts (sim.readahead, their
own seeds) each run `mlfs train` alone for `--host-ticks` ticks and are pushed
with `mlfs fleet push --once`; `mlfs fleet train` (LocalCluster) publishes the
fleet policy.  Then for every newcomer seed two mounts run side by side, same
seed, same workload, the mode machine's default settings: one with
`mlfs train MOUNT sim.readahead --fleet STORE` (pull, then keep learning
locally), one with plain `mlfs train` (learning alone).

Per run, from the mount's own dataset (one row per tick: tick, mode, applied
read_ahead_kb): the first tick in recommendation mode, and the first tick at
which the trailing 500-tick window's noise-free throughput is >= 95 % of the
oracle's (the definition of tests/bench/learning.py; the counterfactuals are
replayed from the seed by `backends.sim_replay.Counterfactuals`).  The fleet
hosts learning alone are reported too (more alone samples).

Why `--tick 0.05` and not the shortest tick the daemon accepts (0.001 s): the
trainer gates its work on wall time as well as rows (FIT_MIN_ROWS 200,
FIT_MIN_SECONDS 2, POLICY_MIN_SECONDS 5 in trainers/worker.py).  At 0.05 s a
tick the 200-row gate (10 s) is the binding one, as at 1 tick/s, so the
learner's cadence in ticks is that of a real host; below 0.025 s the 5 s policy
gate would make learning alone look slower in ticks than it is.

    .venv/bin/python -m tests.bench.fleet_coldstart --seeds 1 2 3 \\
        --json docs/bench/fleet-coldstart.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from mlfs.backends.sim_replay import Counterfactuals

from tests.harness import REPO, Mount, mlfs_command

WINDOW = 500  # the trailing window of tests/bench/learning.py's 95 % figure


def config(seed: int, tick: float) -> str:
    """The mode machine's settings are the defaults; portions seal every second and
    none is dropped before the run is read."""
    return f"""
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0
feedback_seal_seconds = 1.0
journal_seal_seconds = 1.0
retention_count = 1000000
retention_bytes = 17179869184

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = {seed}
tick_seconds = {tick}
"""


def dataset(m: Mount) -> pa.Table:
    files = sorted((m.sub / "dataset").glob("*.parquet"))
    if not files:
        return pa.table({"tick": pa.array([], pa.int64())})
    return pa.concat_tables(pq.read_table(f, columns=["tick", "model", "mode",
                                                       "knob_read_ahead_kb"]) for f in files)


def last_tick(m: Mount) -> int:
    files = sorted((m.sub / "dataset").glob("*.parquet"))
    if not files:
        return -1
    try:
        return int(pq.read_table(files[-1], columns=["tick"]).column("tick").to_numpy().max())
    except (OSError, ValueError):
        return -1


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def score(table: pa.Table, seed: int, ticks: int) -> dict:
    """Counted from the tick the model proxy first exists (`model` set in the
    dataset): a trainer's start-up (imports, connecting) is a few wall seconds,
    tens of ticks at --tick 0.05 and a few at 1 tick/s, the same for both arms."""
    table = table.sort_by("tick")
    tick = table.column("tick").to_numpy()
    assert (tick == np.arange(len(tick))).all(), "the dataset lost ticks"
    models = np.array(table.column("model").to_pylist(), dtype=object)
    start = int(np.nonzero((models != None) & (models != ""))[0][0])  # noqa: E711
    n = min(ticks, len(tick) - start)
    applied_all = np.array(table.column("knob_read_ahead_kb").to_pylist())
    cf = Counterfactuals(seed, start + n, applied_all[:start + n])
    modes = np.array(table.column("mode").to_pylist())[start:start + n]
    rec = np.nonzero(modes == "recommendation")[0]
    run_c = np.convolve(cf.applied[start:], np.ones(WINDOW), "valid")
    oracle_c = np.convolve(cf.table.max(axis=1)[start:], np.ones(WINDOW), "valid")
    hits = np.nonzero(run_c >= 0.95 * oracle_c)[0]
    half = np.arange(start + n // 2, start + n)
    whole = np.arange(start, start + n)
    first_mode = {}
    for mode in ("collaboration", "recommendation"):
        at = np.nonzero(modes == mode)[0]
        first_mode[mode] = int(at[0]) if len(at) else None
    return {
        "seed": seed, "ticks": n, "model_created_at_tick": start,
        "ticks_to_collaboration": first_mode["collaboration"],
        "ticks_to_recommendation": int(rec[0]) if len(rec) else None,
        "ticks_to_95pct_oracle": int(hits[0] + WINDOW) if len(hits) else None,
        "mode_shares": {m: round(float((modes == m).mean()), 3) for m in sorted(set(modes))},
        "second_half_vs_oracle": round(float(cf.applied[half].sum()
                                             / cf.table.max(axis=1)[half].sum()), 4),
        "whole_run_vs_oracle": round(float(cf.applied[whole].sum()
                                           / cf.table.max(axis=1)[whole].sum()), 4),
    }


def run_hosts(root: Path, runs: list[tuple[str, int, list[str]]], ticks: int, tick: float,
              store: Path | None = None) -> list[dict]:
    """Mount and train each (name, seed, extra trainer args) side by side until `ticks`;
    push each to `store` if given; score each."""
    mounts, trainers, results = [], [], []
    try:
        for name, seed, _ in runs:
            m = Mount(root, config=config(seed, tick), name=name)
            mounts.append(m)
            m.start()
        started = time.monotonic()
        for m, (name, _, extra) in zip(mounts, runs, strict=True):
            log = open(root / f"{name}-train.log", "ab")  # noqa: SIM115 (the child owns it)
            trainers.append(subprocess.Popen(
                mlfs_command("train", str(m.mountpoint), "sim.readahead", *extra),
                stdout=log, stderr=log, cwd=REPO))
            log.close()
        # the run ends `ticks` after the model proxy exists (score() counts from there)
        began: dict[int, int] = {}
        while len(began) < len(mounts) or min(
                last_tick(m) - began[i] for i, m in enumerate(mounts)) < ticks + 50:
            for i, m in enumerate(mounts):
                if i not in began and (m.sub / "models" / "lgbm").exists():
                    began[i] = max(0, last_tick(m))
            time.sleep(1.0)
            if time.monotonic() - started > ticks * tick * 6 + 300:
                raise RuntimeError(f"{[last_tick(m) for m in mounts]} of {ticks} ticks: too slow")
        wall = time.monotonic() - started
        for proc in trainers:
            end(proc)
        for m, (name, seed, extra) in zip(mounts, runs, strict=True):
            result = score(dataset(m), seed, ticks)
            result.update(name=name, arm="fleet" if "--fleet" in extra else "alone",
                          wall_seconds=round(wall, 1))
            results.append(result)
            print(json.dumps(result), flush=True)
            if store is not None:
                done = subprocess.run(
                    mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                                 "--state-dir", str(m.state_dir), "--once"),
                    capture_output=True, text=True, timeout=300, cwd=REPO)
                if done.returncode:
                    raise RuntimeError(f"push {name}: {done.stderr[-2000:]}")
    finally:
        for proc in trainers:
            end(proc)
        for m in mounts:
            m.kill(signal.SIGTERM)
    return results


def summary(results: list[dict], arm: str) -> dict:
    out = {}
    for key in ("ticks_to_recommendation", "ticks_to_95pct_oracle"):
        values = [r[key] for r in results if r["arm"] == arm]
        reached = [v for v in values if v is not None]
        out[key] = {"median": statistics.median(reached) if reached else None,
                    "range": [min(reached), max(reached)] if reached else None,
                    "reached": f"{len(reached)}/{len(values)}"}
    return out


def virtual(store: Path, seeds: list[int], ticks: int) -> dict:
    """The same comparison in virtual time (tests/bench/learning.py's loop: the real
    proxy and learner, no mount, no wall clock): the fleet policy the real run
    published, adopted from tick 0, against learning alone.  Immune to the CPU
    contention that delays a real trainer in ticks."""
    from mlfs.fleet.pull import fetch
    from tests.bench.learning import run_seed

    policy = fetch(str(store), "sim.readahead")
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
            out["results"] += run_hosts(
                root, [(f"fleet{s}", s, []) for s in args.fleet_seeds], args.host_ticks,
                args.tick, store)
            started = time.monotonic()
            done = subprocess.run(
                mlfs_command("fleet", "train", "--store", str(store), "--subsystem",
                             "sim.readahead", "--json"),
                capture_output=True, text=True, timeout=1800, cwd=REPO)
            if done.returncode:
                raise RuntimeError(done.stderr[-3000:])
            card = json.loads(done.stdout)
            out["fleet_train"] = {"seconds": round(time.monotonic() - started, 1),
                                  "rows": card["rows"], "hosts": len(card["hosts"]),
                                  "validation_mae": card["validation"]["mae"],
                                  "version": card["version"]}
            print(json.dumps(out["fleet_train"]), flush=True)
        for seed in args.seeds:
            out["results"] += run_hosts(
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
