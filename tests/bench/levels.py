"""Where a knob model stands at each workload level, from its saved pairs (`measured.json`).

Pinned in recommendation, a policy decides only at a level where its own interval
reaches the incumbent's estimate (`Incumbent.pinned`); after 180 s of read-ahead
training it was proven at none, after 600 s at the scan's.  The model's `incumbent`
file shows the standing only at the current level, so this reads the pairs a mount
saved in the model's state directory (`safe_set_file`, written when the mount
closes) and shows every level's: the pairs and episodes behind it, the incumbent,
the policy's interval and whether it holds there.  `--tail F` judges the policy on
its latest fraction F of ticks only: whether the early policies of a training, which
the policy's arm pools with the late ones, are what hold its interval down.

    python -m tests.bench.levels RUN-pairs.json [--tail 0.5]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from mlfs.base.durable import read_bounded
from mlfs.base.errors import Refused
from mlfs.core.models.incumbent import Incumbent
from mlfs.core.models.safe_set import LEVEL_RATIO, SafeSet
from mlfs.core.models.safe_set_file import MAX_BYTES, decode

#: a level cluster shown needs at least this many pairs (one: a level with a single pair
#: is itself the finding, after 180 s of read-ahead training)
MIN_PAIRS = 1


def load(path: Path) -> SafeSet:
    data = read_bounded(path, MAX_BYTES)  # TooLarge beyond it, not a cut-off JSON
    saved = json.loads(data)
    columns = {column for setting in saved["settings"] for column, _ in setting}
    return decode(data, columns)


def levels(baselines: np.ndarray) -> list[float]:
    """Cluster centres of the pairs' baselines: sorted, a new cluster wherever the next
    baseline is beyond LEVEL_RATIO of the cluster's first; each cluster's median."""
    centres, start = [], 0
    ordered = np.sort(baselines)
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] > ordered[start] * LEVEL_RATIO:
            if i - start >= MIN_PAIRS:
                centres.append(float(np.median(ordered[start:i])))
            start = i
    return centres


def tail_only(safe: SafeSet, fraction: float) -> SafeSet:
    """`safe` with the model's own pairs kept only from its latest `fraction` of ticks."""
    settings, pairs = safe.held()
    by_model = pairs["by_model"]
    ticks = pairs["tick"][by_model]
    cut = np.quantile(ticks, 1.0 - fraction) if len(ticks) else 0
    out = SafeSet()
    for slot, b, r, t, m in zip(pairs["slot"], pairs["baseline"], pairs["ratio"],
                                pairs["tick"], by_model, strict=True):
        if m and t < cut:
            continue
        out.measured(settings[int(slot)], float(b), float(r), int(t), bool(m))
    return out


def report(safe: SafeSet) -> list[str]:
    settings, pairs = safe.held()
    lines = [f"{len(pairs['slot'])} pairs, {int(pairs['by_model'].sum())} the model's, "
             f"{len(settings)} settings, ticks {int(pairs['tick'].min())}-"
             f"{int(pairs['tick'].max())}"] if len(pairs["slot"]) else ["no pairs"]
    for level in levels(pairs["baseline"]):
        safe.default_tick(level)
        incumbent = Incumbent(safe)
        standing = incumbent.standing()
        slots, _, _, by_model = safe.at_level()
        policy = standing.policy
        inc = "default" if standing.incumbent is None else " ".join(
            f"{k}={v}" for k, v in standing.incumbent.knobs.items()) + \
            f" {standing.incumbent.interval.text} ({standing.incumbent.interval.episodes} ep)"
        lines.append(
            f"level {level:10.1f}: {len(slots):4d} pairs ({int(by_model.sum())} the model's, "
            f"{policy.episodes} episodes); incumbent {inc}; policy {policy.text}"
            f" mean {policy.estimate:.3f}; holds here: {standing.policy_holds_here}")
        arms, _ = incumbent.arms()
        for arm in sorted(arms, key=lambda a: -a.interval.episodes)[:6]:
            setting = " ".join(f"{k}={v}" for k, v in arm.knobs.items())
            lines.append(f"      arm {setting:28s} {arm.interval.text} "
                         f"mean {arm.estimate:.3f} over {arm.interval.episodes} episodes")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", type=Path, help="a model's measured.json")
    parser.add_argument("--tail", type=float, default=None,
                        help="judge the policy on its latest fraction of ticks only")
    args = parser.parse_args(argv)
    try:
        safe = load(args.pairs)
    except (OSError, ValueError, Refused) as exc:  # unreadable, not JSON, or a bad field
        print(f"levels: {args.pairs}: {exc}", file=sys.stderr)
        return 2
    if args.tail is not None:
        if not 0 < args.tail <= 1 or math.isnan(args.tail):
            print("levels: --tail is a fraction in (0, 1]", file=sys.stderr)
            return 2
        safe = tail_only(safe, args.tail)
    print("\n".join(report(safe)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
