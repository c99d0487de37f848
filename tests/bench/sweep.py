"""Sweep a candidate subsystem's static values under the phases of a workload (issue 13, 1).

A learned policy can beat the best static value only where no static value
is best for every phase.  This measures that, per candidate, with the
workloads of tests/bench/workloads/ (fio job files; see fio_phases.py for
how a phase's figure is read from fio's own report):

- ``writeback``: the vm.dirty_* sysctls (machine-wide here: cgroup v1 has
  no per-cgroup writeback) under ``stream-write`` (durable streaming write),
  ``db-commit`` (4 KiB write + fsync beside a rate-limited backup) and
  ``read-under-write`` (O_DIRECT random reads beside the same backup);
- ``queue``: the loop device's ``scheduler`` and ``nr_requests`` under
  ``mixed-rw`` (O_DIRECT random reads beside sequential writes),
  ``seq-read`` (a deep sequential scan) and ``db-commit``.

Set-up: a sparse image on the root file system as a direct-io loop device,
ext4 on it (readahead_experiment.scratch_filesystem).  Every file is laid
out once first, then one cycle of the phases runs under the default and is
discarded (the recorded sweeps of bench-results/ predate that cycle: their
first setting in round 1, the default, ran right after the layout).  Then `--rounds`
rounds: each round runs every setting, in an order rotated per round (the
shared machine drifts), and under each setting the phases one after the
other with nothing in between — a phase inherits the dirty pages the last
one left, as in use.  Knobs are written through the backends' own
`KnobController` (bounds, ledger in a temporary state directory) and
restored at the end, also on error, Ctrl-C or SIGTERM.

"overall" is the ratio to the default of the time a job made of equal
work per phase (what the default does in `--seconds`) would take: the
harmonic mean of the per-phase ratios (`scoring.overall`, the one rule).
The best static value is the best overall; the oracle picks the best
setting per phase.

    .venv/bin/python -m tests.bench.sweep writeback --json bench-results/writeback-sweep.json
    .venv/bin/python -m tests.bench.sweep queue --json bench-results/queue-sweep.json
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlfs.backends.linux.block import specs_for
from mlfs.backends.linux.controller import KnobController
from mlfs.backends.linux.vm import SPECS as VM_SPECS

from tests.bench import scoring
from tests.bench.fio_phases import run_phase
from tests.bench.readahead_experiment import scratch_filesystem

CANDIDATES: dict[str, dict] = {
    "writeback": {
        "phases": ("stream-write", "db-commit", "read-under-write"),
        "settings": [
            {},  # the default: the values in place
            {"dirty_background_ratio": 1, "dirty_ratio": 2},
            {"dirty_background_ratio": 2, "dirty_ratio": 5},
            {"dirty_background_ratio": 5, "dirty_ratio": 10},
            {"dirty_background_ratio": 20, "dirty_ratio": 40},
            {"dirty_background_ratio": 40, "dirty_ratio": 80},
            {"dirty_expire_centisecs": 100, "dirty_writeback_centisecs": 50},
            {"dirty_expire_centisecs": 12000, "dirty_writeback_centisecs": 3000},
        ],
    },
    # the dirty ratios where their effect is owed to no one later: a checkpointing
    # writer (each checkpoint flushed within the visit) and scratch space (deleted,
    # never flushed); on the uncapped loop no conflict (docs/results/dirty-sweep.md),
    # on a device capped at 1 GB/s (fio_win.DEVICE_CAP_MB_PER_S) a strong one, which a
    # low background ratio under a high limit does not remove: scratch x0.82 there
    # (docs/results/dirty-sweep-capped.md).  Scratch space is now temporary files
    # (tempfiles.fio), each deleted within a second or two: scratch.fio's one file,
    # rewritten for a whole visit, ages past dirty_expire_centisecs (30 s) in a long
    # visit and is then written back under the default too, so its conflict existed in
    # 8 s visits only (30 s visits, 2 rounds, docs/results/dirty-sweep-30s.md: scratch
    # x0.97 at 1 %, tempfiles x0.55, checkpoint x1.38); `--phases checkpoint,scratch`
    # gives the earlier runs' phases
    "dirty": {
        "phases": ("checkpoint", "tempfiles"),
        "settings": [
            {},
            {"dirty_background_ratio": 1, "dirty_ratio": 2},
            {"dirty_background_ratio": 2, "dirty_ratio": 5},
            {"dirty_background_ratio": 5, "dirty_ratio": 10},
            {"dirty_background_ratio": 20, "dirty_ratio": 40},
            {"dirty_background_ratio": 40, "dirty_ratio": 80},
            # early writeback without throttling: a low background ratio under a high
            # limit (the pairs above move both together and missed it)
            {"dirty_background_ratio": 1, "dirty_ratio": 20},
            {"dirty_background_ratio": 1, "dirty_ratio": 80},
            {"dirty_background_ratio": 2, "dirty_ratio": 40},
            # the background ratio alone (the dirty_win experiment's knob)
            {"dirty_background_ratio": 1},
            {"dirty_background_ratio": 2},
            {"dirty_background_ratio": 4},
            {"dirty_background_ratio": 20},
        ],
    },
    "queue": {
        "phases": ("mixed-rw", "seq-read", "db-commit"),
        "settings": [
            {},
            {"scheduler": "mq-deadline"},
            {"scheduler": "kyber"},
            {"scheduler": "bfq"},
            {"nr_requests": 8},
            {"nr_requests": 32},
            {"scheduler": "mq-deadline", "nr_requests": 8},
        ],
    },
    # read_ahead_kb under fio: each visit is one fio process that opens its files at
    # its start, so the value in place then is the one its reads get all visit long
    # (the kernel copies read_ahead_kb into a file's readahead state at open): an
    # application that keeps its files open, which readahead_win's workload (reopening
    # every 50 ms) is not.  A scan wants a large window, page faults on a mapping a
    # small one (every fault reads the window around it)
    "readahead": {
        "phases": ("seq-scan", "mmap-lookup"),
        "settings": [
            {},
            {"read_ahead_kb": 0},
            {"read_ahead_kb": 16},
            {"read_ahead_kb": 64},
            {"read_ahead_kb": 128},
            {"read_ahead_kb": 512},
            {"read_ahead_kb": 2048},
        ],
    },
}


def label(setting: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items()) or "default"


def controller_for(candidate: str, device: str, state: Path) -> KnobController:
    """The backend's knob controller, allowed exactly the candidate's knobs."""
    if candidate in ("writeback", "dirty"):
        specs = {k: v for k, v in VM_SPECS.items() if k.startswith("dirty_")}
        rules = {k: (specs[k].lo, specs[k].hi) for k in specs}
        return KnobController("sweep.writeback", specs, rules, state)
    if candidate == "readahead":
        specs = {"read_ahead_kb": specs_for(device)["read_ahead_kb"]}
        rules = {"read_ahead_kb": (specs["read_ahead_kb"].lo, specs["read_ahead_kb"].hi)}
        return KnobController(f"sweep.readahead.{device}", specs, rules, state)
    specs = {k: v for k, v in specs_for(device).items() if k != "read_ahead_kb"}
    choices = specs["scheduler"].kernel_choices()
    rules = {"scheduler": frozenset(choices), "nr_requests": (specs["nr_requests"].lo,
                                                              specs["nr_requests"].hi)}
    return KnobController(f"sweep.queue.{device}", specs, rules, state)


def apply(ctl: KnobController, setting: dict) -> None:
    """The default values with `setting` on top (a scheduler first: it resets nr_requests)."""
    want = {**ctl.default_values(), **setting}
    if "scheduler" in setting:
        want.pop("nr_requests", None)
        if "nr_requests" in setting:
            want["nr_requests"] = setting["nr_requests"]
    extra = ctl.apply(want)
    if extra:
        raise RuntimeError(f"{label(setting)}: {extra}")
    if "scheduler" in want and "nr_requests" not in setting:
        # the scheduler switch set its own depth; the "default" depth is that one
        pass


def analyse(result: dict) -> dict:
    phases = result["phases"]
    med = {s: {p: statistics.median(v) for p, v in row.items()}
           for s, row in result["values"].items()}
    base = med["default"]
    ratio = {s: {p: row[p] / base[p] for p in phases} for s, row in med.items()}
    for s in ratio:
        ratio[s]["overall"] = scoring.overall([ratio[s][p] for p in phases])
    best = max(ratio, key=lambda s: ratio[s]["overall"])
    per_phase = {p: max(ratio, key=lambda s, p=p: ratio[s][p]) for p in phases}
    oracle = scoring.overall([ratio[per_phase[p]][p] for p in phases])
    return {"median_mib_per_s": med, "ratio": ratio, "best_static": best,
            "best_per_phase": per_phase, "oracle_overall": oracle,
            "oracle_over_best": oracle / ratio[best]["overall"],
            "conflict": len(set(per_phase.values())) > 1}


def markdown(result: dict) -> str:
    a = result["analysis"]
    phases = result["phases"]
    lines = [f"# {result['candidate']} sweep", "",
             f"Command: `{result['command']}`  ", f"Date: {result['date']}; device "
             f"{result['device']} (direct-io loop, ext4); {result['rounds']} rounds of "
             f"{result['seconds']:g} s visits, settings rotated per round.", "",
             "Application MiB/s per phase (fio's own io_bytes / job_runtime, bg-* jobs "
             "excluded): median [min, max] over rounds, x = median / default's median. "
             "overall = harmonic mean of the phase ratios (the time of a job with equal "
             "work per phase).", "",
             "| setting | " + " | ".join(phases) + " | overall |",
             "|---" * (len(phases) + 2) + "|"]
    for s, row in result["values"].items():
        cells = []
        for p in phases:
            v = row[p]
            cells.append(f"{statistics.median(v):.1f} [{min(v):.1f}, {max(v):.1f}] "
                         f"x{a['ratio'][s][p]:.2f}")
        lines.append(f"| {s} | " + " | ".join(cells) + f" | x{a['ratio'][s]['overall']:.2f} |")
    lines += ["", f"Best static: **{a['best_static']}** "
              f"(x{a['ratio'][a['best_static']]['overall']:.2f} of the default).  ",
              "Best per phase: " + "; ".join(f"{p}: {s} (x{a['ratio'][s][p]:.2f})"
                                            for p, s in a["best_per_phase"].items()) + ".  ",
              f"Oracle (best setting per phase): x{a['oracle_overall']:.2f} of the default, "
              f"x{a['oracle_over_best']:.2f} of the best static.  ",
              f"Per-phase conflict (no single setting best everywhere): "
              f"{'yes' if a['conflict'] else 'no'}.", ""]
    return "\n".join(lines)


def sweep(args: argparse.Namespace) -> dict:
    cand = CANDIDATES[args.candidate]
    phases = tuple(args.phases or cand["phases"])
    settings = [st for st in cand["settings"]
                if not args.settings or label(st) in args.settings]
    values: dict[str, dict[str, list[float]]] = {label(s): {p: [] for p in phases}
                                                 for s in settings}
    jobs: dict[str, dict[str, list[dict]]] = {label(s): {p: [] for p in phases}
                                              for s in settings}
    result: dict = {"candidate": args.candidate, "phases": phases, "seconds": args.seconds,
                    "rounds": args.rounds, "command": " ".join(["python -m tests.bench.sweep",
                                                                *sys.argv[1:]]),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with scratch_filesystem(args.image_mib, args.cap_mb_per_s) as (device, mnt), \
            tempfile.TemporaryDirectory(prefix="mlfs-sweep-") as state:
        result["device"] = device
        ctl = controller_for(args.candidate, device, Path(state))
        result["defaults"] = {k: str(v) for k, v in ctl.default_values().items()}
        try:
            for phase in phases:  # lay the files out, then one cycle discarded
                run_phase(phase, mnt, 1)
            for phase in phases:  # (the first cycle after a layout runs slow)
                run_phase(phase, mnt, args.seconds)
            for rnd in range(args.rounds):
                shift = rnd % len(settings)
                for setting in settings[shift:] + settings[:shift]:
                    subprocess.run(["sync", "-f", str(mnt)], check=False)
                    apply(ctl, setting)
                    got = []
                    for phase in phases:
                        row = run_phase(phase, mnt, args.seconds)
                        values[label(setting)][phase].append(row["mib_per_s"])
                        jobs[label(setting)][phase].append(row["jobs"])
                        got.append(f"{phase} {row['mib_per_s']:7.1f}")
                    print(f"round {rnd + 1} {label(setting):58s} " + "  ".join(got),
                          flush=True)
        finally:
            ctl.close()
            now = {k: str(v) for k, v in ctl.default_values().items()}
            after = {k: spec.read() for k, spec in ctl.specs.items()}
            restored = all(after[k] == result["defaults"][k] for k in after)
            print(f"restored: {restored} ({after})", flush=True)
            if not restored:
                print(f"NOT restored: expected {now}", file=sys.stderr)
    result["values"], result["jobs"] = values, jobs
    result["analysis"] = analyse(result)
    return result


def main(argv: list[str] | None = None) -> int:
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too restores the knobs

    signal.signal(signal.SIGTERM, interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidate", choices=sorted(CANDIDATES))
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase visit")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--phases", type=lambda s: s.split(","), default=None)
    parser.add_argument("--image-mib", type=int, default=12288)
    parser.add_argument("--cap-mb-per-s", type=int, default=0,
                        help="cap the loop device's reads and writes (blkio throttle)")
    parser.add_argument("--settings", type=lambda s: s.split(";"), default=None,
                        help="only these settings' labels, ';'-separated (default "
                        "always included), e.g. 'default;dirty_background_ratio=1'")
    parser.add_argument("--json", help="write the results here (and a .md beside it)")
    args = parser.parse_args(argv)
    if args.settings:
        known = {label(st) for st in CANDIDATES[args.candidate]["settings"]}
        unknown = [x for x in args.settings if x not in known]
        if unknown:
            parser.error(f"not settings of {args.candidate}: {'; '.join(unknown)} "
                         f"(known: {'; '.join(sorted(known))})")
        args.settings.append("default")
    result = sweep(args)
    text = markdown(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.json).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
