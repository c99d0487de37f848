"""Fleet policy quality on held-out hosts, in virtual time.

Issue 12, "Measured", second item: on hosts whose rows the fleet never saw, the
fleet policy's throughput against a per-host model trained on that host's own
data, and against the default, the best static setting and the oracle.

Training hosts (sim.readahead seeds `--train-seeds`) each run the learning loop
of tests/bench/learning.py alone for `--train-ticks` ticks; their dataset rows are
written into a directory fleet store exactly as `mlfs fleet push` lays them out
(hive-partitioned portions of `--portion-rows` rows with the host columns, and
each host's `info`), and `mlfs.fleet.train.train` -- the real fleet trainer,
lightgbm.dask on a LocalCluster -- publishes the fleet policy from them.  One
store and one policy serve every held-out seed: the training seeds are disjoint
from the held-out ones, so every held-out host is unseen (a leave-one-out fit per
held-out host would cost a LocalCluster fit each, minutes on this shared 2-core
machine, for the same question).

Then on each held-out seed, the same ticks, the same workload, six figures:

* `fleet_adopted`: the fleet policy uploaded at tick 0 and never changed (no
  feedback corrections; the trainer still reads the rows, so its exploration
  schedule steers as usual, and the mode machine decides when the policy acts);
* `fleet_local`: the fleet policy adopted at tick 0, then corrected in level by the
  host's own feedback and challenged (`KnobLearner.challenge`), as `mlfs train
  --fleet` does;
* `alone`: the per-host model, learning from the host's own rows only;
* default, best static (the best fixed read_ahead_kb in hindsight) and the oracle
  (the best setting per phase), from the counterfactuals
  (`mlfs.backends.sim_replay.Counterfactuals`) of each run: they depend only on
  the seed and the ticks, so are the same for every arm.

Throughput is the noise-free MB/s of the setting actually applied each tick, over
the whole run and over its second half (after the cold start).

    .venv/bin/python -m tests.bench.fleet_quality --train-seeds 101 102 103 \\
        --seeds 1 2 3 4 5 --json bench-results/fleet-quality.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from mlfs.backends.sim_readahead import SimReadahead

from mlfs.config import load_config
from mlfs.core.mount.exchange import Exchange
from mlfs.fleet.host import with_host_columns
from mlfs.fleet.layout import Source, info_path
from mlfs.fleet.pull import fetch
from mlfs.fleet.signing import keygen
from mlfs.fleet.store import Store
from mlfs.fleet.train import train
from tests.bench.learning import run_seed

SUBSYSTEM = "sim.readahead"
ARMS = ("fleet_adopted", "fleet_local", "alone")
RATIOS = ("vs_default", "vs_best_static", "vs_oracle")


def subsystem_info(seed: int) -> dict:
    """The subsystem's `info` as a mount serves it (what a fleet trainer builds its
    columns from)."""
    with tempfile.TemporaryDirectory(prefix="mlfs-bench-") as state:
        exchange = Exchange(load_config(None), Path(state), [SimReadahead(seed=seed)])
        try:
            return exchange.runtimes[SUBSYSTEM].info()
        finally:
            exchange.close()


def fill_store(url: str, seeds: list[int], ticks: int, portion_rows: int) -> list[dict]:
    """Each training seed learns alone for `ticks`; its rows go to the store as a
    pusher would ship them (one object per portion, host columns appended)."""
    store = Store(url)
    source = Source(SUBSYSTEM, "dataset")
    hosts = []
    for seed in seeds:
        host = {"host_id": f"train{seed}", "host_name": f"train{seed}",
                "kernel_release": os.uname().release, "machine": os.uname().machine,
                "mlfs_version": "bench"}
        started = time.perf_counter()
        r = run_seed(seed, ticks, keep_rows=True)
        rows = with_host_columns(r.pop("rows"), host)
        for number, offset in enumerate(range(0, rows.num_rows, portion_rows)):
            buffer = io.BytesIO()
            pq.write_table(rows.slice(offset, portion_rows), buffer)
            store.put(source.object_path(host["host_id"], number), buffer.getvalue())
        store.put(info_path(SUBSYSTEM, host["host_id"]),
                  json.dumps(subsystem_info(seed)).encode())
        hosts.append({"seed": seed, "host_id": host["host_id"], "rows": rows.num_rows,
                      "seconds": round(time.perf_counter() - started, 1),
                      "alone_second_half_vs_oracle": round(r["second_half"]["vs_oracle"], 4)})
        print(json.dumps(hosts[-1]), flush=True)
    return hosts


def ratios(score: dict) -> dict:
    out = {k: round(score[k], 4) for k in RATIOS}
    out["mb_s"] = round(score["run"], 2)
    return out


def held_out(seed: int, ticks: int, policy: str) -> dict:
    runs = {
        # the learner reads the rows (the exploration schedule's state) but never
        # corrects or re-uploads: the policy as adopted
        "fleet_adopted": run_seed(seed, ticks, initial_policy=policy, corrections=False),
        "fleet_local": run_seed(seed, ticks, initial_policy=policy),
        "alone": run_seed(seed, ticks),
    }
    some = runs["alone"]
    out: dict = {"seed": seed, "ticks": ticks}
    for part in ("whole_run", "second_half"):
        s = some[part]
        out[part] = {
            "default_mb_s": round(s["default"], 2),
            "best_static_mb_s": round(s["best_static"], 2),
            "best_static_kb": s["best_static_kb"],
            "oracle_mb_s": round(s["oracle"], 2),
            **{arm: ratios(runs[arm][part]) for arm in ARMS},
        }
    for arm in ARMS:
        out.setdefault("ticks_to_recommendation", {})[arm] = runs[arm]["ticks_to_recommendation"]
        out.setdefault("second_half_modes", {})[arm] = runs[arm]["second_half_modes"]
        rec = runs[arm].get("recommendation_mode")
        out.setdefault("recommendation_mode_vs_oracle", {})[arm] = (
            round(rec["vs_oracle"], 4) if rec else None)
        out.setdefault("seconds", {})[arm] = runs[arm]["seconds"]
    return out


def summary(results: list[dict]) -> dict:
    """Median [min, max] over the held-out seeds of each arm's ratio."""
    out: dict = {}
    for part in ("whole_run", "second_half"):
        for arm in ARMS:
            for k in RATIOS:
                values = [r[part][arm][k] for r in results]
                out.setdefault(part, {}).setdefault(arm, {})[k] = {
                    "median": round(statistics.median(values), 4),
                    "range": [min(values), max(values)]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-seeds", type=int, nargs="+", default=[101, 102, 103])
    parser.add_argument("--train-ticks", type=int, default=3000)
    parser.add_argument("--portion-rows", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--ticks", type=int, default=3500)
    parser.add_argument("--folds", type=int, default=3,
                        help="hosts held out for the trainer's own validation (0: none)")
    parser.add_argument("--store", type=Path, help="reuse a store with a published policy")
    parser.add_argument("--trusted-key", type=Path,
                        help="with --store: the public key its policy was signed with")
    parser.add_argument("--keep-store", type=Path,
                        help="train into this new directory and keep it (and bench.key "
                             "beside it) for --store and --trusted-key")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if set(args.train_seeds) & set(args.seeds):
        parser.error("held-out seeds must not be training seeds")
    if args.store is not None and args.trusted_key is None:
        parser.error("--store needs --trusted-key (the key its policy was signed with)")
    shown = sys.argv[1:] if argv is None else argv
    out: dict = {"command": " ".join(["python -m tests.bench.fleet_quality", *shown]),
                 "load_average_at_start": os.getloadavg()}
    root = Path(tempfile.mkdtemp(prefix="mlfs-quality-", dir="/tmp"))
    try:
        store, trusted = args.store, args.trusted_key
        if store is None:
            store = args.keep_store or root / "store"
            out["training_hosts"] = fill_store(str(store), args.train_seeds, args.train_ticks,
                                               args.portion_rows)
            started = time.monotonic()
            key = Path(store).parent / "bench.key"  # the bench signs its own round and
            # trusts only it
            trusted = keygen(key)
            card = train(str(store), SUBSYSTEM, folds=args.folds, key=key)
            out["fleet_train"] = {
                "seconds": round(time.monotonic() - started, 1),
                "load_average_after": os.getloadavg(), "rows": card["rows"],
                "hosts": card["hosts"], "validation_mae": card["validation"]["mae"],
                "scheduler": card["scheduler"], "version": card["version"]}
            print(json.dumps(out["fleet_train"]), flush=True)
        policy = fetch(str(store), SUBSYSTEM, trusted_keys=[trusted])
        out["policy_version"] = policy.version
        out["results"] = []
        for seed in args.seeds:
            out["results"].append(held_out(seed, args.ticks, policy.text))
            print(json.dumps(out["results"][-1]), flush=True)
            if args.json:  # partial figures survive a late stop
                args.json.write_text(json.dumps(out, indent=2) + "\n")
        out["summary"] = summary(out["results"])
        out["load_average_at_end"] = os.getloadavg()
        print(json.dumps(out["summary"], indent=2))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
