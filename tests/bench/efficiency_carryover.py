"""Is the proxy's efficiency honest for a knob with carry-over?  (sim.readahead, virtual time)

sim.readahead with `carry_over_ticks = k` makes the workload feel
read_ahead_kb k ticks late (a reader keeps the value its files were opened
with).  For each policy, the *truth* is what an interleaved evaluation
measures: the policy on every tick against the default on every tick, over
the same ticks of the same workload (the simulator's workload and noise do
not depend on the knob: common random numbers), as total objective over total
objective.  The *estimate* is the model's `efficiency` after the same number
of ticks with the model pinned in a mode (its window as long as the run, so
both cover the same ticks), once with the knob's carry-over undeclared
(`settle_ticks = 0`: the per-tick pairing of before) and once declared
(`settle_ticks = k`: episodes, settling ticks left out).

Policies: a static recommendation (read_ahead_kb 512: better in sequential
and mmap phases, worse in strided) and the per-phase oracle (the best value
for the phase the next tick runs in, recommended at each phase change).

`--phase-ticks LO HI` shortens the simulator's phases (default 150-400
ticks) and `--learning-share` raises the ML share in learning (default
0.1), to reproduce the writeback experiment's training (share 0.8, k = 5,
phases of 15 s): several ML episodes between two default episodes, phases
shorter than that gap (mlfs/core/models/efficiency.py, "Phases shorter than the
gap").

    .venv/bin/python -m tests.bench.efficiency_carryover [--ticks 4000] [--seeds 1 2]
        [--json bench-results/efficiency-carryover.json]
    .venv/bin/python -m tests.bench.efficiency_carryover --lags 5 --modes learning \
        --phase-ticks 20 40 --learning-share 0.8 --json bench-results/efficiency-short-phases.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from mlfs.backends.sim_readahead import SimReadahead

from mlfs.config import parse_config
from mlfs.core.mount.exchange import Exchange

DEFAULT_KB = 128
POLICIES = ("static 512", "oracle")


def knob_for(policy: str, sim: SimReadahead) -> int:
    if policy == "oracle":
        return sim.best_knob_for_phase(sim.phase)
    return int(policy.split()[1])


def simulator(seed: int, k: int, phase_ticks: tuple[int, int] | None) -> SimReadahead:
    extra = {"phase_ticks": tuple(phase_ticks)} if phase_ticks else {}
    return SimReadahead(seed=seed, carry_over_ticks=k, **extra)


def truth(policy: str, k: int, seed: int, ticks: int,
          phase_ticks: tuple[int, int] | None = None) -> float:
    """Total objective with the policy on every tick over the default on every tick."""
    totals = []
    for use_policy in (True, False):
        sim = simulator(seed, k, phase_ticks)
        total = 0.0
        for _ in range(ticks):
            value = knob_for(policy, sim) if use_policy else DEFAULT_KB
            total += sim.step({"read_ahead_kb": value}).objective
        totals.append(total)
    return totals[0] / totals[1]


def estimate(policy: str, k: int, declared: bool, mode: str, seed: int, ticks: int,
             phase_ticks: tuple[int, int] | None = None, learning_share: float = 0.1) -> dict:
    """The model's efficiency after `ticks` ticks pinned in `mode`."""
    sim = simulator(seed, k, phase_ticks)
    if not declared:  # the knob carries over, but says nothing: the estimate of before
        knob = sim.knobs["read_ahead_kb"]
        sim.knobs = {"read_ahead_kb": dataclasses.replace(knob, settle_ticks=0)}
    config = parse_config(f"[modes]\nsilence_seconds = 1e9\nwindow_ticks = {ticks}\n"
                          f"learning_share = {learning_share}\n", "bench")
    with tempfile.TemporaryDirectory(prefix="mlfs-eff-") as state:
        rt = Exchange(config, Path(state), [sim]).runtimes[sim.name]
        try:
            proxy = rt.create_model("m")
            proxy.start()
            proxy.set_mode(mode.encode() + b"\n")
            current = None
            for _ in range(ticks):
                value = knob_for(policy, sim)
                if value != current:
                    proxy.recommend(f"read_ahead_kb={value}\n".encode())
                    current = value
                rt.tick()
            stats = proxy.window.stats()
            return {"efficiency": round(stats.efficiency, 4),
                    "confidence": round(stats.confidence, 2), "pairs": stats.ml_ticks,
                    "ml_ticks": proxy.ml_ticks, "episode_ticks": proxy.episode_ticks()}
        finally:
            rt.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=4000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 1, 3])
    parser.add_argument("--modes", nargs="+", default=["learning", "collaboration"])
    parser.add_argument("--phase-ticks", type=int, nargs=2, metavar=("LO", "HI"))
    parser.add_argument("--learning-share", type=float, default=0.1)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = []
    for seed in args.seeds:
        for k in args.lags:
            for policy in POLICIES:
                true = truth(policy, k, seed, args.ticks, args.phase_ticks)
                for mode in args.modes:
                    row = {"seed": seed, "carry_over_ticks": k, "policy": policy,
                           "mode": mode, "truth": round(true, 4)}
                    for declared in ((False, True) if k else (False,)):
                        got = estimate(policy, k, declared, mode, seed, args.ticks,
                                       args.phase_ticks, args.learning_share)
                        row["declared" if declared else "undeclared"] = got
                    rows.append(row)
                    line = " ".join(f"{key} {row[key]['efficiency']:.3f}"
                                    for key in ("undeclared", "declared") if key in row)
                    print(f"seed {seed} k {k} {policy:10s} {mode:13s} truth {true:.3f}  {line}",
                          flush=True)
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"ticks": args.ticks, "phase_ticks": args.phase_ticks,
             "learning_share": args.learning_share, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
