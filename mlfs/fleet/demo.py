"""A fleet cold start on this machine: `mlfs demo --fleet N` and tests/bench/fleet_coldstart.py.

Everything runs on real mounts and real commands.  Fleet hosts (sim.readahead,
each its own seed) run `mlfs train` alone, side by side, for a number of ticks
and are pushed with `mlfs fleet push --once` into a directory store;
`mlfs fleet train` (a LocalCluster) publishes the fleet policy.  Then a
newcomer runs `mlfs train MOUNT sim.readahead --fleet STORE` (pull, then keep
learning locally) beside a host learning alone on the same seed, the same
workload and the mode machine's default settings.

Per run, from the mount's own dataset (one row per tick: tick, mode, applied
read_ahead_kb): the first tick in recommendation mode, and the first tick at
which the trailing 500-tick window's noise-free throughput is >= 95 % of the
oracle's (the definition of tests/bench/learning.py; the counterfactuals are
replayed from the seed by `backends.sim_replay.Counterfactuals`).

Why 0.05 s a tick by default and not the shortest tick the daemon accepts
(0.001 s): the trainer gates its work on wall time as well as rows
(FIT_MIN_ROWS 200 and FIT_MIN_SECONDS 2 in trainers/knob/cadence.py, POLICY_MIN_SECONDS 5 in
trainers/knob/worker.py).  At 0.05 s a tick the 200-row gate (10 s) is the binding
one, as at 1 tick/s, so the learner's cadence in ticks is that of a real host;
below 0.025 s the 5 s policy gate would make learning alone look slower in
ticks than it is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlfs.backends.sim_replay import Counterfactuals
from mlfs.client import MountFailed, MountProcess, end_process

SUBSYSTEM = "sim.readahead"
MODEL = "lgbm"
WINDOW = 500  # the trailing window of tests/bench/learning.py's 95 % figure
TICK_SECONDS = 0.05
#: `mlfs demo --fleet N` bounds: two hosts make a fleet; beyond 16 mounts and
#: trainers on one machine the demo measures the CPU, not the learning
MIN_HOSTS, MAX_HOSTS = 2, 16


def config(seed: int, tick: float) -> str:
    """The mode machine's settings are the defaults; portions seal every second and
    none is dropped before the run is read.  allow_other only where it works
    (root, or user_allow_other in fuse.conf, which the demo does not assume)."""
    allow_other = "true" if os.geteuid() == 0 else "false"
    return f"""
[mount]
allow_other = {allow_other}

[store]
seal_rows = 4096
seal_seconds = 1.0
feedback_seal_seconds = 1.0
journal_seal_seconds = 1.0
retention_count = 1000000
retention_bytes = 17179869184

[[subsystem]]
backend = "{SUBSYSTEM}"
name = "{SUBSYSTEM}"
seed = {seed}
tick_seconds = {tick}
"""


class Host(MountProcess):
    """One simulated host: a mount on `root/name`, its state in `root/name-state`,
    its configuration in `root/name.toml`."""

    def __init__(self, root: Path, name: str, seed: int, tick: float,
                 cwd: Path | str | None = None) -> None:
        mountpoint = root / name
        mountpoint.mkdir(exist_ok=True)
        config_path = root / (name + ".toml")
        config_path.write_text(config(seed, tick))
        super().__init__(mountpoint, root / (name + "-state"), config_path, cwd=cwd,
                         timeout=60)
        self.name, self.seed = name, seed

    @property
    def sub(self) -> Path:
        return self.mountpoint / SUBSYSTEM


def dataset(sub: Path) -> pa.Table:
    files = sorted((sub / "dataset").glob("*.parquet"))
    if not files:
        return pa.table({"tick": pa.array([], pa.int64())})
    return pa.concat_tables(pq.read_table(f, columns=["tick", "model", "mode",
                                                       "knob_read_ahead_kb"]) for f in files)


def last_tick(sub: Path) -> int:
    files = sorted((sub / "dataset").glob("*.parquet"))
    if not files:
        return -1
    try:
        return int(pq.read_table(files[-1], columns=["tick"]).column("tick").to_numpy().max())
    except (OSError, ValueError):
        return -1


def score(table: pa.Table, seed: int, ticks: int) -> dict:
    """Counted from the tick the model proxy first exists (`model` set in the
    dataset): a trainer's start-up (imports, connecting) is a few wall seconds,
    tens of ticks at 0.05 s a tick and a few at 1 tick/s, the same for both arms."""
    table = table.sort_by("tick")
    tick = table.column("tick").to_numpy()
    if not (tick == np.arange(len(tick))).all():
        raise RuntimeError("the dataset lost ticks")
    models = np.array(table.column("model").to_pylist(), dtype=object)
    created = np.nonzero((models != None) & (models != ""))[0]  # noqa: E711
    if not len(created):
        raise RuntimeError("no model proxy appeared in the dataset")
    start = int(created[0])
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


def _quiet(*args: object) -> None:
    pass


def demo_key(store: Path) -> Path:
    """The demo's own signing key, beside its store (made once): the fleet round signs
    with it, the newcomer trusts its public half (mlfs/fleet/signing.py)."""
    from .signing import keygen

    key = Path(store).parent / "fleet-demo.key"
    if not key.exists():
        keygen(key)
    return key


def run_hosts(root: Path, runs: list[tuple[str, int, list[str]]], ticks: int, tick: float,
              store: Path | None = None, cwd: Path | str | None = None,
              say: Callable[..., None] = _quiet) -> list[dict]:
    """Mount and train each (name, seed, extra `mlfs train` args) side by side until
    `ticks` past its model's creation; push each to `store` if given; score each.
    Every trainer and mount is ended by its pid, also on an exception or Ctrl-C."""
    hosts: list[Host] = []
    trainers: list[subprocess.Popen] = []
    results = []
    try:
        for name, seed, _ in runs:
            host = Host(root, name, seed, tick, cwd)
            hosts.append(host)
            host.start()
        started = time.monotonic()
        for host, (name, _, extra) in zip(hosts, runs, strict=True):
            if "--fleet" in extra and "--trusted-key" not in extra:  # the demo's own key
                store_dir = Path(extra[extra.index("--fleet") + 1])
                extra = [*extra, "--trusted-key", str(demo_key(store_dir)) + ".pub"]
            log = open(root / f"{name}-train.log", "ab")  # noqa: SIM115 (the child owns it)
            trainers.append(subprocess.Popen(
                host.command("train", str(host.mountpoint), SUBSYSTEM, *extra),
                stdout=log, stderr=log, cwd=cwd))
            log.close()
            say(f"host {name} (seed {host.seed}) on {host.mountpoint}: mount pid {host.pid}, "
                f"trainer pid {trainers[-1].pid}" + (" (from the fleet policy)"
                                                     if "--fleet" in extra else ""))
        # the run ends `ticks` after the model proxy exists (score() counts from there)
        began: dict[int, int] = {}
        while len(began) < len(hosts) or min(
                last_tick(h.sub) - began[i] for i, h in enumerate(hosts)) < ticks + 50:
            for i, h in enumerate(hosts):
                if i not in began and (h.sub / "models" / MODEL).exists():
                    began[i] = max(0, last_tick(h.sub))
            time.sleep(1.0)
            if time.monotonic() - started > ticks * tick * 6 + 300:
                raise RuntimeError(f"{[last_tick(h.sub) for h in hosts]} of {ticks} ticks: "
                                   "too slow")
        wall = time.monotonic() - started
        for proc in trainers:
            end_process(proc)
        for host, (name, seed, extra) in zip(hosts, runs, strict=True):
            result = score(dataset(host.sub), seed, ticks)
            result.update(name=name, arm="fleet" if "--fleet" in extra else "alone",
                          wall_seconds=round(wall, 1))
            results.append(result)
            if store is not None:
                done = subprocess.run(
                    host.command("fleet", "push", str(host.mountpoint), "--store", str(store),
                                 "--state-dir", str(host.state_dir), "--once"),
                    capture_output=True, text=True, timeout=300, cwd=cwd)
                if done.returncode:
                    raise RuntimeError(f"push {name}: {done.stderr[-2000:]}")
    finally:
        for proc in trainers:
            end_process(proc)
        for host in hosts:
            host.stop(signal.SIGTERM, timeout=30)
    return results


def train_round(store: Path, cwd: Path | str | None = None,
                scratch: Path | None = None) -> dict:
    """One `mlfs fleet train` round on a LocalCluster; the model card's figures.
    `scratch` becomes the round's TMPDIR: the LocalCluster leaves its
    `dask-scratch-space` directory in the temporary directory after it ends."""
    started = time.monotonic()
    env = dict(os.environ, TMPDIR=str(scratch)) if scratch is not None else None
    done = subprocess.run(
        [sys.executable, "-m", "mlfs", "fleet", "train", "--store", str(store),
         "--subsystem", SUBSYSTEM, "--json", "--key", str(demo_key(store))],
        capture_output=True, text=True, timeout=1800, cwd=cwd, env=env)
    if done.returncode:
        raise RuntimeError(f"mlfs fleet train: {done.stderr[-3000:]}")
    card = json.loads(done.stdout)
    return {"seconds": round(time.monotonic() - started, 1), "rows": card["rows"],
            "hosts": len(card["hosts"]), "validation_mae": card["validation"]["mae"],
            "version": card["version"]}


def summary(results: list[dict], arm: str) -> dict:
    out = {}
    for key in ("ticks_to_recommendation", "ticks_to_95pct_oracle"):
        values = [r[key] for r in results if r["arm"] == arm]
        reached = [v for v in values if v is not None]
        out[key] = {"median": statistics.median(reached) if reached else None,
                    "range": [min(reached), max(reached)] if reached else None,
                    "reached": f"{len(reached)}/{len(values)}"}
    return out


def _say(line: str) -> None:
    print(f"mlfs demo: {line}", flush=True)


def _cell(value: object) -> str:
    return "not reached" if value is None else str(value)


def run_fleet_demo(hosts: int, host_ticks: int = 2000, ticks: int = 2000,
                   tick: float = TICK_SECONDS, seed: int = 0,
                   keep: str | None = None) -> int:
    """`mlfs demo --fleet N`: N hosts (seeds seed+101 ...) learn alone and are pushed,
    one fleet training round, then the newcomer (seed `seed`) from the fleet policy
    beside a host learning alone on the same seed; prints the comparison."""
    from mlfs.demos.knob import _keep_problem

    if keep is not None:
        problem = _keep_problem(keep)
        if problem:
            print(f"mlfs demo: --keep {keep}: {problem}", file=sys.stderr)
            return 2
        root = Path(keep).resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="mlfs-fleet-demo-"))
    store = root / "store"
    _say(f"a fleet of {hosts} hosts in {root} ({tick:g} s a tick)")
    began = time.monotonic()
    try:
        _say(f"1/3: {hosts} hosts learn alone for {host_ticks} ticks each, then push to {store}")
        fleet = run_hosts(root, [(f"host{i + 1}", seed + 101 + i, []) for i in range(hosts)],
                          host_ticks, tick, store, say=_say)
        _say("2/3: one `mlfs fleet train` round on a LocalCluster")
        trained = train_round(store, scratch=root)
        _say(f"fleet policy {trained['version']}: {trained['rows']} rows from "
             f"{trained['hosts']} hosts, validation MAE {trained['validation_mae']:.4g} "
             f"on held-out hosts, {trained['seconds']} s")
        _say(f"3/3: a newcomer from the fleet policy beside a host learning alone "
             f"(seed {seed}, {ticks} ticks)")
        pair = run_hosts(root, [("newcomer", seed, ["--fleet", str(store)]),
                                ("alone", seed, [])], ticks, tick, say=_say)
    except KeyboardInterrupt:
        print("\nmlfs demo: interrupted; cleaning up", flush=True)
        return 130
    except (MountFailed, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"mlfs demo: {exc}", file=sys.stderr)
        if getattr(exc, "output", None):
            print(exc.output, file=sys.stderr)
        return 1
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    _print_summary(fleet, pair)
    _say(f"{time.monotonic() - began:.0f} s in all; every mount and process ended")
    if keep is not None:
        _say(f"the run is kept in {root}; mlfs fleet status --store {store}")
    return 0


def _print_summary(fleet: list[dict], pair: list[dict]) -> None:
    print(f"\n{'host':<10} {'arm':<6} {'seed':>5} {'ticks':>6} {'to recommendation':>18} "
          f"{'to 95% oracle':>14} {'2nd half of oracle':>19}")
    for r in [*pair, *fleet]:
        print(f"{r['name']:<10} {r['arm']:<6} {r['seed']:>5} {r['ticks']:>6} "
              f"{_cell(r['ticks_to_recommendation']):>18} "
              f"{_cell(r['ticks_to_95pct_oracle']):>14} {r['second_half_vs_oracle']:>19.3f}")
    new, alone = pair
    print(f"\nnewcomer vs alone (seed {new['seed']}): ticks to recommendation mode "
          f"{_cell(new['ticks_to_recommendation'])} vs {_cell(alone['ticks_to_recommendation'])}; "
          f"second half {new['second_half_vs_oracle']:.3f} vs "
          f"{alone['second_half_vs_oracle']:.3f} of the oracle")
    print("(ticks counted from the model's creation; throughput is the simulated device's "
          "noise-free MB/s on the same workload, replayed from the seed)")
