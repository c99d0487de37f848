"""Does mlfs beat a static read_ahead_kb on a real device?  (issue 4: the win, measured)

Set-up (the helpers of `readahead_experiment`): a sparse image on the root
file system attached as a direct-io loop device (the host's page cache does
not serve the reads), ext4 on it, one data file of random bytes.  A Python
workload cycles through phases, each for `--phase-seconds`, each starting
with the file's pages dropped (a cold cache; the cache is dropped again
whenever a pass wraps, and every second for the random phase, so the phases
stay cold; the file is re-opened every 50 ms, keeping the position, because
the kernel copies read_ahead_kb into a file's readahead state at open, so
the knob never reaches a descriptor opened before it changed):

- ``sequential``: 4 KiB buffered reads front to back;
- ``random``: 4 KiB preads at uniformly random 4 KiB-aligned offsets;
- ``strided``: 32 KiB records (eight 4 KiB preads) every 512 KiB.

On a direct-io loop device no static read_ahead_kb is best for all three:
sequential wants large readahead, strided records want a small one (large
readahead reads the 480 KiB gaps too), random reads are indifferent.

First a sweep (no daemon, sysfs written directly, `--sweep-cycles` cycles per
value of `--grid`) picks the best static value: the highest overall
throughput.  Then mlfs mounts with a configuration serving
``linux.block.<loop>`` with ``apply = {read_ahead_kb = [0, 4096]}`` and
`--tick` second ticks.  The workload writes its own MiB/s (over the tick's
measurement window, refreshed every 0.1 s) to the subsystem's ``objective``
file, so the objective of every row is the application's throughput, not the
device's MB/s (which wasted readahead inflates: strided at 4 MiB readahead
moves ~10x the bytes it uses).  The trainer (`trainers.worker.run_worker`,
LightGBM) runs in a thread for `--train-seconds` while the phases cycle, with
the model pinned in ``learning`` mode (``learning_share`` `--learning-share`,
so most ticks explore); then the trainer is stopped and its uploaded policy
stays loaded in the proxy, which runs it itself each tick.  The phase is not
told to mlfs: the policy sees only the backend's device features of the
previous tick (mean request size, I/Os, merges, MB/s, await...).

Evaluation, in the same mount, every phase visit measured under the three
conditions in turn (so the shared VM's drifts, which move a single run by up
to 2x, hit all three alike, and the daemon's overhead is in all three):

- ``best static``: the model pinned in ``recommendation`` mode
  (``recommendation_probe = 0``) with a recommendation without ttl;
- ``default``: the model pinned in ``emergency``: the default algorithm, the
  value in place when mlfs started (`--default-kb`, the kernel's stock 128
  KiB; a direct-io loop device starts at its io_opt-based value, e.g. 2560);
- ``mlfs``: the model pinned in ``recommendation``, its policy deciding every
  tick from the previous tick's features (at a visit's start: a default tick
  of the same phase).

`--repeats` runs of `--cycles` cycles give the spread.

Output: application MiB/s per phase and overall (bytes over time), median and
[min, max] over the runs, the ratio to the default, and for mlfs the
read_ahead_kb it chose in each phase.  Everything is undone at the end (even
on Ctrl-C): the daemon is unmounted and ended by its pid, the loop device's
read_ahead_kb is checked to be its original again, the file system is
unmounted and the loop device detached.  Needs root, losetup, mkfs.ext4, FUSE.

    .venv/bin/python -m tests.bench.readahead_win --quick   # < 3 minutes
    .venv/bin/python -m tests.bench.readahead_win           # < 15 minutes
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from pathlib import Path

from tests.bench.readahead_experiment import MIB, drop_cache, make_file, scratch_filesystem
from tests.conftest import Mount, fuse_unavailable

PHASES = ("sequential", "random", "strided")
RECORD = 32 * 1024
STRIDE = 512 * 1024
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
objective = "read_mb_per_s"
goal = "max"
apply = {{read_ahead_kb = [0, 4096]}}
"""


# ---- the workload ------------------------------------------------------------------
class Workload:
    """The phase cycle, with a byte counter a sampler thread turns into MiB/s."""

    def __init__(self, path: Path, device: str) -> None:
        self.path = path
        self.size = path.stat().st_size
        self.ra_path = Path(f"/sys/block/{device}/queue/read_ahead_kb")
        self.done = 0  # bytes read so far (only the workload thread adds)
        self.label = ""  # what the sampler tallies the read_ahead_kb in effect under
        self.seed = 0

    # each phase reads until `deadline` and returns the bytes it read
    # Each phase re-opens the file every REOPEN_SECONDS, keeping its position,
    # as a data loader moving from shard to shard does: the kernel copies
    # read_ahead_kb into a file's readahead state at open (file_ra_state_init),
    # so a device-level knob never reaches a file descriptor opened before it
    # changed.
    def _reader(self, deadline: float, read: Callable[[int], int]) -> int:
        done = 0
        while (now := time.monotonic()) < deadline:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                reopen = min(deadline, now + REOPEN_SECONDS)
                while time.monotonic() < reopen:
                    n = read(fd)
                    done += n
                    self.done += n
            finally:
                os.close(fd)
        return done

    def sequential(self, deadline: float) -> int:
        offset = 0

        def read(fd: int) -> int:
            nonlocal offset
            n = 0
            for _ in range(64):
                if offset + PAGE > self.size:
                    drop_cache(self.path)
                    offset = 0
                got = len(os.pread(fd, PAGE, offset))
                offset += got
                n += got
            return n

        return self._reader(deadline, read)

    def random(self, deadline: float) -> int:
        self.seed += 1
        rng = random.Random(self.seed)
        pages = self.size // PAGE
        next_drop = time.monotonic() + 1.0

        def read(fd: int) -> int:
            nonlocal next_drop
            if time.monotonic() >= next_drop:
                drop_cache(self.path)
                next_drop = time.monotonic() + 1.0
            return sum(len(os.pread(fd, PAGE, rng.randrange(pages) * PAGE))
                       for _ in range(16))

        return self._reader(deadline, read)

    def strided(self, deadline: float) -> int:
        offset = 0

        def read(fd: int) -> int:
            nonlocal offset
            if offset + RECORD > self.size:
                drop_cache(self.path)
                offset = 0
            # a record as an application reads it: 4 KiB at a time
            n = sum(len(os.pread(fd, PAGE, offset + page)) for page in range(0, RECORD, PAGE))
            offset += STRIDE
            return n

        return self._reader(deadline, read)

    def visit(self, phase: str, seconds: float) -> tuple[int, float]:
        """One phase visit from a cold cache: (bytes, seconds)."""
        drop_cache(self.path)
        started = time.monotonic()
        done = getattr(self, phase)(started + seconds)
        return done, time.monotonic() - started

    def run(self, cycles: int, phase_seconds: float) -> dict[str, tuple[int, float]]:
        """`cycles` rounds of all phases; {phase: (bytes, seconds)}, plus "overall"."""
        out = {p: [0, 0.0] for p in PHASES}
        for _ in range(cycles):
            for phase in PHASES:
                self.label = phase
                done, seconds = self.visit(phase, phase_seconds)
                out[phase][0] += done
                out[phase][1] += seconds
        self.label = ""
        result = {p: (int(b), float(s)) for p, (b, s) in out.items()}
        result["overall"] = (sum(b for b, _ in result.values()),
                             sum(s for _, s in result.values()))
        return result


class Sampler(threading.Thread):
    """Every 0.1 s: the app's MiB/s over the last `window` s (written to `objective`
    when given) and the read_ahead_kb in effect, tallied per phase."""

    def __init__(self, work: Workload, window: float, objective: Path | None) -> None:
        super().__init__(daemon=True, name="sampler")
        self.work = work
        self.window = window
        self.objective = objective
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
            if self.objective is None or len(history) < 2:
                continue
            (t0, b0), (t1, b1) = history[0], history[-1]
            if t1 - t0 < self.window / 2:
                continue
            try:
                fd = os.open(self.objective, os.O_WRONLY)
                try:
                    os.write(fd, f"{(b1 - b0) / MIB / (t1 - t0):.3f}\n".encode())
                finally:
                    os.close(fd)
            except OSError:
                self.write_errors += 1


def measure(work: Workload, cycles: int, phase_seconds: float, window: float,
            objective: Path | None = None) -> dict:
    sampler = Sampler(work, window, objective)
    sampler.start()
    try:
        result = work.run(cycles, phase_seconds)
    finally:
        sampler.stop.set()
        sampler.join()
    mib = {p: b / MIB / s for p, (b, s) in result.items()}
    knobs = {p: dict(sampler.knobs[p].most_common(3)) for p in PHASES}
    return {"mib_per_s": mib, "knobs": knobs, "write_errors": sampler.write_errors}


def set_read_ahead(device: str, value: int) -> None:
    Path(f"/sys/block/{device}/queue/read_ahead_kb").write_text(f"{value}\n")


def get_read_ahead(device: str) -> int:
    return int(Path(f"/sys/block/{device}/queue/read_ahead_kb").read_text())


# ---- reporting -----------------------------------------------------------------------
def summarize(runs: list[dict]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for key in (*PHASES, "overall"):
        values = [r["mib_per_s"][key] for r in runs]
        out[key] = ((statistics.median(values), min(values), max(values)) if values
                    else (0.0, 0.0, 0.0))
    return out


def table(results: dict[str, list[dict]]) -> str:
    summaries = {name: summarize(runs) for name, runs in results.items() if runs}
    base = next(iter(summaries.values()), None)  # the first condition: the default
    head = f"{'condition':22s}" + "".join(f"{k:>28s}" for k in (*PHASES, "overall"))
    lines = [head, "-" * len(head)]
    for name, summary in summaries.items():
        cells = []
        for key in (*PHASES, "overall"):
            med, lo, hi = summary[key]
            ratio = f" x{med / base[key][0]:.2f}" if base and base[key][0] > 0 else ""
            cells.append(f"{med:7.1f} [{lo:6.1f},{hi:6.1f}]{ratio}")
        lines.append(f"{name:22s}" + "".join(f"{c:>28s}" for c in cells))
    lines.append("(application MiB/s: median [min, max] over runs; xN = median / default)")
    return "\n".join(lines)


# ---- the experiment ---------------------------------------------------------------------
def write_attr(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def wait_read_ahead(device: str, value: int, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get_read_ahead(device) == value:
            return True
        time.sleep(0.01)
    return False


def run_mlfs(args: argparse.Namespace, work: Workload, device: str, root: Path,
             default: int, best: int, log: logging.Logger) -> tuple[dict, dict]:
    """Train, then measure default / best static / mlfs interleaved in the same mount.

    Each phase visit is measured under the three conditions in turn (best
    static, default, mlfs), so slow drifts of the shared VM hit all three alike
    and the daemon's own overhead (ticks, FUSE, the objective writes) is in
    every condition.  Best static is a recommendation without ttl from the
    same model proxy (pinned recommendation mode, no probe ticks), default is
    the model pinned in emergency (the default algorithm), mlfs is the model
    pinned in recommendation with its policy deciding every tick.
    """
    from trainers.worker import run_worker

    info: dict = {}
    conditions = ("best static", "default", "mlfs")
    runs: dict[str, list[dict]] = {c: [] for c in conditions}
    mount = Mount(root, CONFIG.format(share=args.learning_share, device=device,
                                      tick=args.tick), name="mlfs")
    sub_name = f"linux.block.{device}"
    try:
        mount.start()
        sub = mount.mountpoint / sub_name
        objective = sub / "objective"
        window = 0.8 * args.tick  # the backend's measure_seconds
        mdir = sub / "models" / MODEL
        os.mkdir(mdir)
        write_attr(mdir / "mode", "learning\n")  # pinned: keep exploring while training
        stop = threading.Event()
        stats: dict = {}

        def train() -> None:
            stats.update(run_worker(str(mount.mountpoint), sub_name, MODEL, stop=stop,
                                    max_seconds=args.train_seconds + 60, log=log))

        trainer = threading.Thread(target=train, name="trainer", daemon=True)
        trainer.start()
        print(f"mlfs: training {args.train_seconds:.0f} s (tick {args.tick} s, learning "
              f"share {args.learning_share})", flush=True)
        started = time.monotonic()
        train_cycles = max(1, round(args.train_seconds / (len(PHASES) * args.train_phase)))
        measure(work, train_cycles, args.train_phase, window, objective)
        stop.set()
        trainer.join(timeout=30)
        policy = (mdir / "policy").read_text()
        write_attr(mdir / "mode", "recommendation\n")
        info = {
            "train_seconds": round(time.monotonic() - started, 1),
            "trainer": {k: stats.get(k) for k in ("fits", "corrections", "policies",
                                                   "recommendations", "explorations",
                                                   "rows", "val_mae", "val_mae_naive")},
            "policy_bytes": len(policy),
        }
        print(f"mlfs: trained: {json.dumps(info)}", flush=True)
        if not policy:
            print("mlfs: no policy was uploaded: mlfs = the default algorithm", flush=True)

        def switch(condition: str) -> None:
            if condition == "best static":
                write_attr(mdir / "mode", "recommendation\n")
                write_attr(mdir / "recommend", f"read_ahead_kb={best}\n")
                wait_read_ahead(device, best)
            elif condition == "default":
                # supersede the static one; it expires during this visit
                write_attr(mdir / "recommend", f"read_ahead_kb={default} ttl=1\n")
                write_attr(mdir / "mode", "emergency\n")
                wait_read_ahead(device, default)
            else:
                write_attr(mdir / "mode", "recommendation\n")  # the policy decides

        sampler = Sampler(work, window, objective)
        sampler.start()
        try:
            for rep in range(args.repeats):
                acc = {c: {p: [0, 0.0] for p in PHASES} for c in conditions}
                for _ in range(args.cycles):
                    for phase in PHASES:
                        for condition in conditions:
                            switch(condition)
                            work.label = f"{condition}/{phase}"
                            done, seconds = work.visit(phase, args.phase_seconds)
                            work.label = ""
                            acc[condition][phase][0] += done
                            acc[condition][phase][1] += seconds
                for condition in conditions:
                    run = rates(acc[condition])
                    run["knobs"] = {p: dict(sampler.knobs[f"{condition}/{p}"].most_common(4))
                                    for p in PHASES}
                    runs[condition].append(run)
                    print(f"  {condition:12s} run {rep + 1}: {fmt(run)}  "
                          f"read_ahead_kb {run['knobs']}", flush=True)
                sampler.knobs.clear()
        finally:
            sampler.stop.set()
            sampler.join()
        info["objective_write_errors"] = sampler.write_errors
        info["efficiency"] = (mdir / "efficiency").read_text().strip()
    finally:
        if mount.pid is not None:
            done = mount.umount()
            if done.returncode != 0:
                print(f"mlfs umount: {done.stdout}{done.stderr}", file=sys.stderr)
            mount.kill()
    return runs, info


def rates(acc: dict[str, list]) -> dict:
    total = (sum(b for b, _ in acc.values()), sum(s for _, s in acc.values()))
    mib = {p: b / MIB / s if s else 0.0 for p, (b, s) in acc.items()}
    mib["overall"] = total[0] / MIB / total[1] if total[1] else 0.0
    return {"mib_per_s": mib}


def fmt(run: dict) -> str:
    return " ".join(f"{k} {v:7.1f}" for k, v in run["mib_per_s"].items())


def experiment(args: argparse.Namespace) -> int:
    log = logging.getLogger("mlfs.train")
    other_ra = {d: get_read_ahead(d) for d in ("vda", "sda", "nvme0n1")
                if Path(f"/sys/block/{d}").exists()}
    ok = True
    info: dict = {}
    runs: dict[str, list[dict]] = {}
    with scratch_filesystem(args.file_mib + 128) as (device, mnt):
        original = get_read_ahead(device)  # a loop device may start with io_opt-based 2560
        default = args.default_kb if args.default_kb is not None else original
        try:
            # the default algorithm is the value in place when mlfs starts: the stock one
            set_read_ahead(device, default)
            data = mnt / "data"
            make_file(data, args.file_mib)
            work = Workload(data, device)
            window = 0.8 * args.tick
            print(f"device {device} (direct-io loop, ext4), file {args.file_mib} MiB, "
                  f"original read_ahead_kb {original}, default {default}", flush=True)
            # 1. the sweep (no daemon; sysfs written directly)
            sweep = {}
            for ra in args.grid:
                set_read_ahead(device, ra)
                run = measure(work, args.sweep_cycles, args.phase_seconds, window)
                sweep[ra] = run["mib_per_s"]
                print(f"  sweep ra={ra:5d}: {fmt(run)}", flush=True)
            set_read_ahead(device, default)
            best = max(sweep, key=lambda ra: sweep[ra]["overall"])
            oracle = {p: max(sweep, key=lambda ra, p=p: sweep[ra][p]) for p in PHASES}
            print(f"best static: {best}; best per phase in the sweep: {oracle}", flush=True)
            # 2. training, then the three conditions interleaved in the mount
            runs, info = run_mlfs(args, work, device, mnt.parent, default, best, log)
            after = get_read_ahead(device)
            print(f"after mlfs unmount: {device} read_ahead_kb = {after} "
                  f"({'restored' if after == default else 'NOT restored'} to {default})",
                  flush=True)
            ok = after == default
            set_read_ahead(device, original)
        finally:
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
    print(table(results))
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
        Path(args.json).write_text(json.dumps({"results": results, "sweep": sweep,
                                               "best": best, "mlfs": info}, indent=1))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, < 3 minutes")
    parser.add_argument("--file-mib", type=int, default=1024)
    parser.add_argument("--phase-seconds", type=float, default=6.0)
    parser.add_argument("--cycles", type=int, default=1, help="phase cycles per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per condition")
    parser.add_argument("--grid", type=lambda s: [int(v) for v in s.split(",")],
                        default=[16, 64, 128, 256, 512, 1024, 4096])
    parser.add_argument("--sweep-cycles", type=int, default=1)
    parser.add_argument("--tick", type=float, default=0.5)
    parser.add_argument("--train-seconds", type=float, default=360.0)
    parser.add_argument("--train-phase", type=float, default=6.0,
                        help="phase length while training")
    parser.add_argument("--learning-share", type=float, default=0.7)
    parser.add_argument("--default-kb", type=int, default=128,
                        help="the default read_ahead_kb (the kernel's stock 128 KiB; a loop "
                             "device may start with more); -1: keep the device's own")
    parser.add_argument("--json", help="write all results to this file")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.file_mib, args.phase_seconds, args.cycles, args.repeats = 512, 3.0, 1, 2
        args.grid, args.train_seconds, args.train_phase = [32, 128, 512, 2048], 65.0, 3.0
        args.tick = 0.25  # the trainer fits after 200 new rows: 50 s at 0.25 s ticks
    if args.default_kb is not None and args.default_kb < 0:
        args.default_kb = None
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        print("readahead_win: needs root (loop devices, mount)", file=sys.stderr)
        return 2
    why = fuse_unavailable()
    if why:
        print(f"readahead_win: {why}", file=sys.stderr)
        return 2
    return experiment(args)


if __name__ == "__main__":
    sys.exit(main())
