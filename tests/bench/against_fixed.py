"""README's table "against the best fixed setting": every real-device tuning experiment,
judged as an operator would judge mlfs (issue 53).

An operator compares mlfs with the best thing they could do without it: a fixed setting
found by a sweep.  So each experiment's runs are scored against the sweep's best static
setting *held out* (chosen on the sweep's even rounds, measured interleaved with mlfs in
the evaluation: `win_harness.held_out`, no winner's curse), and the gap mlfs could close
is the held-out oracle (the per-phase best, chosen and measured the same way) over that
best static setting.  Per experiment, over its runs (median [min–max]):

- ``× default``: mlfs over the interleaved default, equal work per phase
  (`scoring.overall`);
- ``× best fixed``: mlfs over the held-out best static setting, both from the interleaved
  evaluation of the same run; the target is >= 0.98;
- ``oracle ÷ best fixed``: the held-out oracle over the held-out best static setting,
  from the sweep's measuring rounds: what a per-phase choice could gain;
- ``gap captured``: (× best fixed - 1) / (oracle ÷ best fixed - 1), only where that gap
  is >= 1.10 (below, the best fixed setting leaves nothing worth learning); the target
  is >= 50 % in at least two experiments.  A run whose sweep had one round has no
  held-out oracle: its gap is not shown, and the row says so.

An experiment without runs in bench-results/ has a row that says it was not run: the
table lists what the project claims to tune, measured or not.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tests.bench import scoring

#: (folder in bench-results/, experiment, how its runs are stored, command: every option
#: that differs from the bench's defaults, as `command_differs` checks against the options
#: the runs stored, but `--runs`, `--seed` and where the outputs go)
EXPERIMENTS = (
    ("incumbent-readahead-level-age", "read-ahead, files reopened", "readahead",
     "tests.bench.readahead_win --file-mib 512 --memory-mib 64 --phase-seconds 2 "
     "--cycles 2 --grid 0,32,128,512,2048 --train-seconds 180 --learning-share 0.5"),
    ("incumbent-readahead-fio-probes", "read-ahead, files kept open", "fio",
     "tests.bench.readahead_fio_win --seconds 4 --train-seconds 180 --train-phase 4"),
    ("incumbent-dirty", "dirty ratios: checkpoints, temporary files", "fio",
     "tests.bench.dirty_win --learning-share 0.5 --sweep-rounds 1"),
    ("incumbent-dirty-bursts", "dirty ratios: bursts shorter than the carry-over", "fio",
     "tests.bench.dirty_win --phases stream-burst,wal-commit --seconds 6 --train-phase 6 "
     "--train-seconds 420 --judge-seconds 180 --learning-share 0.5"),
    ("incumbent-writeback-episode", "writeback: streams, commits, reads", "fio",
     "tests.bench.writeback_win --seconds 4 --train-seconds 240 --train-phase 15 "
     "--learning-share 0.5"),
    ("incumbent-queue", "block queue: mixed, sequential, commits", "fio",
     "tests.bench.queue_win --seconds 4 --train-seconds 180 --train-phase 5"),
    ("incumbent-queue-oltp-probes", "block queue: fast-alternating OLTP and backup", "fio",
     "tests.bench.queue_win --phases oltp,backup-read --seconds 3 --train-seconds 180 "
     "--train-phase 3"),
)
#: a run's stored options that say how many runs there were, which one this is or where
#: the outputs went, not what was measured
BOOKKEEPING = frozenset({"runs", "seed", "json", "json_dir", "keep_pairs", "verbose",
                         "quick"})
#: the targets (issue 53)
VS_BEST_TARGET = 0.98
VS_DEFAULT_TARGET = 1.00
GAP_WORTH = 1.10
CAPTURE_TARGET = 0.50


@dataclass(frozen=True)
class RunScore:
    vs_default: float
    vs_best: float
    #: held-out oracle over held-out best static; None for a run whose sweep had one
    #: round (its oracle was chosen and measured on the same visits: not shown)
    gap: float | None

    @property
    def captured(self) -> float | None:
        if self.gap is None or self.gap < GAP_WORTH:
            return None
        return (self.vs_best - 1.0) / (self.gap - 1.0)


def fio_score(run: dict) -> RunScore:
    """One fio_win run (its per-phase ratios to the interleaved default)."""
    phases = run["phases"]
    mlfs = scoring.overall({p: run["ratio"]["mlfs"][p] for p in phases})
    best = scoring.overall({p: run["ratio"]["best static"][p] for p in phases})
    held = run["sweep"].get("held_out")
    if held is None:  # `--sweep-rounds 1`: the best static is still held out (measured
        return RunScore(mlfs, mlfs / best, None)  # in the evaluation), the oracle is not
    return RunScore(mlfs, mlfs / best, held["oracle_held_out"] / held["best_static_held_out"])


def command_differs(command: str, stored: dict) -> dict[str, tuple]:
    """The options where an experiment's `command`, parsed as its bench parses it, and
    one run's `stored` options differ ({} when the command reproduces the run).  README's
    read-ahead command said `--train-seconds 180 --learning-share 0.5` while the runs had
    a 512 MiB file, a 64 MiB cgroup and 2 s visits: run as printed, it measured another
    experiment.  Options a run does not store (older runs, or an option added since) are
    not compared."""
    module, *argv = command.split()
    if module == "tests.bench.readahead_win":
        from tests.bench import readahead_win
        parsed = vars(readahead_win.parse_args(argv))
    else:
        from tests.bench import fio_win
        parsed = vars(fio_win.parse_args(stored["candidate"], argv))
    return {name: (parsed.get(name), value) for name, value in stored.items()
            if name not in BOOKKEEPING and _plain(parsed.get(name)) != _plain(value)}


def _plain(value: object) -> object:
    """An option as JSON keeps it (a tuple comes back a list)."""
    return list(value) if isinstance(value, tuple) else value


def readahead_score(data: dict) -> RunScore:
    """One readahead_win run: per-phase medians of its interleaved repeats."""
    cond = {k.split(" (")[0]: v for k, v in data["results"].items()}
    phases = [p for p in cond["default"][0]["mib_per_s"] if p != "overall"]
    med = {c: {p: statistics.median(r["mib_per_s"][p] for r in runs) for p in phases}
           for c, runs in cond.items()}
    mlfs = scoring.overall(scoring.phase_ratios(med["mlfs"], med["default"], phases))
    best = scoring.overall(scoring.phase_ratios(med["best static"], med["default"], phases))
    held = data["mlfs"]["held_out"]
    return RunScore(mlfs, mlfs / best, held["oracle_held_out"] / held["best_static_held_out"])


def _spread(values: Sequence[float], fmt: str = "×{:.2f}") -> str:
    if not values:
        return "–"
    values = [round(v, 4) + 0.0 for v in values]  # + 0.0: no "-0%" for a -0.0007 share
    if "%" in fmt:
        values = [round(v, 2) + 0.0 for v in values]
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} [{fmt.format(min(values)).lstrip('×')}–{fmt.format(max(values)).lstrip('×')}]"


def row(experiment: str, command: str, scores: Sequence[RunScore], commits: Sequence[str]
        ) -> list[str]:
    """One line of the table: the figures, whether the targets are met, the runs."""
    if not scores:
        return [experiment, "not run since the incumbent", "–", "–", "–", "–"]
    vs_best = [s.vs_best for s in scores]
    vs_default = [s.vs_default for s in scores]
    captured = [c for c in (s.captured for s in scores) if c is not None]
    gaps = [s.gap for s in scores if s.gap is not None]
    unheld = len(scores) - len(gaps)
    met = (statistics.median(vs_best) >= VS_BEST_TARGET
           and statistics.median(vs_default) >= VS_DEFAULT_TARGET)
    runs = f"{len(scores)} run{'s' if len(scores) != 1 else ''}"
    if len(scores) < 3:
        runs = f"**{runs}** (3 wanted)"
    at = ", ".join(sorted(set(commits))) or "commit not recorded"
    return [experiment,
            _spread(vs_default),
            _spread(vs_best) + (" ✓" if met else " ✗"),
            _gap_text(gaps, unheld),
            _spread(captured, "{:.0%}") if captured else (
                "no gap ≥ ×1.10" if gaps else "–"),
            f"{runs} at {at}; `python -m {command}`"]


def _gap_text(gaps: Sequence[float], unheld: int) -> str:
    """The held-out gaps, and how many runs had none (one sweep round)."""
    if not unheld:
        return _spread(gaps)
    said = f"{unheld} run{'s' if unheld != 1 else ''} with one sweep round: not held out"
    return f"{_spread(gaps)} ({said})" if gaps else said


HEADER = ["experiment", "× default", "× best fixed (held out)", "oracle ÷ best fixed",
          "gap captured", "runs"]


def table(scored: dict[str, tuple[list[RunScore], list[str]]]) -> list[str]:
    """The Markdown table, a line per experiment of EXPERIMENTS (`scored`: folder ->
    (its runs' scores, the commits they measured))."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for folder, experiment, _, command in EXPERIMENTS:
        scores, commits = scored.get(folder, ([], []))
        lines.append("| " + " | ".join(row(experiment, command, scores, commits)) + " |")
    return lines
