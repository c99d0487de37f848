"""Does mlfs beat the default and the best static value of a kernel subsystem on fio workloads?

Issue 13's experiment, for a subsystem whose knobs act at once on running
I/O (unlike read_ahead_kb, which reaches only files opened after a change).
The candidates and their phases are tests/bench/sweep.py's (``queue``: the
loop device's scheduler and nr_requests; ``writeback``: the vm.dirty_*
sysctls); the phases are fio job files from tests/bench/workloads/.
`queue_win.py` / `writeback_win.py` run it for one candidate.

Each run is independent: a new sparse image as a direct-io loop device
with a new ext4 (files laid out once, discarded), a new sweep, a new mount,
a new training:

1. **Sweep** (no daemon; the backend's `KnobController` writes the knobs and
   restores them): every setting of the candidate's grid, `--sweep-rounds`
   rounds in rotated order, the phases one after the other.  The best static
   setting is the best "overall"; the per-phase best is the oracle.  With two
   rounds or more the best static is chosen on the even rounds and measured on
   the odd ones (`win_harness.held_out`: no winner's curse), both figures shown.
2. **Training**: mlfs mounts serving the subsystem (`CONFIGS`), tick 1 s.
   fio runs each phase with ``--status-interval=1``; the glue
   (`fio_phases.FioStream`) turns each report into the application's MiB/s
   over the last second and writes it to the subsystem's ``objective``
   (fio's own figure, from the application's side: a kernel counter such as
   the device's MB/s would count a backup's writeback and a throttled
   writer's parked pages as work).  `trainers.worker.run_worker` trains
   online for `--train-seconds` with the model pinned in ``learning``.
3. **Evaluation** (win_harness.interleave): default / best static / mlfs,
   each cycle every phase under one condition, the order rotated per cycle.

Visits are time-based (`--seconds` of fio each); a phase's figure is fio's
bytes over fio's runtime of the application's jobs (bg-* jobs are load).
"overall" is `scoring.overall` of the per-phase ratios to the interleaved
default of the same run: the speed-up of a job made of equal *work* per
phase (the harmonic mean of the phase ratios), the rule the sweep picks the
best static value and the oracle by.  Runs before issue 33 scored it as
work over time in units of the sweep's default, a time-weighted arithmetic
mean of the phase speed-ups; `python -m tests.bench.results` rescores them
from the per-phase ratios in their JSON.  Beside it, ``equal_time``: the
ratio of the summed per-phase MiB/s, the speed-up of a job spending equal
*time* per phase (what the proxy's efficiency weighs by).  The per-phase
ratios are paired per run (same cycles, interleaved).

Output: per run a JSON (`--json-dir`, run<N>.json) with the sweep, the best
static, the oracle, every condition's per-phase MiB/s, the knob values in
effect per phase per condition (0.2 s samples), the training statistics
and the model's ``efficiency``; and a summary over runs.  Everything is
restored: the sweep's controller and the daemon's ledger put the knobs back,
the script checks them against the originals at the end of each run (and
restores them itself if not), detaches the loop device.

    .venv/bin/python -m tests.bench.writeback_win --quick        # one run, ~10 min
    .venv/bin/python -m tests.bench.queue_win --runs 3 --json-dir bench-results/queue-win
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from mlfs.backends.linux.files import parse_bracketed, read_text

from tests.bench import scoring
from tests.bench import sweep as sweeps
from tests.bench.fio_phases import MIB, FioStream, run_phase, settle
from tests.bench.provenance import measured_commit
from tests.bench.readahead_experiment import scratch_filesystem
from tests.bench.win_harness import (
    CONDITIONS,
    ModelSwitch,
    held_out,
    held_out_text,
    interleave,
    rounds_of,
    train_online,
    wait_for,
    write_attr,
)
from tests.harness import Mount, fuse_unavailable

MODEL = "lgbm"
TICK = 1.0  # fio reports once a second at most

_STORE = """
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0
feedback_seal_seconds = 1.0
journal_seal_seconds = 1.0

[modes]
learning_share = {share}
recommendation_probe = 0.0
silence_seconds = 3600.0
"""

CONFIGS = {
    "queue": _STORE + """
[[subsystem]]
backend = "linux.block"
devices = ["{device}"]
tick_seconds = 1.0
objective = "application"
objective_unit = "MiB/s"
apply = {{scheduler = ["none", "mq-deadline", "kyber", "bfq"], nr_requests = [8, 256]}}
tracepoints = false
""",
    "writeback": _STORE + """
[[subsystem]]
backend = "linux.vm"
tick_seconds = 1.0
objective = "application"
objective_unit = "MiB/s"
critical_full_avg10 = 100.0

apply = {{dirty_ratio = [2, 80], dirty_background_ratio = [1, 40]}}
""",
}


# the background ratio alone: the checkpoint's gain is early writeback, which a low
# background ratio gives under any limit (docs/results/dirty-sweep-capped.md: 1/20 and 1/80
# as good for it as 1/2), and 8 values can be explored in minutes where the 64 pairs of
# both ratios could not (bench-results/dirty-win-3: 40 explorations, none below 4 %).
# At most the default 10 %: at or above the dirty_ratio (20 %) the kernel takes half
# the dirty limit as the background one (mm/page-writeback.c, domain_dirty_limits),
# so 20, 32 and 40 % are the default's 10 % again, and candidates that are the
# default in disguise only split the training rows (bench-results/dirty-win-8, run 202:
# a policy chose 32 % in checkpoint on 14 settled rows)
DIRTY_BACKGROUND_RANGE = (1, 10)
CONFIGS["readahead"] = CONFIGS["queue"].replace(
    'apply = {{scheduler = ["none", "mq-deadline", "kyber", "bfq"], nr_requests = [8, 256]}}',
    "apply = {{read_ahead_kb = [0, 4096]}}")
CONFIGS["dirty"] = CONFIGS["writeback"].replace(
    "apply = {{dirty_ratio = [2, 80], dirty_background_ratio = [1, 40]}}",
    "apply = {{{{dirty_background_ratio = [{}, {}]}}}}".format(*DIRTY_BACKGROUND_RANGE))
#: per candidate, the range mlfs may set a knob in, where narrower than the sweep's
#: settings: the best static is then one mlfs could choose too (and the evaluation
#: can pin it through the model's `recommend`)
WIN_RANGES: dict[str, dict[str, tuple[int, int]]] = {
    "dirty": {"dirty_background_ratio": DIRTY_BACKGROUND_RANGE}}

#: the device's rate cap per candidate (scratch_filesystem): "dirty" needs a device of
#: one known speed, slower than the page cache, for its phases to differ.  "writeback":
#: uncapped, its streaming phase read x3.15 apart under one setting from a clean page
#: cache (472-1,488 MiB/s, six visits), the virtual disk under the loop image's
#: wandering speed, and every run measured that; capped at 300 MB/s, x1.07 (262-281)
#: (`python -m tests.bench.stream_spread --visits 6 [--cap-mb-per-s 300]`, one after the
#: other, 2026-12-07; bench-results/stream-spread-capped), below the slowest visit the
#: virtual disk gave (397-472 MiB/s)
DEVICE_CAP_MB_PER_S = {"dirty": 1000, "writeback": 300}

#: the most a measured buffered writer may run ahead of its flushes, per candidate:
#: 64 MiB (a fraction of a second at the loop's speed) keeps fio's per-second rate the
#: durable one; "dirty"'s checkpoint flushes every 512 MiB, half a second at its cap
MAX_UNFLUSHED_MIB = {"queue": 64, "writeback": 64, "dirty": 512, "readahead": 64}

#: the candidates whose knobs govern the page cache's dirty pages: each phase visit
#: starts settled (`fio_phases.settle`), so that what one condition left dirty is not
#: paid by the next condition's visit
SETTLED_START = frozenset({"writeback", "dirty"})

#: the knobs the experiment lets mlfs (and the sweep's best static) set: for
#: writeback the two ratios, whose effect the sweep found robust (stream-write
#: x1.56-1.67 at low ratios, both rounds); four knobs would make the
#: exploration space too big for minutes of training
WIN_KNOBS = {"queue": ("scheduler", "nr_requests"),
             "writeback": ("dirty_ratio", "dirty_background_ratio"),
             "dirty": ("dirty_background_ratio",), "readahead": ("read_ahead_kb",)}


#: the features the model may use (`mlfs train --features`; absent: all).  For the
#: dirty ratios, the size of the write(2) calls of the process holding the window's
#: median byte (linux.vm's bulk_write_kb_per_call, from /proc/<pid>/io): 1 MiB in
#: checkpoint, 64 KiB in scratch and tempfiles, under every ratio, since the
#: application chooses it; a second in which fio waits in fdatasync and only other
#: processes write keeps the last second's size (linux.vm.BULK_MIN_MB_PER_S), where it
#: read 0.0 and the policy chose 8 % for it (docs/results/dirty-ratios.md).  The plain
#: mean (write_kb_per_call) spread 243-990 KiB within checkpoint, diluted by other
#: processes' small calls while fio waited in fdatasync, and the trees split the
#: phase there (bench-results/dirty-win-11).  Every
#: kernel-side feature follows the knob (the dirty and writeback MB, the pages
#: dirtied and written back, the device's writes, io pressure), and a row taken
#: under a held setting carries that setting's effect in them, so the trees explain
#: the objective by them, not by the knob: with all features (bench-results/dirty-win-5,
#: run 1) the policy chose 16 % and 2 % in checkpoint, mlfs x0.91; with the
#: pages-dirtied rate alone (which a throttled scratch writer brings down to a
#: checkpoint's) 2-4 %, x0.95 (bench-results/dirty-win-7)
MODEL_FEATURES: dict[str, tuple[str, ...]] = {"dirty": ("bulk_write_kb_per_call",)}


def offered_schedulers(device: str) -> set[str]:
    """The I/O schedulers the device's kernel offers (its queue/scheduler file)."""
    text = Path(f"/sys/block/{device}/queue/scheduler").read_text()
    return {word.strip("[]") for word in text.split()}


def mount_config(candidate: str, share: float, device: str) -> str:
    """The mount's configuration for this run; the queue's `apply` names only the
    schedulers this kernel offers (the mount refuses one it does not, exit 2)."""
    config = CONFIGS[candidate].format(share=share, device=device)
    if "scheduler" in WIN_KNOBS[candidate]:
        offered = offered_schedulers(device)
        listed = ["none", "mq-deadline", "kyber", "bfq"]
        config = config.replace(
            "scheduler = " + json.dumps(listed),
            "scheduler = " + json.dumps([s for s in listed if s in offered]))
    return config


def win_settings(candidate: str, device: str | None = None) -> list[dict]:
    """The sweep's settings of the knobs mlfs may set, within its ranges, and (with
    `device`) only the I/O schedulers its kernel offers (a kernel built without bfq
    refuses it: the sweep measures what could be set, as mlfs's bounds do)."""
    ranges = WIN_RANGES.get(candidate, {})
    offered = None
    if device is not None and "scheduler" in WIN_KNOBS[candidate]:
        offered = offered_schedulers(device)
    return [s for s in sweeps.CANDIDATES[candidate]["settings"]
            if set(s) <= set(WIN_KNOBS[candidate])
            and all(lo <= s[k] <= hi for k, (lo, hi) in ranges.items() if k in s)
            and (offered is None or s.get("scheduler", "none") in offered)]


#: a setting mlfs held for at least this share of a phase's evaluation samples is
#: "chosen": a static measurement must back any claim about it (issue 33 item 2)
CHOSEN_SHARE = 0.1


def _value(text: str) -> int | str:
    return int(text) if text.lstrip("-").isdigit() else text


def chosen_settings(knobs: dict[str, dict[str, int]], grid: list[dict],
                    default: dict[str, str]) -> list[dict]:
    """The settings mlfs chose (held for `CHOSEN_SHARE` of some phase's samples, as
    `KnobWatch` tallied them: {phase: {"k=v k=v": samples}}) that the sweep's grid
    lacks, each as a sweep setting: the values that differ from `default`."""
    measured = [{k: str(v) for k, v in {**default, **setting}.items()} for setting in grid]
    missing: list[dict] = []
    for tally in knobs.values():
        total = sum(tally.values())
        for text, samples in tally.items():
            if not total or samples < CHOSEN_SHARE * total:
                continue
            held = dict(pair.split("=", 1) for pair in text.split())
            if any(all(full.get(k) == v for k, v in held.items()) for full in measured):
                continue
            setting = {k: _value(v) for k, v in held.items() if default.get(k) != v}
            if setting and setting not in missing:
                missing.append(setting)
    return missing


def with_chosen(sweep: dict, chosen: dict, phases: tuple[str, ...]) -> dict:
    """The sweep's analysis over its grid and the chosen settings measured after it:
    each setting's ratio to the default of its own sweep (measured beside it)."""
    first, second = sweep["analysis"]["ratio"], chosen["analysis"]["ratio"]
    ratio = {**first, **{s: r for s, r in second.items() if s != "default"}}
    best = max(ratio, key=lambda s: ratio[s]["overall"])
    per_phase = {p: max(ratio, key=lambda s, p=p: ratio[s][p]) for p in phases}
    oracle = scoring.overall([ratio[per_phase[p]][p] for p in phases])
    return {"ratio": ratio, "best_static": best, "best_per_phase": per_phase,
            "oracle_overall": oracle}


def subsystem_name(candidate: str, device: str) -> str:
    return f"linux.block.{device}" if candidate in ("queue", "readahead") else "linux.vm"


def knob_files(candidate: str, device: str) -> dict[str, Path]:
    if candidate == "readahead":
        return {"read_ahead_kb": Path(f"/sys/block/{device}/queue/read_ahead_kb")}
    if candidate == "queue":
        q = Path(f"/sys/block/{device}/queue")
        return {"scheduler": q / "scheduler", "nr_requests": q / "nr_requests"}
    return {k: Path(f"/proc/sys/vm/{k}") for k in (
        "dirty_ratio", "dirty_background_ratio", "dirty_expire_centisecs",
        "dirty_writeback_centisecs", "dirty_bytes", "dirty_background_bytes")}


def read_knobs(files: dict[str, Path]) -> dict[str, str]:
    out = {}
    for name, path in files.items():
        text = read_text(path)
        out[name] = parse_bracketed(text)[0] if "[" in text else text
    return out


def assignment(setting: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


class KnobWatch(threading.Thread):
    """Every 0.2 s: the knob values in effect, tallied under the current label."""

    def __init__(self, files: dict[str, Path]) -> None:
        super().__init__(daemon=True, name="knob-watch")
        self.files = {k: v for k, v in files.items() if not k.endswith("_bytes")}
        self.label = ""
        self.tally: defaultdict[str, Counter] = defaultdict(Counter)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            label = self.label
            if label:
                try:
                    self.tally[label][assignment(read_knobs(self.files))] += 1
                except OSError:
                    pass

    def take(self) -> dict[str, dict[str, int]]:
        out = {k: dict(v.most_common(4)) for k, v in self.tally.items()}
        self.tally.clear()
        return out


class Glue(threading.Thread):
    """What an operator's glue does: each of fio's per-second MiB/s into ``objective``.

    The subsystems are configured with ``objective = "application"`` (docs/ABI.md,
    "An application's objective"): each report is written once, as
    ``MIB window=1.0``, and is the objective of the ticks of the second it
    covers; a tick no report covers is recorded missing, never with the
    backend's own counter (a different quantity)."""

    def __init__(self, rate_seconds: int = 1) -> None:
        super().__init__(daemon=True, name="objective-glue")
        #: the rate over this many of fio's reports (`FioStream`): a checkpoint writer's
        #: per-second figure swings 0 to 3500 MiB/s with where the second falls in its
        #: flush cycle (bench-results/dirty-win-12/per-second-objective, the training rows)
        self.rate_seconds = rate_seconds
        self.path: Path | None = None
        self.latest: float | None = None
        self.errors = 0
        self.writes = 0
        self.stop = threading.Event()
        self._fresh = threading.Event()

    def __call__(self, mib_per_s: float) -> None:
        self.latest = mib_per_s
        self._fresh.set()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self._fresh.wait(0.2):
                continue
            self._fresh.clear()
            path, value = self.path, self.latest
            if path is None or value is None:
                continue
            try:
                write_attr(path, f"{value:.3f} window=1.0\n")
                self.writes += 1
            except OSError:
                self.errors += 1


def run_cycle(phases: tuple[str, ...], mnt: Path, seconds: float, glue: Glue,
              watch: KnobWatch, label: str, settled: bool = False) -> dict[str, list]:
    """Every phase once: {phase: [bytes, seconds]} (fio's figures); `settled`: each
    visit starts on a clean page cache (`fio_phases.settle`)."""
    acc = {}
    for phase in phases:
        if settled:
            settle()
        watch.label = f"{label}/{phase}" if label else ""
        stream = FioStream(phase, mnt, seconds, glue, rate_seconds=glue.rate_seconds)
        got = stream.wait(timeout=seconds * 10 + 120)
        watch.label = ""
        acc[phase] = [got["bytes"], got["seconds"]]
    return acc


def summarize_run(acc: dict[str, list]) -> dict:
    """Per-phase MiB/s of one condition, and the seconds it ran (its "overall" is a
    ratio to the default: `score_conditions`)."""
    mib = {p: b / MIB / s if s else 0.0 for p, (b, s) in acc.items()}
    return {"mib_per_s": mib, "seconds": sum(s for _, s in acc.values())}


def score_conditions(runs: dict[str, dict], phases: tuple[str, ...]) -> dict[str, dict]:
    """Per condition: the per-phase ratios to the interleaved default, "overall" by the
    one rule (`scoring.overall`: equal work per phase) and "equal_time" (the summed
    MiB/s over the default's: equal time per phase, what the proxy's efficiency,
    sum observed / sum baseline over ticks, weighs by)."""
    base = runs["default"]["mib_per_s"]
    out = {}
    for c, run in runs.items():
        ratios = scoring.phase_ratios(run["mib_per_s"], base, phases)
        out[c] = {**ratios, "overall": scoring.overall(ratios),
                  "equal_time": scoring.equal_time(run["mib_per_s"], base, phases)}
    return out


def one_run(args: argparse.Namespace, n: int, log: logging.Logger) -> dict:
    phases = args.phases or tuple(sweeps.CANDIDATES[args.candidate]["phases"])
    out: dict = {"candidate": args.candidate, "run": n, "phases": phases,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "commit": measured_commit(),
                 "args": {k: v for k, v in vars(args).items() if k != "json_dir"}}
    cap = args.cap_mb_per_s
    out["device_cap_mb_per_s"] = cap
    out["settled_start"] = args.candidate in SETTLED_START
    with scratch_filesystem(args.image_mib, cap) as (device, mnt):
        files = knob_files(args.candidate, device)
        original = read_knobs(files)
        out["device"], out["original"] = device, original
        watch = KnobWatch({k: files[k] for k in WIN_KNOBS[args.candidate]})
        watch.start()
        glue = Glue(args.rate_seconds)
        glue.start()
        try:
            # 1. the sweep (no daemon)
            sweep_args = argparse.Namespace(candidate=args.candidate, phases=phases,
                                            seconds=args.seconds, rounds=args.sweep_rounds)
            values = sweep_in(sweep_args, device, mnt)
            analysis = sweeps.analyse({"phases": phases, "values": values})
            out["sweep"] = {"values": values, "analysis": analysis}
            rounds = rounds_of(values)
            if len(rounds) >= 2:  # chosen on the even rounds, measured on the odd ones
                found = out["sweep"]["held_out"] = held_out(rounds, phases, "default")
                print(f"run {n}: sweep held out: {held_out_text(found)}", flush=True)
            best_label = evaluated_best_static(out)
            best = next(s for s in win_settings(args.candidate, device)
                        if sweeps.label(s) == best_label)
            print(f"run {n}: sweep: best static {best_label} "
                  f"(x{analysis['ratio'][best_label]['overall']:.2f}); per phase "
                  f"{analysis['best_per_phase']}; oracle x{analysis['oracle_overall']:.2f}",
                  flush=True)
            if not best:
                print(f"run {n}: the default is the best static setting", flush=True)
            # 2. training and 3. evaluation, in one mount
            # the default algorithm: the values in place when mlfs starts
            default = {k: original[k] for k in WIN_KNOBS[args.candidate]}
            out.update(mlfs_part(args, device, mnt, phases, default, best, glue, watch,
                                 log, run=n))
            # 4. every setting mlfs chose that the grid lacked, measured statically beside
            # the default (issue 33 item 2: no claim about a setting nobody measured)
            chosen = chosen_settings(out["conditions"]["mlfs"]["knobs"],
                                     win_settings(args.candidate, device), default)
            out["chosen_not_in_grid"] = chosen
            if chosen:
                sweep_args.settings = [{}] + chosen
                values = sweep_in(sweep_args, device, mnt)
                out["sweep_chosen"] = {"values": values, "analysis": sweeps.analyse(
                    {"phases": phases, "values": values})}
                out["sweep"]["with_chosen"] = with_chosen(out["sweep"], out["sweep_chosen"],
                                                          phases)
                print(f"run {n}: chosen settings the grid lacked, measured: "
                      f"{out['sweep_chosen']['analysis']['ratio']}", flush=True)
        finally:
            watch.stop.set()
            glue.stop.set()
            now = read_knobs(files)
            out["restored"] = now == original
            if now != original:
                print(f"run {n}: knobs {now} are not the originals {original}: restoring",
                      file=sys.stderr)
                restore(files, original)
            else:
                print(f"run {n}: restored: {now}", flush=True)
    return out


def restore(files: dict[str, Path], original: dict[str, str]) -> None:
    """Last resort: write the originals back (the ratio before its bytes twin, which the
    kernel zeroes when the ratio is written; the scheduler before nr_requests)."""
    order = sorted(files, key=lambda k: (k.endswith("_bytes") and original[k] == "0",
                                         k == "nr_requests"))
    for name in order:
        if name.endswith("_bytes") and original[name] == "0":
            continue
        try:
            files[name].write_text(original[name] + "\n")
        except OSError as exc:
            print(f"restoring {name}={original[name]}: {exc}", file=sys.stderr)


def sweep_in(args: argparse.Namespace, device: str, mnt: Path) -> dict:
    """tests.bench.sweep's rounds on this run's file system: {setting: {phase: [MiB/s]}}."""
    phases = args.phases
    settings = getattr(args, "settings", None) or win_settings(args.candidate, device)
    values = {sweeps.label(s): {p: [] for p in phases} for s in settings}
    with tempfile.TemporaryDirectory(prefix="mlfs-sweep-") as state:
        ctl = sweeps.controller_for(args.candidate, device, Path(state))
        try:
            for phase in phases:  # lay the files out
                run_phase(phase, mnt, 1)
            # one cycle under the default, discarded: run 1's sweep measured its first
            # setting (the default) right after the layout, below every other setting,
            # while in the interleaved evaluation the default was the best condition
            for phase in phases:
                run_phase(phase, mnt, args.seconds)
            for rnd in range(args.rounds):
                shift = rnd % len(settings)
                for setting in settings[shift:] + settings[:shift]:
                    os.sync()
                    sweeps.apply(ctl, setting)
                    for phase in phases:
                        if args.candidate in SETTLED_START:
                            settle()
                        values[sweeps.label(setting)][phase].append(
                            run_phase(phase, mnt, args.seconds)["mib_per_s"])
        finally:
            ctl.close()
    return values


def mlfs_part(args: argparse.Namespace, device: str, mnt: Path, phases: tuple[str, ...],
              default: dict, best: dict, glue: Glue,
              watch: KnobWatch, log: logging.Logger, run: int) -> dict:
    info: dict = {}
    runs: dict[str, dict] = {}
    sub_name = subsystem_name(args.candidate, device)
    mount = Mount(mnt.parent, mount_config(args.candidate, args.learning_share, device),
                  name="mlfs")
    files = knob_files(args.candidate, device)
    clean = args.candidate in SETTLED_START  # each visit on a clean page cache
    try:
        mount.start()
        sub = mount.mountpoint / sub_name
        glue.path = sub / "objective"
        mdir = sub / "models" / MODEL
        print(f"training {args.train_seconds:.0f} s on {sub_name}", flush=True)
        info["training"] = train_online(
            mount.mountpoint, sub_name, MODEL,
            lambda: run_cycle(phases, mnt, args.train_phase, glue, watch, "train", clean),
            args.train_seconds, explore_ticks=args.explore_ticks, seed=args.seed, log=log,
            features=model_features(args))
        info["training"]["features"] = model_features(args)
        info["training"]["ticks"] = round(info["training"]["train_seconds"] / TICK)
        if args.json_dir:  # what the model learnt from, for a look at it afterwards
            keep_dataset(sub / "dataset", Path(args.json_dir) / f"run{run}-train.parquet")
        info["training"]["explored"] = watch.take()
        # the proxy's paired-tick estimate after training (issue 13, item 4)
        info["training"]["efficiency"] = (mdir / "efficiency").read_text().strip()
        if args.judge_seconds:
            info["judged"] = judge(mdir, args.judge_seconds,
                                   lambda: run_cycle(phases, mnt, args.train_phase, glue,
                                                     watch, "", clean),
                                   WIN_KNOBS[args.candidate])
            print(f"judged: {json.dumps(info['judged'])}", flush=True)
        write_attr(mdir / "mode", "recommendation\n")
        print(f"trained: {json.dumps(info['training'])}", flush=True)

        def settled(condition: str) -> None:
            want = best if condition == "best static" else default
            wait_for(lambda: all(read_knobs(files).get(k) == str(v) for k, v in want.items()),
                     timeout=5)

        switch = ModelSwitch(mdir, assignment(default), assignment(best) or assignment(default),
                             TICK, settled)
        acc_runs: list[dict] = []

        def after_run(rep: int, acc: dict) -> None:
            acc_runs.append(acc)

        interleave(1, args.cycles, switch,
                   lambda c: run_cycle(phases, mnt, args.seconds, glue, watch, c, clean),
                   phases, after_run)
        acc = acc_runs[0]
        knobs = watch.take()
        for condition in CONDITIONS:
            runs[condition] = summarize_run(acc[condition])
            runs[condition]["knobs"] = {p: knobs.get(f"{condition}/{p}", {}) for p in phases}
        info["efficiency"] = (mdir / "efficiency").read_text().strip()
        info["objective_writes"], info["objective_write_errors"] = glue.writes, glue.errors
        glue.path = None
        if args.json_dir:  # every row (training, judged, evaluation) for a look afterwards
            time.sleep(2.5)  # the last rows sealed (feedback_seal_seconds 1 s)
            keep_dataset(sub / "dataset", Path(args.json_dir) / f"run{run}-all.parquet")
    finally:
        glue.path = None
        if mount.pid is not None:
            done = mount.umount()
            if done.returncode != 0:
                print(f"mlfs umount: {done.stdout}{done.stderr}", file=sys.stderr)
            mount.kill()
    info["conditions"] = runs
    info["ratio"] = score_conditions(runs, phases)
    for c in CONDITIONS:
        print(f"  {c:12s} " + " ".join(f"{p} {runs[c]['mib_per_s'][p]:7.1f} "
                                       f"(x{info['ratio'][c][p]:.2f})" for p in phases)
              + f" overall (equal work) x{info['ratio'][c]['overall']:.2f}, equal time "
              f"x{info['ratio'][c]['equal_time']:.2f}  knobs {runs[c]['knobs']}",
              flush=True)
    print(f"  efficiency file: {info['efficiency']}", flush=True)
    return info


def model_features(args: argparse.Namespace) -> list[str] | None:
    if args.features == "all":
        return None
    if args.features:
        return args.features.split(",")
    chosen = MODEL_FEATURES.get(args.candidate)
    return list(chosen) if chosen else None


def keep_dataset(dataset: Path, dest: Path) -> None:
    """The sealed portions read through the mount (as a data scientist would), in one file."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    pq.write_table(ds.dataset(str(dataset), format="parquet").to_table(), dest)


def judge(mdir: Path, seconds: float, run_cycle, knobs: tuple[str, ...]) -> dict:
    """The proxy's own estimate of the trained policy (issue 13, item 4).

    The trainer has stopped; the policy it left runs in collaboration (half
    the ticks, the other half the default, in sandwiched episodes) over the
    training phases for `seconds`.  The interleaved evaluation that follows
    measures the same policy; the two must agree.  The `efficiency` file's
    window (400 ticks) still holds training's pairs, explorations among them,
    unless `seconds` covers it; so the estimate of the judged stretch alone is
    also computed with the proxy's own rule (`efficiency.replay`, the file's
    window fed the rows this stretch recorded, read back from the dataset).
    """
    write_attr(mdir / "mode", "collaboration\n")
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        run_cycle()
    out = {"seconds": round(time.monotonic() - started, 1),
           "efficiency": (mdir / "efficiency").read_text().strip()}
    model = f'model="{mdir.name}"'
    for line in (mdir.parents[2] / "metrics").read_text().splitlines():
        for name in ("confidence", "pairs", "known"):
            if line.startswith(f"mlfs_model_efficiency_{name}{{") and model in line:
                out[name] = float(line.rsplit(" ", 1)[1])
    try:  # a diagnostic of the run: its failure must not end the run
        out["judged_only"] = judged_estimate(mdir, knobs)
    except (OSError, ValueError, KeyError) as exc:
        out["judged_only"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def judged_estimate(mdir: Path, knobs: tuple[str, ...]) -> dict:
    """{efficiency, pairs} of the collaboration rows alone, by `efficiency.replay`
    (the pair span of `knobs`, the ones the model controls, as the daemon's)."""
    import pyarrow.dataset as ds

    from mlfs.abi import knob_column

    sub = mdir.parents[1]
    info = json.loads((sub / "info").read_text())
    settle = {knob_column(k): int(spec.get("settle_ticks", 0))
              for k, spec in info["knobs"].items() if k in knobs}
    time.sleep(2.5)  # the last rows sealed (feedback_seal_seconds 1 s)
    # the knobs' columns too: without them replay counts no tick (dirty-win-11 read
    # them so, and then every tick counted as settled: 30-40 pairs where the daemon
    # had 5-15)
    rows = ds.dataset(str(sub / "dataset"), format="parquet").to_table(
        columns=["tick", "controller", "model", "mode", "objective", *settle]).to_pylist()
    judged = [r for r in rows if r["mode"] == "collaboration"]
    stats = replay_judged(judged, mdir.name, info.get("objective", {}).get("goal", "max"),
                          settle)
    if stats is None:
        return {"efficiency": None, "pairs": 0, "rows": len(judged)}
    return judged_figures(stats, len(judged))


def judged_figures(stats, rows: int) -> dict:
    """A replayed window's figures, with whether the mode machine could act on them
    (`modes.efficiency_interval`): an estimate from episodes that mostly straddled a
    phase change reads a number the mode machine takes as unknown
    (bench-results/incumbent-dirty-bursts run 1: 4.69, z 9.6, 30 straddled clean ticks
    against 9 forward and 16 reverse pairs)."""
    from mlfs.core.models.modes import efficiency_interval

    return {"efficiency": round(stats.efficiency, 4), "pairs": stats.ml_ticks,
            "reverse": stats.reverse_ticks, "straddled": stats.straddled,
            "known": efficiency_interval(stats).known, "rows": rows}


def replay_judged(rows: list[dict], model: str, goal: str, settle: dict[str, int],
                  on_pair=None):
    """The daemon's window (`ModeConfig().window_ticks`) over `rows` in tick order, by
    `efficiency.replay`: its last statistics (None without a default tick)."""
    from mlfs.config import ModeConfig
    from mlfs.core.models.efficiency import replay

    history = replay(sorted(rows, key=lambda r: r["tick"]), model, goal,
                     ModeConfig().window_ticks, settle=settle, on_pair=on_pair)
    return history[-1][1] if history else None


def judged_text(judged: dict) -> str:
    """The efficiency file's judged figure, marked where the mode machine took it as
    unknown (its `mlfs_model_efficiency_known` read 0)."""
    text = str(judged.get("efficiency"))
    return text + " (unknown to the mode machine)" if judged.get("known") == 0 else text


def evaluated_best_static(run: dict) -> str:
    """The best static setting a run's evaluation ran: chosen on the sweep's even rounds
    when it had two or more (`held_out`), else on its one round.  The one-round analysis
    over every round can name another (bench-results/incumbent-dirty-bursts run 2: 1 %
    over both rounds, 4 % on the choosing round, and 4 % ran)."""
    held = run["sweep"].get("held_out")
    return held["best_static"] if held else run["sweep"]["analysis"]["best_static"]


def report(results: list[dict]) -> str:
    """Median [min, max] over runs of each ratio, the oracle fraction, the choices."""
    phases = results[0]["phases"]
    lines = []
    for c in ("best static", "mlfs"):
        cells = []
        for key in (*phases, "overall"):
            r = [res["ratio"][c][key] for res in results]
            cells.append(f"{key} x{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]")
        lines.append(f"{c:12s} vs default: " + "; ".join(cells))
    vs_best = [res["ratio"]["mlfs"]["overall"] / res["ratio"]["best static"]["overall"]
               for res in results]
    lines.append(f"mlfs vs best static overall: x{statistics.median(vs_best):.2f} "
                 f"[{min(vs_best):.2f}, {max(vs_best):.2f}]")
    oracle = [res["sweep"]["analysis"]["oracle_overall"] for res in results]
    frac = [scoring.oracle_share(res["ratio"]["mlfs"]["overall"], o)
            for res, o in zip(results, oracle, strict=True)]
    lines.append(f"oracle (sweep, best per phase) x{statistics.median(oracle):.2f} "
                 f"[{min(oracle):.2f}, {max(oracle):.2f}] of the default; mlfs reaches "
                 f"{statistics.median(frac):.0%} of the oracle's gain "
                 f"[{min(frac):.0%}, {max(frac):.0%}]")
    lines.append("best static per run (the one the evaluation ran): "
                 + ", ".join(evaluated_best_static(res) for res in results))
    # the file after the evaluation: its window then holds the evaluation's ticks
    # (emergency for the default, recommendation mode for the others: almost no default
    # tick to pair with), so it is mostly nan; the judged figure is the estimate
    lines.append("efficiency file after training: " + ", ".join(
                     str(res.get("training", {}).get("efficiency")) for res in results)
                 + "; judged in collaboration: " + ", ".join(
                     judged_text(res.get("judged", {})) for res in results)
                 + " (the judged stretch alone: " + ", ".join(
                     str(res.get("judged", {}).get("judged_only", {}).get("efficiency"))
                     for res in results) + "); after the evaluation: " + ", ".join(
                     res.get("efficiency", "?") for res in results)
                 + "; interleaved mlfs equal-time ratio: " + ", ".join(
                     f"x{res['ratio']['mlfs']['equal_time']:.2f}" for res in results))
    lines.append("training ticks per run: " + ", ".join(
        str(res.get("training", {}).get("ticks")) for res in results))
    return "\n".join(lines)


#: per candidate: the options its runs in the README were made with (the defaults)
#: and what --quick changes of them.  "dirty": 30 s visits in the sweep, the
#: evaluation and training alike, two sweep rounds of them (one chooses, one measures:
#: a 30 s visit is steadier than two rounds of 8 s, docs/results/dirty-sweep-30s.md,
#: rounds within 7 % of each other for every setting but checkpoint's 4 %), 10-tick
#: explorations (two settle times), 360 s judged; --quick is one such run, ~50 minutes.
#: With 8 s visits (bench-results/dirty-win-8 to -10) a phase was shorter than the
#: 3k + 1 = 16 ticks a pair of the efficiency estimate spans, so the estimate could
#: not see it, and a setting held after a phase change (episodes.Hold, 10 ticks) was
#: a third of the next visit;
#: 8 s visits were needed then only because scratch.fio's conflict vanished in long
#: ones (sweep.CANDIDATES["dirty"] says why; tempfiles.fio keeps it in 30 s visits).
#: The objective is fio's MiB/s over its last 3 reports (`Glue`), as of dirty-win-12's
#: second try.  360 s judged as of dirty-win-13: a checkpoint visit holds the default, ML
#: and default episodes a counted pair needs only at some alignments of the schedule
#: (episodes.Interleaving), and 180 s held 3 visits (dirty-win-12: none counted in two
#: of three runs).  Two sweep rounds as of incumbent-dirty: with one, the oracle was chosen
#: and measured on the same visits, and the table could not show a held-out gap
RUN_DEFAULTS: dict[str, dict] = {
    "dirty": {"seconds": 30.0, "cycles": 3, "sweep_rounds": 2, "train_seconds": 600.0,
              "train_phase": 30.0, "explore_ticks": 10, "judge_seconds": 360.0,
              "rate_seconds": 3},
}
QUICK: dict[str, dict] = {
    "dirty": {"runs": 1},
}
QUICK_OTHERWISE = {"runs": 1, "seconds": 4.0, "cycles": 3, "sweep_rounds": 1,
                   "train_seconds": 240.0, "train_phase": 4.0}


def parse_args(candidate: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"{candidate}: " + __doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one run (~50 minutes for dirty, ~10 for the others)")
    parser.add_argument("--runs", type=int, default=3, help="independent runs")
    parser.add_argument("--seconds", type=float, default=5.0, help="a phase visit")
    parser.add_argument("--cycles", type=int, default=4, help="evaluation cycles per run")
    parser.add_argument("--sweep-rounds", type=int, default=2)
    parser.add_argument("--train-seconds", type=float, default=600.0)
    parser.add_argument("--train-phase", type=float, default=5.0,
                        help="a phase visit while training")
    parser.add_argument("--explore-ticks", type=int, default=5,
                        help="ticks each exploration lasts (writeback acts over seconds)")
    parser.add_argument("--learning-share", type=float, default=0.8)
    parser.add_argument("--rate-seconds", type=int, default=1,
                        help="the objective: fio's MiB/s over this many of its 1 s reports")
    parser.add_argument("--judge-seconds", type=float, default=0.0,
                        help="after training, the policy in collaboration this long: the "
                        "proxy's estimate of it (the efficiency file, and the judged "
                        "stretch alone)")
    parser.add_argument("--features", help="NAME[,NAME...] the model may use, or 'all' "
                        "(default: MODEL_FEATURES for the candidate, else all)")
    parser.add_argument("--phases", type=lambda text: tuple(text.split(",")),
                        help="PHASE[,PHASE...] instead of the candidate's (e.g. the "
                        "dirty runs before tempfiles.fio: checkpoint,scratch)")
    parser.add_argument("--image-mib", type=int, default=12288)
    parser.add_argument("--cap-mb-per-s", type=int,
                        default=DEVICE_CAP_MB_PER_S.get(candidate, 0),
                        help="cap the loop device's reads and writes at this rate (the "
                        "candidate's DEVICE_CAP_MB_PER_S; 0: no cap)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-dir", help="write run<N>.json (and summary.txt) here")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.set_defaults(**RUN_DEFAULTS.get(candidate, {}))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.candidate = candidate
    if args.quick:
        for name, value in QUICK.get(candidate, QUICK_OTHERWISE).items():
            setattr(args, name, value)
    return args


def main(candidate: str, argv: list[str] | None = None) -> int:
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too runs the clean-up

    signal.signal(signal.SIGTERM, interrupted)
    args = parse_args(candidate, argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        print(f"{candidate}_win: needs root (loop devices, mount, sysctls)", file=sys.stderr)
        return 2
    why = fuse_unavailable()
    if why:
        print(f"{candidate}_win: {why}", file=sys.stderr)
        return 2
    log = logging.getLogger("mlfs.train")
    if args.json_dir:  # before the first run: its training rows are kept there
        Path(args.json_dir).mkdir(parents=True, exist_ok=True)
    results = []
    ok = True
    for n in range(1, args.runs + 1):
        res = one_run(args, n + args.seed * 100, log)
        ok = ok and res["restored"]
        results.append(res)
        if args.json_dir:
            Path(args.json_dir, f"run{res['run']}.json").write_text(
                json.dumps(res, indent=1) + "\n")
    text = report(results)
    print(text)
    if args.json_dir:
        Path(args.json_dir, "summary.txt").write_text(text + "\n")
    return 0 if ok else 1
