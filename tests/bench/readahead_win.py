"""Does mlfs beat a static read_ahead_kb on a real device?  (issue 4: the win, measured)

Set-up (the helpers of `readahead_experiment`): a sparse image on the root
file system attached as a direct-io loop device (the host's page cache does
not serve the reads), ext4 on it, one data file of random bytes (`--file-mib`,
1 GiB).  The workload runs in its own process inside a child memory cgroup
limited to `--memory-mib` (128 MiB): its page cache is charged there, so the
file never fits in the cache, as a data set larger than memory does not.
It cycles through three phases; every visit starts from a cold cache (the
file's pages dropped) and re-opens the file every 50 ms, keeping its
position, because the kernel copies read_ahead_kb into a file's readahead
state at open, so the knob never reaches a descriptor opened before it
changed (a data loader moving from shard to shard, a store opening its
files, do the same):

- ``sequential``: 4 KiB buffered reads front to back (dropped when it wraps);
- ``random``: 4 KiB preads at uniformly random 4 KiB-aligned offsets;
- ``mmap``: random page faults — one byte touched on random pages of a
  read-only mapping.  Every fault reads read_ahead_kb around it (the
  kernel's read-around), so a large value wastes the device on bytes the
  next fault will not use and that the memory limit evicts anyway.

No static value is best for all: sequential wants 512 KiB or more, mmap
wants 0, random does not care.  Each visit does a fixed amount of work —
what the default reads in `--phase-seconds` (measured first) — as a job
does: "overall" MiB/s is total bytes over total time, i.e. the job's time, and a
slow phase counts for the time it takes (with fixed *time* per phase the
fast phase's bytes would swamp the others).  Ratios of "overall" to the
default are `scoring.overall` of the per-phase ratios (the one rule: equal
work per phase), for the sweep's best static value too.  A visit is cut at `--cap` x
`--phase-seconds` (its bytes over its time still count).

1. A sweep (no daemon, sysfs written directly, every value of `--grid` and the
   default once per round, `--sweep-rounds` rounds in rotating order) picks the
   best static value (the highest overall throughput) and the per-phase oracle
   on the even rounds and measures them on the odd ones (`win_harness.held_out`:
   no winner's curse); both figures are printed.
2. mlfs mounts with a configuration serving ``linux.block.<loop>`` with
   ``apply = {read_ahead_kb = [0, 4096]}``, block tracepoints on (the
   ``trace_*`` features: a sequential scan has long contiguous runs at any
   read_ahead_kb) and `--tick` second ticks.  The workload writes its own
   MiB/s (over the tick's measurement window, refreshed every 0.1 s) to the
   subsystem's ``objective``, so every row's objective is the application's
   throughput, not the device's MB/s (which wasted read-around inflates).
   The trainer (`trainers.worker.run_worker`, LightGBM, ``relative`` error:
   the phases' throughputs differ 30x) runs in a thread for
   `--train-seconds` while the phases cycle, the model pinned in
   ``learning`` mode (share `--learning-share`), each exploration lasting
   `--explore-ticks` ticks; then its uploaded policy stays loaded in the
   proxy, which runs it itself each tick.  The phase is never told to mlfs:
   the policy sees the previous tick's device and trace features only.
3. Evaluation, in the same mount: each cycle runs all phases under one
   condition, then under the next, the order rotating per cycle, so the
   shared VM's drifts (which move a single run by up to 2x) hit all three
   alike, every visit follows a different phase (the policy's first tick of
   a visit decides on the previous phase's features, as in real use), and
   the daemon's overhead is in every condition:

   - ``default``: the model pinned in ``emergency``: the default algorithm,
     the value in place when mlfs started (`--default-kb`, the kernel's
     stock 128 KiB; a direct-io loop device starts at its io_opt-based
     value, e.g. 2560);
   - ``best static``: the model pinned in ``recommendation``
     (``recommendation_probe = 0``) with a recommendation without ttl;
   - ``mlfs``: the model pinned in ``recommendation``, its policy deciding
     every tick.

`--repeats` runs of `--cycles` cycles give the spread.  The protocol's pieces
(cgroup, training online, the conditions, interleaving, the table) are
tests/bench/win_harness.py's, shared with the fio experiments (fio_win.py).

Output: application MiB/s per phase and overall, median and [min, max] over
the runs, the ratio to the default, and for mlfs the read_ahead_kb it chose
in each phase.  Everything is undone at the end (even on Ctrl-C or SIGTERM):
the daemon is unmounted and ended by its pid, the loop device's
read_ahead_kb is checked to be its original again, the workload process
ends, the cgroup is removed, the file system unmounted and the loop device
detached.  Needs root, losetup, mkfs.ext4, FUSE, the BPF capture (clang, bpftool,
libbpf), a memory cgroup.

    .venv/bin/python -m tests.bench.readahead_win --quick   # ~6 minutes
    .venv/bin/python -m tests.bench.readahead_win           # ~25 minutes
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mlfs.backends.blktrace import tracer_unavailable

from mlfs.core.models.safe_set_file import SAFE_SET_FILE
from tests.bench.provenance import measured_commit
from tests.bench.readahead_experiment import MIB, drop_cache, make_file, scratch_filesystem
from tests.bench.win_harness import (
    CONDITIONS,
    ModelSwitch,
    efficiency_by_source,
    fmt,
    held_out,
    held_out_text,
    interleave,
    interleaved_sweep,
    memory_cgroup,
    rates,
    table,
    train_online,
    wait_for,
    write_attr,
)
from tests.harness import Mount, fuse_unavailable

PHASES = ("sequential", "random", "mmap")
PAGE = 4096
SAMPLE_SECONDS = 0.1
REOPEN_SECONDS = 0.05
MODEL = "lgbm"

CONFIG = """
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

[[subsystem]]
backend = "linux.block"
devices = ["{device}"]
tick_seconds = {tick}
objective = "application"
objective_unit = "MiB/s"
apply = {{read_ahead_kb = [0, 4096]}}
tracepoints = true
"""


# ---- the workload (in a child process, inside the memory cgroup) --------------------------
class Workload:
    """The phases, with a byte counter a sampler thread turns into MiB/s."""

    def __init__(self, path: Path, device: str) -> None:
        self.path = path
        self.size = path.stat().st_size
        self.ra_path = Path(f"/sys/block/{device}/queue/read_ahead_kb")
        self.done = 0  # bytes read so far (only the workload thread adds)
        self.label = ""  # what the sampler tallies the read_ahead_kb in effect under
        self.seed = 0
        self.offset = 0  # the sequential scan's position, kept across visits

    # Each phase re-opens the file every REOPEN_SECONDS, keeping its position,
    # as a data loader moving from shard to shard does: the kernel copies
    # read_ahead_kb into a file's readahead state at open (file_ra_state_init),
    # so a device-level knob never reaches a file descriptor opened before it
    # changed.
    @contextmanager
    def _opened(self, mapped: bool) -> Iterator:
        """The file opened anew: its fd, or with `mapped` a fresh read-only mapping.

        A mapping holds the file it was made from, with that file's readahead
        state, so a mapping kept across re-opens would freeze read_ahead_kb.
        """
        fd = os.open(self.path, os.O_RDONLY)
        if not mapped:
            try:
                yield fd
            finally:
                os.close(fd)
            return
        try:
            view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping keeps the file open until it is closed
        try:
            yield view
        finally:
            view.close()

    def _reader(self, until: Callable[[int], bool], read: Callable, mapped: bool = False
                ) -> int:
        done = 0
        while not until(done):
            with self._opened(mapped) as handle:
                reopen = time.monotonic() + REOPEN_SECONDS
                while time.monotonic() < reopen and not until(done):
                    n = read(handle)
                    done += n
                    self.done += n
        return done

    def sequential(self, until: Callable[[int], bool]) -> int:
        def read(fd: int) -> int:
            n = 0
            for _ in range(64):
                if self.offset + PAGE > self.size:
                    drop_cache(self.path)
                    self.offset = 0
                got = len(os.pread(fd, PAGE, self.offset))
                self.offset += got
                n += got
            return n

        return self._reader(until, read)

    def random(self, until: Callable[[int], bool]) -> int:
        self.seed += 1
        rng = random.Random(self.seed)
        pages = self.size // PAGE

        def read(fd: int) -> int:
            return sum(len(os.pread(fd, PAGE, rng.randrange(pages) * PAGE))
                       for _ in range(16))

        return self._reader(until, read)

    def mmap(self, until: Callable[[int], bool]) -> int:
        """Random page faults: one byte touched on each of 16 random pages per call."""
        self.seed += 1
        rng = random.Random(self.seed)
        pages = self.size // PAGE

        def read(view: mmap.mmap) -> int:
            for _ in range(16):
                view[rng.randrange(pages) * PAGE]
            return 16 * PAGE

        return self._reader(until, read, mapped=True)

    def visit(self, phase: str, seconds: float, budget: int | None) -> tuple[int, float]:
        """One phase visit from a cold cache, until `budget` bytes were read (or, with
        no budget, for `seconds`; with one, `seconds` is a cap): (bytes, seconds)."""
        drop_cache(self.path)
        started = time.monotonic()
        deadline = started + seconds

        def until(done: int) -> bool:
            return (budget is not None and done >= budget) or time.monotonic() >= deadline

        done = getattr(self, phase)(until)
        return done, time.monotonic() - started


class Sampler(threading.Thread):
    """Every 0.1 s: the app's MiB/s over the last `window` s (written to `objective`
    when set) and the read_ahead_kb in effect, tallied per label."""

    def __init__(self, work: Workload) -> None:
        super().__init__(daemon=True, name="sampler")
        self.work = work
        self.window = 1.0
        self.objective: Path | None = None
        self.stop = threading.Event()
        self.knobs: defaultdict[str, Counter] = defaultdict(Counter)
        self.write_errors = 0

    def run(self) -> None:
        history: deque[tuple[float, int]] = deque()
        while not self.stop.wait(SAMPLE_SECONDS):
            now, done = time.monotonic(), self.work.done
            history.append((now, done))
            while len(history) > 2 and history[1][0] <= now - self.window:
                history.popleft()
            label = self.work.label
            if label:
                try:
                    self.knobs[label][int(self.work.ra_path.read_text())] += 1
                except (OSError, ValueError):
                    pass
            objective = self.objective
            if objective is None or len(history) < 2:
                continue
            (t0, b0), (t1, b1) = history[0], history[-1]
            if t1 - t0 < self.window / 2:
                continue
            try:
                fd = os.open(objective, os.O_WRONLY)
                try:
                    os.write(fd, f"{(b1 - b0) / MIB / (t1 - t0):.3f} "
                                 f"window={self.window:g}\n".encode())
                finally:
                    os.close(fd)
            except OSError:
                self.write_errors += 1


def worker_main(path: str, device: str, procs: str) -> int:
    """The child: join the cgroup, then serve one JSON command per stdin line."""
    Path(procs).write_text(f"{os.getpid()}\n")
    work = Workload(Path(path), device)
    sampler = Sampler(work)
    sampler.start()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "visit":
            work.label = cmd.get("label", "")
            done, seconds = work.visit(cmd["phase"], cmd["seconds"], cmd.get("budget"))
            work.label = ""
            reply: dict = {"bytes": done, "seconds": seconds}
        elif op == "objective":
            sampler.window = cmd.get("window", 1.0)
            sampler.objective = Path(cmd["path"]) if cmd.get("path") else None
            reply = {"write_errors": sampler.write_errors}
        elif op == "knobs":
            reply = {"knobs": {k: dict(v) for k, v in sampler.knobs.items()}}
            sampler.knobs.clear()
        else:
            reply = {"error": f"unknown op {op!r}"}
        print(json.dumps(reply), flush=True)
    sampler.stop.set()
    return 0


class WorkloadProcess:
    """The parent's handle on the workload child (started by its pid, ended by it)."""

    def __init__(self, path: Path, device: str, procs: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.readahead_win", "--worker", str(path), device,
             str(procs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            cwd=Path(__file__).resolve().parents[2])

    def call(self, **cmd) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the workload process ended (status {self.proc.wait()})")
        return json.loads(line)

    def visit(self, phase: str, seconds: float, budget: int | None = None,
              label: str = "") -> tuple[int, float]:
        reply = self.call(op="visit", phase=phase, seconds=seconds, budget=budget, label=label)
        return reply["bytes"], reply["seconds"]

    def objective(self, path: Path | None, window: float = 1.0) -> int:
        return self.call(op="objective", path=str(path) if path else None,
                         window=window)["write_errors"]

    def knobs(self) -> dict[str, dict[int, int]]:
        return {label: {int(k): n for k, n in tally.items()}
                for label, tally in self.call(op="knobs")["knobs"].items()}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # by its pid
            self.proc.wait()


def run_cycles(work: WorkloadProcess, cycles: int, seconds: float,
               budgets: dict[str, int] | None, label: str = "") -> dict:
    """`cycles` rounds of all phases: {phase: [bytes, seconds]}."""
    acc = {p: [0, 0.0] for p in PHASES}
    for _ in range(cycles):
        for phase in PHASES:
            done, secs = work.visit(phase, seconds, budgets and budgets[phase],
                                    f"{label}/{phase}" if label else "")
            acc[phase][0] += done
            acc[phase][1] += secs
    return acc


def set_read_ahead(device: str, value: int) -> None:
    Path(f"/sys/block/{device}/queue/read_ahead_kb").write_text(f"{value}\n")


def get_read_ahead(device: str) -> int:
    return int(Path(f"/sys/block/{device}/queue/read_ahead_kb").read_text())


# ---- the experiment ---------------------------------------------------------------------
def run_mlfs(args: argparse.Namespace, work: WorkloadProcess, device: str, root: Path,
             default: int, best: int, budgets: dict[str, int],
             log: logging.Logger) -> tuple[dict, dict]:
    """Train, then measure default / best static / mlfs interleaved in the same mount
    (win_harness: `train_online`, `ModelSwitch`, `interleave`)."""
    info: dict = {}
    runs: dict[str, list[dict]] = {c: [] for c in CONDITIONS}
    mount = Mount(root, CONFIG.format(share=args.learning_share, device=device,
                                      tick=args.tick), name="mlfs")
    sub_name = f"linux.block.{device}"
    try:
        mount.start()
        sub = mount.mountpoint / sub_name
        work.objective(sub / "objective", window=0.8 * args.tick)  # the measure window
        mdir = sub / "models" / MODEL
        print(f"mlfs: training {args.train_seconds:.0f} s (tick {args.tick} s, learning "
              f"share {args.learning_share}, {args.explore_ticks} ticks per exploration)",
              flush=True)
        info = train_online(mount.mountpoint, sub_name, MODEL,
                            lambda: run_cycles(work, 1, args.train_phase, None, "train"),
                            args.train_seconds, explore_ticks=args.explore_ticks,
                            seed=args.seed, log=log, switching=args.train_switching)
        info["by_source"] = efficiency_by_source(mdir)
        policy = (mdir / "policy").read_text()
        trained_efficiency = (mdir / "efficiency").read_text().strip()  # the proxy's estimate
        write_attr(mdir / "mode", "recommendation\n")
        info["explored"] = {label.split("/")[1]: dict(sorted(tally.items()))
                            for label, tally in work.knobs().items()}
        info["efficiency_after_training"] = trained_efficiency
        print(f"mlfs: trained: {json.dumps(info)}", flush=True)
        if not policy:
            print("mlfs: no policy was uploaded: mlfs = the default algorithm", flush=True)

        def settled(condition: str) -> None:
            wait_for(lambda: get_read_ahead(device) == (best if condition == "best static"
                                                        else default))

        switch = ModelSwitch(mdir, f"read_ahead_kb={default}", f"read_ahead_kb={best}",
                             args.tick, settled)

        def after_run(rep: int, acc: dict) -> None:
            tallies = work.knobs()
            for condition in CONDITIONS:
                run = rates(acc[condition])
                run["knobs"] = {p: dict(Counter(tallies.get(f"{condition}/{p}", {}))
                                        .most_common(4)) for p in PHASES}
                runs[condition].append(run)
                print(f"  {condition:12s} run {rep + 1}: {fmt(run)}  "
                      f"read_ahead_kb {run['knobs']}", flush=True)

        interleave(args.repeats, args.cycles, switch,
                   lambda c: run_cycles(work, 1, args.phase_seconds * args.cap, budgets, c),
                   PHASES, after_run)
        info["objective_write_errors"] = work.objective(None)
        info["efficiency"] = (mdir / "efficiency").read_text().strip()
    finally:
        if mount.pid is not None:
            done = mount.umount()
            if done.returncode != 0:
                print(f"mlfs umount: {done.stdout}{done.stderr}", file=sys.stderr)
            mount.kill()
        if args.keep_pairs:  # the model's pairs, saved when the mount closed (levels.py)
            saved = sorted((root / "mlfs-state").rglob(SAFE_SET_FILE))
            if saved:
                shutil.copyfile(saved[0], args.keep_pairs)
            else:
                print(f"mlfs: no {SAFE_SET_FILE} was saved", file=sys.stderr)
    return runs, info


def experiment(args: argparse.Namespace) -> int:
    commit = measured_commit()  # at the start: edits made while it runs are not it
    log = logging.getLogger("mlfs.train")
    other_ra = {d: get_read_ahead(d) for d in ("vda", "sda", "nvme0n1")
                if Path(f"/sys/block/{d}").exists()}
    ok = True
    info: dict = {}
    runs: dict[str, list[dict]] = {}
    sweep: dict[int, dict] = {}
    best = default = -1
    with scratch_filesystem(args.file_mib + 128) as (device, mnt), \
            memory_cgroup(args.memory_mib * MIB) as procs:
        original = get_read_ahead(device)  # a loop device may start with io_opt-based 2560
        default = args.default_kb if args.default_kb is not None else original
        work = None
        try:
            # the default algorithm is the value in place when mlfs starts: the stock one
            set_read_ahead(device, default)
            data = mnt / "data"
            make_file(data, args.file_mib)
            work = WorkloadProcess(data, device, procs)
            print(f"device {device} (direct-io loop, ext4), file {args.file_mib} MiB, "
                  f"workload in a {args.memory_mib} MiB memory cgroup, original read_ahead_kb "
                  f"{original}, default {default}", flush=True)
            # 0. the work of a phase visit: what the default reads in --phase-seconds
            got = run_cycles(work, 2, args.phase_seconds, None)
            budgets = {p: int(b / s * args.phase_seconds) for p, (b, s) in got.items()}
            print("work per visit (bytes the default reads in "
                  f"{args.phase_seconds:g} s): "
                  + ", ".join(f"{p} {b / MIB:.1f} MiB" for p, b in budgets.items()), flush=True)
            # 1. the sweep (no daemon; sysfs written directly), interleaved: every value
            # once per round, the order rotating; the best static and the oracle are
            # chosen on the even rounds and measured on the odd ones (`held_out`)
            grid = list(dict.fromkeys([default, *args.grid]))

            def visit(ra: int, n: int) -> dict:
                set_read_ahead(device, ra)
                return rates(run_cycles(work, args.sweep_cycles, args.phase_seconds * args.cap,
                                        budgets))["mib_per_s"]

            rounds = interleaved_sweep(grid, max(2, args.sweep_rounds), visit)
            for ra in grid:
                sweep[ra] = {p: statistics.fmean(r[ra][p] for r in rounds)
                             for p in rounds[0][ra]}
                print(f"  sweep ra={ra:5d}: "
                      + " ".join(f"{k} {v:7.1f}" for k, v in sweep[ra].items()), flush=True)
            set_read_ahead(device, default)
            found = held_out(rounds, PHASES, default)
            best, oracle = found["best_static"], found["oracle"]
            oracle_overall = found["oracle_held_out"]
            print(held_out_text(found), flush=True)
            # 2. training, then the three conditions interleaved in the mount
            runs, info = run_mlfs(args, work, device, mnt.parent, default, best, budgets, log)
            info["budgets_mib"] = {p: round(b / MIB, 1) for p, b in budgets.items()}
            info["oracle"] = oracle
            info["oracle_overall"] = oracle_overall
            info["held_out"] = found
            after = get_read_ahead(device)
            print(f"after mlfs unmount: {device} read_ahead_kb = {after} "
                  f"({'restored' if after == default else 'NOT restored'} to {default})",
                  flush=True)
            ok = after == default
            set_read_ahead(device, original)
        finally:
            if work is not None:
                work.close()
            now = get_read_ahead(device)
            if now != original:
                print(f"read_ahead_kb of {device} is {now}, not its original {original}; "
                      "restoring", file=sys.stderr)
                set_read_ahead(device, original)
                ok = False
            else:
                print(f"restored: {device} read_ahead_kb = {now} (its original)", flush=True)
    for d, ra in other_ra.items():
        if get_read_ahead(d) != ra:
            print(f"{d}: read_ahead_kb changed {ra} -> {get_read_ahead(d)}", file=sys.stderr)
            ok = False
    results = {f"default ({default})": runs.get("default", []),
               f"best static ({best})": runs.get("best static", []),
               "mlfs": runs.get("mlfs", [])}
    print()
    print(table(results, PHASES))
    chosen: Counter = Counter()
    for run in results["mlfs"]:
        for phase, knobs in run["knobs"].items():
            for ra, n in knobs.items():
                chosen[(phase, ra)] += n
    print("mlfs read_ahead_kb in effect per phase (0.1 s samples): "
          + "; ".join(f"{p}: " + ", ".join(f"{ra}x{n}" for (q, ra), n in chosen.most_common()
                                          if q == p) for p in PHASES))
    print("sweep (no daemon, one run each): " + json.dumps(
        {ra: {k: round(v, 1) for k, v in row.items()} for ra, row in sweep.items()}))
    print(f"mlfs: {json.dumps(info)}")
    if args.json:
        stored = {k: v for k, v in vars(args).items() if k not in ("json", "keep_pairs")}
        Path(args.json).write_text(json.dumps({"commit": commit, "args": stored,
                                               "results": results, "sweep": sweep,
                                               "best": best, "mlfs": info}, indent=1))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(*argv[1:4])

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too runs the clean-up (restore, umount, detach)

    signal.signal(signal.SIGTERM, interrupted)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        print("readahead_win: needs root (loop devices, mount, cgroups)", file=sys.stderr)
        return 2
    why = fuse_unavailable() or tracer_unavailable()
    if why:
        print(f"readahead_win: {why}", file=sys.stderr)
        return 2
    return experiment(args)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The run's options, `--quick` applied (README's table parses its command with this
    to check it against the options a run stored: `against_fixed.command_differs`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, < 6 minutes")
    parser.add_argument("--file-mib", type=int, default=1024)
    parser.add_argument("--memory-mib", type=int, default=128,
                        help="memory cgroup limit of the workload (its page cache)")
    parser.add_argument("--phase-seconds", type=float, default=4.0,
                        help="a visit's work: what the default reads in this long")
    parser.add_argument("--cap", type=float, default=4.0,
                        help="a visit ends after cap x phase-seconds even if unfinished")
    parser.add_argument("--cycles", type=int, default=2, help="phase cycles per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per condition")
    parser.add_argument("--grid", type=lambda s: [int(v) for v in s.split(",")],
                        default=[0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--sweep-cycles", type=int, default=1,
                        help="phase cycles per setting per sweep round")
    parser.add_argument("--sweep-rounds", type=int, default=2,
                        help="interleaved sweep rounds (>= 2: half choose, half measure)")
    parser.add_argument("--tick", type=float, default=0.25)
    parser.add_argument("--train-seconds", type=float, default=600.0)
    parser.add_argument("--train-phase", type=float, default=4.0,
                        help="phase length while training")
    parser.add_argument("--train-switching", choices=("pinned", "auto"), default="pinned",
                        help="pinned: the model stays in learning while it trains; auto: "
                        "the mode machine switches it (the timeline is reported)")
    parser.add_argument("--explore-ticks", type=int, default=2,
                        help="ticks each exploration lasts")
    parser.add_argument("--learning-share", type=float, default=0.8)
    parser.add_argument("--default-kb", type=int, default=128,
                        help="the default read_ahead_kb (the kernel's stock 128 KiB; a loop "
                             "device may start with more); -1: keep the device's own")
    parser.add_argument("--seed", type=int, default=0, help="the trainer's seed")
    parser.add_argument("--keep-pairs", type=Path, default=None,
                        help="copy the model's measured pairs (measured.json) here after "
                        "the run: `python -m tests.bench.levels` shows every level's standing")
    parser.add_argument("--json", help="write all results to this file")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.file_mib, args.memory_mib, args.phase_seconds = 512, 64, 2.0
        args.cycles, args.repeats, args.grid = 1, 1, [0, 32, 128, 512, 2048]
        # 4 s training phases, as the full run: with 2 s ones (8 ticks) half the counted
        # episodes (4 ticks from default to default) straddle a phase, and the model
        # never left learning in 300 s (docs/results/against-fixed.md)
        args.train_seconds, args.train_phase = 120.0, 4.0
    if args.default_kb is not None and args.default_kb < 0:
        args.default_kb = None
    return args


if __name__ == "__main__":
    sys.exit(main())
