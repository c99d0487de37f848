"""What every "does mlfs beat a static value on a real subsystem" experiment shares.

Extracted from tests/bench/readahead_win.py so that each experiment (the
readahead one, the block-queue one, ...) states only its workload, its knob
and its configuration, and all run the same protocol:

1. **Training online**: the model pinned in ``learning`` mode while the
   workload's phases cycle, `trainers.worker.run_worker` (LightGBM) in a
   thread fitting and uploading policies (`train_online`).
2. **Interleaved evaluation in one mount** (`interleave`): each cycle runs
   every phase under one condition, then under the next, the order of the
   conditions rotating per cycle, so the shared machine's drifts hit all
   alike, every visit follows a different phase (the policy's first tick of
   a visit decides on the previous phase's features, as in real use), and
   the daemon's overhead is in every condition.  The conditions
   (`ModelSwitch`):

   - ``default``: the model pinned in ``emergency``: the default algorithm,
     the values in place when mlfs started;
   - ``best static``: the model pinned in ``recommendation`` (no probe
     ticks) with a recommendation without ttl: the sweep's best value;
   - ``mlfs``: pinned in ``recommendation``, its policy deciding every tick.

3. **Reporting**: per phase and overall, work over time (`rates`): a visit
   does fixed work, so the "overall" MiB/s is the job's total bytes over its
   time, and the median [min, max] over runs (`table`).  The overall
   *ratio* to the default is the one rule, `scoring.overall` of the
   per-phase ratios (equal work per phase), not the ratio of the overall
   MiB/s (which weighs phases by the work a visit happened to do).

Plus the set-up pieces: a child memory cgroup (`memory_cgroup`), sysfs
writes with a single write(2) (`write_attr`).  Restoring the knobs is the
backends' ledger's job (the daemon restores on unmount); each experiment
checks the knobs are back to their originals at the end.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.bench import scoring

MIB = 1 << 20
CONDITIONS = ("default", "best static", "mlfs")

#: {phase: [work, seconds]} of one condition over a run
Acc = dict[str, list]


# ---- the memory cgroup the workload runs in ----------------------------------------------
@contextmanager
def memory_cgroup(limit_bytes: int, prefix: str = "mlfs-readahead") -> Iterator[Path]:
    """A child memory cgroup of this process's own, limited to `limit_bytes`.

    Yields its ``cgroup.procs`` (a process joins by writing its pid there).
    The page cache a process fills is charged to its cgroup, so the limit
    bounds how much of the file the workload can keep cached: a file larger
    than the limit stays mostly uncached, as a data set larger than RAM does.
    cgroup v1 (memory.limit_in_bytes) and v2 (memory.max) are both handled.
    """
    base = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit_file = "memory.limit_in_bytes"
            break
    if base is None:  # cgroup v2: the unified hierarchy
        path = next(ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::"))
        for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            if (Path(mount) / "cgroup.controllers").exists():
                base, limit_file = Path(mount) / path.lstrip("/"), "memory.max"
                break
    if base is None or not base.is_dir():
        raise RuntimeError("no memory cgroup to create a child in")
    group = base / f"{prefix}-{os.getpid()}"
    group.mkdir()
    try:
        try:
            (group / limit_file).write_text(f"{limit_bytes}\n")
        except OSError as exc:
            raise RuntimeError(f"cannot limit memory in {group}: {exc}") from None
        yield group / "cgroup.procs"
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except OSError:  # its last process is still exiting
                if time.monotonic() > deadline:
                    print(f"could not remove {group}", file=sys.stderr)
                    break
                time.sleep(0.05)


def write_attr(path: Path, text: str) -> None:
    """One write(2) of `text` (an mlfs attribute takes one write as one command)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def wait_for(check: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


# ---- training ----------------------------------------------------------------------------
def model_gauges(mdir: Path) -> dict[str, float | str]:
    """The model's mode and efficiency gauges, read from the mount's `metrics` file."""
    labels = f'subsystem="{mdir.parents[1].name}",model="{mdir.name}"'
    out: dict[str, float | str] = {}
    for line in (mdir.parents[2] / "metrics").read_text().splitlines():
        if labels not in line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0]
        if metric == "mlfs_model_mode":
            if float(value) == 1.0:
                out["mode"] = name.split('mode="', 1)[1].split('"', 1)[0]
        elif metric.startswith("mlfs_model_efficiency") or metric == \
                "mlfs_model_incumbent_efficiency":
            out[metric.removeprefix("mlfs_model_")] = float(value)
    return out


def train_online(mountpoint: Path, subsystem: str, model: str, run_cycle: Callable[[], None],
                 seconds: float, *, explore_ticks: int, seed: int,
                 log: logging.Logger, features: list[str] | None = None,
                 switching: str = "pinned") -> dict:
    """Train `model` while `run_cycle()` repeats for `seconds`.

    The trainer (`run_worker`, relative error: the phases' objectives differ
    by orders of magnitude) runs in a thread; its statistics are returned
    with the wall time and the policy's size.  `switching` ``pinned``: the
    model is pinned in learning (it keeps exploring; the caller pins the
    next mode); ``auto``: the mode machine switches it as in real use, and
    the result's ``modes`` is the timeline (seconds, mode, efficiency and its
    interval, read from `metrics` after every cycle) and ``left_learning``
    the seconds until it first left learning (None: it never did).
    `features`: as `mlfs train --features` (default all).
    """
    from mlfs.trainers.knob.worker import run_worker

    mdir = mountpoint / subsystem / "models" / model
    os.mkdir(mdir)
    # pinned: keep exploring while training; auto: the mode machine decides, from learning
    write_attr(mdir / "mode", "learning\n" if switching == "pinned" else "auto\n")
    stop = threading.Event()
    stats: dict = {}

    def train() -> None:
        stats.update(run_worker(str(mountpoint), subsystem, model, stop=stop,
                                max_seconds=seconds + 60, log=log,
                                learning_ttl=explore_ticks, relative=True, seed=seed,
                                features=features))

    trainer = threading.Thread(target=train, name="trainer", daemon=True)
    trainer.start()
    started = time.monotonic()
    timeline: list[dict] = []
    while time.monotonic() - started < seconds:
        run_cycle()
        if switching != "pinned":
            timeline.append({"t": round(time.monotonic() - started, 1), **model_gauges(mdir)})
    stop.set()
    trainer.join(timeout=60)
    policy = (mdir / "policy").read_text()
    extra: dict = {}
    if switching != "pinned":
        left = next((g["t"] for g in timeline if g.get("mode") != "learning"), None)
        extra = {"modes": timeline, "left_learning": left}
    return {
        **extra,
        "train_seconds": round(time.monotonic() - started, 1),
        "trainer": {k: stats.get(k) for k in ("fits", "corrections", "policies",
                                               "recommendations", "explorations",
                                               "rows", "val_mae", "val_mae_naive")},
        "policy_bytes": len(policy),
    }


def efficiency_by_source(mdir: Path, since_tick: int = 0) -> dict[str, dict]:
    """Per feedback `source` (policy, recommendation, incumbent): the ML ticks with a
    resolved pair since `since_tick` and their efficiency, sum(observed) /
    sum(baseline).  Tells what the learning window averaged: the policy's own ticks
    or the trainer's explorations (recommendations in learning)."""
    import pyarrow.dataset as ds

    time.sleep(2.5)  # the last rows sealed (feedback_seal_seconds 1 s)
    rows = ds.dataset(str(mdir / "feedback"), format="parquet").to_table(
        columns=["tick", "source", "observed", "baseline"]).to_pylist()
    sums: dict[str, list[float]] = {}
    for row in rows:
        if row["tick"] < since_tick or row["baseline"] is None or row["observed"] is None:
            continue
        acc = sums.setdefault(row["source"], [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += row["observed"]
        acc[2] += row["baseline"]
    return {source: {"ticks": n, "efficiency": round(obs / base, 3) if base else None}
            for source, (n, obs, base) in sorted(sums.items())}


# ---- the conditions -----------------------------------------------------------------------
class ModelSwitch:
    """Puts a model's subsystem under one of `CONDITIONS` through its attributes.

    `default` / `best`: the knob assignments as ``recommend`` takes them
    (``read_ahead_kb=128``); `settled(condition)` returns once the knobs hold
    the condition's values (the caller's check); `tick`: the subsystem's tick.
    """

    def __init__(self, mdir: Path, default: str, best: str, tick: float,
                 settled: Callable[[str], None]) -> None:
        self.mdir, self.default, self.best, self.tick = mdir, default, best, tick
        self.settled = settled

    def __call__(self, condition: str) -> None:
        mdir = self.mdir
        if condition == "best static":
            write_attr(mdir / "mode", "recommendation\n")
            write_attr(mdir / "recommend", f"{self.best}\n")
            self.settled(condition)
        elif condition == "default":
            # supersede the static one; it expires during this visit
            write_attr(mdir / "recommend", f"{self.default} ttl=1\n")
            write_attr(mdir / "mode", "emergency\n")
            self.settled(condition)
        else:  # the policy decides, once a best-static recommendation is superseded
            write_attr(mdir / "mode", "recommendation\n")
            write_attr(mdir / "recommend", f"{self.best} ttl=1\n")
            time.sleep(3 * self.tick)  # the ttl=1 recommendation runs out


def interleave(repeats: int, cycles: int, switch: Callable[[str], None],
               run_cycle: Callable[[str], Acc], phases: Sequence[str],
               after_run: Callable[[int, dict[str, Acc]], None]) -> None:
    """`repeats` runs of `cycles` cycles, each cycle every condition in rotated order.

    `run_cycle(condition)` runs every phase once and returns {phase: [work,
    seconds]}; `after_run(rep, acc)` gets each run's totals per condition.
    """
    for rep in range(repeats):
        acc = {c: {p: [0, 0.0] for p in phases} for c in CONDITIONS}
        for cycle in range(cycles):
            shift = (rep * cycles + cycle) % len(CONDITIONS)
            for condition in CONDITIONS[shift:] + CONDITIONS[:shift]:
                switch(condition)
                for phase, (done, secs) in run_cycle(condition).items():
                    acc[condition][phase][0] += done
                    acc[condition][phase][1] += secs
        after_run(rep, acc)


# ---- reporting ----------------------------------------------------------------------------
def rates(acc: Acc, unit: float = MIB) -> dict:
    """Work per second per phase and overall (total work over total time)."""
    total = (sum(b for b, _ in acc.values()), sum(s for _, s in acc.values()))
    mib = {p: b / unit / s if s else 0.0 for p, (b, s) in acc.items()}
    mib["overall"] = total[0] / unit / total[1] if total[1] else 0.0
    return {"mib_per_s": mib, "seconds": total[1]}


def fmt(run: dict) -> str:
    return " ".join(f"{k} {v:7.1f}" for k, v in run["mib_per_s"].items())


def summarize(runs: list[dict], phases: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for key in (*phases, "overall"):
        values = [r["mib_per_s"][key] for r in runs]
        out[key] = ((statistics.median(values), min(values), max(values)) if values
                    else (0.0, 0.0, 0.0))
    return out


def table(results: dict[str, list[dict]], phases: Sequence[str],
          unit: str = "application MiB/s") -> str:
    summaries = {name: summarize(runs, phases) for name, runs in results.items() if runs}
    base = next(iter(summaries.values()), None)  # the first condition: the default
    head = f"{'condition':22s}" + "".join(f"{k:>28s}" for k in (*phases, "overall"))
    lines = [head, "-" * len(head)]
    for name, summary in summaries.items():
        cells = []
        ratios = {p: summary[p][0] / base[p][0] for p in phases
                  if base and base[p][0] > 0}
        for key in (*phases, "overall"):
            med, lo, hi = summary[key]
            if key == "overall":
                ratio = (f" x{scoring.overall(ratios):.2f}" if len(ratios) == len(phases)
                         else "")
            else:
                ratio = f" x{ratios[key]:.2f}" if key in ratios else ""
            cells.append(f"{med:7.1f} [{lo:6.1f},{hi:6.1f}]{ratio}")
        lines.append(f"{name:22s}" + "".join(f"{c:>28s}" for c in cells))
    lines.append(f"({unit}: median [min, max] over runs; xN = median / default; overall "
                 "xN = scoring.overall of the phases' xN, equal work per phase)")
    return "\n".join(lines)


# ---- the best static and the oracle without winner's curse ---------------------------------
def interleaved_sweep(settings: Sequence, rounds: int,
                      visit: Callable[[object, int], Mapping[str, float]]) -> list[dict]:
    """`rounds` rounds of every setting once, the order rotating per round, so drifts
    of the machine hit every setting alike; `visit(setting, round)` runs every phase
    under `setting` and returns {phase: rate}.  The rounds, [{setting: {phase: rate}}],
    for `held_out`."""
    out = []
    for n in range(rounds):
        shift = n % len(settings)
        out.append({s: dict(visit(s, n)) for s in [*settings[shift:], *settings[:shift]]})
    return out


def _mean_rates(rounds: Sequence[Mapping]) -> dict:
    settings = rounds[0].keys()
    return {s: {p: statistics.fmean(r[s][p] for r in rounds) for p in rounds[0][s]}
            for s in settings}


def held_out(rounds: Sequence[Mapping], phases: Sequence[str], default: object) -> dict:
    """The best static setting and the per-phase oracle chosen on one half of the
    interleaved rounds (the even ones) and measured on the other (the odd ones).

    The maximum of noisy measurements is biased up (the winner's curse): a setting
    picked on a sweep is read again on the same visits that made it win, so a sweep's
    x1.22 could read x0.85 interleaved.  Chosen and measured on different visits, the
    figure is unbiased.  Both are returned: `*_in_sample` (chosen and measured on the
    choosing half) and `*_held_out` (measured on the other), each the `scoring.overall`
    ratio to `default` on the same half.  Needs at least two rounds."""
    if len(rounds) < 2:
        raise ValueError("held_out needs at least two rounds (one to choose, one to measure)")
    choose, measure = _mean_rates(rounds[0::2]), _mean_rates(rounds[1::2])

    def vs_default(rates: dict, pick: Mapping[str, object]) -> float:
        return scoring.overall({p: rates[pick[p]][p] / rates[default][p]
                                if rates[default][p] else 0.0 for p in phases})

    static = {s: vs_default(choose, dict.fromkeys(phases, s)) for s in choose}
    best = max(static, key=static.__getitem__)
    oracle = {p: max(choose, key=lambda s, p=p: choose[s][p]) for p in phases}
    return {
        "best_static": best,
        "best_static_in_sample": static[best],
        "best_static_held_out": vs_default(measure, dict.fromkeys(phases, best)),
        "oracle": oracle,
        "oracle_in_sample": vs_default(choose, oracle),
        "oracle_held_out": vs_default(measure, oracle),
        "rounds": len(rounds),
    }


def held_out_text(found: dict) -> str:
    """One line: the held-out best static and oracle beside their in-sample figures."""
    return (f"best static {found['best_static']}: x{found['best_static_held_out']:.2f} held out "
            f"(x{found['best_static_in_sample']:.2f} where chosen); oracle "
            f"{found['oracle']}: x{found['oracle_held_out']:.2f} held out "
            f"(x{found['oracle_in_sample']:.2f} where chosen), over {found['rounds']} rounds")


def rounds_of(values: Mapping[str, Mapping[str, Sequence[float]]]) -> list[dict]:
    """tests.bench.sweep's {setting: {phase: [rate per round]}} as `held_out`'s rounds
    (its rounds are interleaved already: every setting once per round, rotating)."""
    count = min(len(v) for phases in values.values() for v in phases.values())
    return [{s: {p: v[n] for p, v in phases.items()} for s, phases in values.items()}
            for n in range(count)]
