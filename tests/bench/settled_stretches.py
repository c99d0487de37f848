"""How much evidence a carry-over knob's training rows hold, per phase and setting.

A dirty-ratio run's trainer fits on settled rows only (the setting in place for its
carry-over), and neighbouring ticks share most of the objective's rate window, so the
unit of evidence is a settled stretch (consecutive settled rows at one setting with a
finite objective), not a tick.  This prints, per run of an archived dirty experiment and
per phase, every setting's settled rows, stretches and ratio to the default, the
default's spread per tick and per stretch, and the correlation of neighbouring ticks:
the figures behind docs/results/against-fixed.md, "Why the dirty ratios' training
proves nothing".

    .venv/bin/python -m tests.bench.settled_stretches bench-results/incumbent-dirty.tar.xz \\
        bench-results/incumbent-dirty-cover.tar.xz
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile

import numpy as np
import pyarrow.parquet as pq
from mlfs.backends.linux.vm import SPECS

from mlfs.abi import knob_column

NAME = "dirty_background_ratio"
KNOB = knob_column(NAME)
#: the checkpoint phase writes in 1 MiB calls, temporary files in 64 KiB ones
PHASE_FEATURE, BULK_KB = "bulk_write_kb_per_call", 512
#: the knob's carry-over (linux.vm's table): rows before it are unsettled
SETTLE_TICKS = SPECS[NAME].settle_ticks


def stretches(settings: np.ndarray, objective: np.ndarray, phase: np.ndarray,
              settle: int = SETTLE_TICKS) -> list[np.ndarray]:
    """Row indices of each settled stretch: consecutive rows at one setting and phase,
    each at least `settle` ticks after the setting changed, with a finite objective."""
    since = np.zeros(len(settings), dtype=int)
    for i in range(1, len(settings)):
        since[i] = since[i - 1] + 1 if settings[i] == settings[i - 1] else 0
    ok = (since >= settle) & np.isfinite(objective)
    out: list[list[int]] = []
    for i in np.flatnonzero(ok):
        last = out[-1][-1] if out else None
        if last == i - 1 and settings[last] == settings[i] and phase[last] == phase[i]:
            out[-1].append(int(i))
        else:
            out.append([int(i)])
    return [np.array(s) for s in out]


def describe(table, label: str, default: int) -> list[str]:
    """The lines for one run's training rows; `default`: the knob's value before the run
    (the run's `original`)."""
    frame = table.to_pandas()
    settings = frame[KNOB].to_numpy()
    objective = frame["objective"].to_numpy(dtype=float)
    phase = np.where(frame[PHASE_FEATURE].to_numpy() >= BULK_KB, "bulk", "small")
    lines = []
    found = stretches(settings, objective, phase)
    for name in ("bulk", "small"):
        mine = [s for s in found if phase[s[0]] == name]
        baseline = [s for s in mine if settings[s[0]] == default]
        if not baseline:
            continue
        ticks = np.concatenate([objective[s] for s in baseline])
        means = np.array([objective[s].mean() for s in baseline])
        pairs = [(objective[s][:-1], objective[s][1:]) for s in baseline if len(s) > 1]
        a = np.concatenate([p[0] for p in pairs]) - ticks.mean()
        b = np.concatenate([p[1] for p in pairs]) - ticks.mean()
        cells = []
        for value in sorted({int(settings[s[0]]) for s in mine}):
            rows = np.concatenate([objective[s] for s in mine if settings[s[0]] == value])
            count = sum(1 for s in mine if settings[s[0]] == value)
            cells.append(f"{value}%: {len(rows)} rows, {count} stretches, "
                         f"x{rows.mean() / ticks.mean():.2f}")
        spread = means.std(ddof=1) / means.mean() if len(means) > 1 else float("nan")
        per_tick = ticks.std() / ticks.mean()
        lines.append(f"{label} {name} writes: default per tick cv {per_tick:.2f}, "
                     f"per stretch cv {spread:.2f}, neighbours' correlation "
                     f"{(a * b).mean() / ticks.var():.2f}; " + "; ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="+", help="bench-results/<experiment>.tar.xz")
    args = parser.parse_args(argv)
    for path in args.archives:
        try:
            with tarfile.open(path) as tar:
                members = sorted(m for m in tar.getnames()
                                 if re.search(r"run\d+-train\.parquet$", m))
                if not members:
                    print(f"{path}: no run<N>-train.parquet", file=sys.stderr)
                    return 2
                for name in members:
                    run = json.loads(tar.extractfile(
                        name.replace("-train.parquet", ".json")).read())
                    data = tar.extractfile(name).read()
                    print("\n".join(describe(pq.read_table(io.BytesIO(data)), name,
                                              int(run["original"][NAME]))))
        except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
