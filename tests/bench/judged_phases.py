"""Issue 13, item 4 per phase: the proxy's judged estimate against the interleaved result.

    python -m tests.bench.judged_phases bench-results/dirty-win-13

For each run<N>.json with its run<N>-all.parquet (every row of the run, kept
by `fio_win --json-dir`), the judged stretch (the collaboration rows) is
replayed through the proxy's own rule (`fio_win.replay_judged`, the
pair span and settle ticks of the knob), and its counted (forward) pairs
are split by the phase of their tick (from the model's own feature): per
phase, their sum of observed over their sum of baselines against the
interleaved result of that phase, and the interleaved result weighted as
those pairs.  The estimate itself (balanced with the reverse pairs, see
mlfs/core/models/efficiency.py) weighs the workload's levels by their defaults'
sums, which is what the equal-time ratio of the runs does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mlfs.backends.linux.vm import SPECS as VM_SPECS

from mlfs.abi import knob_column
from mlfs.core.models.efficiency import Pair

from .fio_win import MODEL_FEATURES, WIN_KNOBS, replay_judged


def phase_by_tick(rows: list[dict], feature: str, checkpoint_kb: float = 300.0,
                  idle_kb: float = 16.0) -> dict[int, str]:
    """checkpoint (1 MiB calls) / tempfiles (64 KiB); a tick without writes keeps the last."""
    out: dict[int, str] = {}
    last = "none"
    for row in rows:
        size = row.get(feature) or 0.0
        if size > checkpoint_kb:
            last = "checkpoint"
        elif size > idle_kb:
            last = "tempfiles"
        out[row["tick"]] = last
    return out


def judged_by_phase(directory: Path, run: int, candidate: str = "dirty") -> dict:
    result = json.loads((directory / f"run{run}.json").read_text())
    import pyarrow.parquet as pq

    rows = sorted(pq.read_table(directory / f"run{run}-all.parquet").to_pylist(),
                  key=lambda r: r["tick"])
    feature = MODEL_FEATURES[candidate][0]
    phases = phase_by_tick(rows, feature)
    settle = {knob_column(k): VM_SPECS[k].settle_ticks for k in WIN_KNOBS[candidate]}
    judged = [r for r in rows if r["mode"] == "collaboration"]
    model = next(r["model"] for r in judged if r["model"])
    pairs: list[Pair] = []
    stats = replay_judged(judged, model, "max", settle, on_pair=pairs.append)
    mib = {c: result["conditions"][c]["mib_per_s"] for c in ("default", "mlfs")}
    out: dict = {"run": run, "judged_alone": stats.efficiency if stats else None,
                 "pairs": len(pairs), "reverse": stats.reverse_ticks if stats else 0,
                 "phases": {}}
    weighted_mlfs = weighted_default = 0.0
    for phase in result["phases"]:
        mine = [p for p in pairs if phases.get(p.tick) == phase]
        observed = sum(p.observed for p in mine)
        baseline = sum(p.baseline for p in mine)
        out["phases"][phase] = {
            "pairs": len(mine), "proxy": observed / baseline if baseline else None,
            "interleaved": mib["mlfs"][phase] / mib["default"][phase]}
        weighted_mlfs += len(mine) * mib["mlfs"][phase]
        weighted_default += len(mine) * mib["default"][phase]
    out["interleaved_weighted"] = (weighted_mlfs / weighted_default if weighted_default
                                   else None)
    out["interleaved_equal_time"] = result["ratio"]["mlfs"]["equal_time"]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m tests.bench.judged_phases DIR (with run<N>.json and "
              "run<N>-all.parquet)", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    runs = sorted(int(p.stem[3:]) for p in directory.glob("run*.json"))
    for run in runs:
        if not (directory / f"run{run}-all.parquet").exists():
            continue
        got = judged_by_phase(directory, run)
        cells = "; ".join(
            f"{phase} {c['pairs']} pairs, proxy {c['proxy']:.3f} vs interleaved "
            f"x{c['interleaved']:.3f}" if c["proxy"] is not None else
            f"{phase} no pairs (interleaved x{c['interleaved']:.3f})"
            for phase, c in got["phases"].items())
        weighted = got["interleaved_weighted"]
        print(f"run {run}: judged stretch alone {got['judged_alone']:.3f} ({got['pairs']} "
              f"pairs, {got['reverse']} reverse) vs interleaved equal-time "
              f"x{got['interleaved_equal_time']:.3f}; the pairs alone: {cells}; interleaved "
              + (f"x{weighted:.3f}" if weighted is not None else "-") + " weighted as them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
