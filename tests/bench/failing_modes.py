"""The failing disk through a mount: does the mode machine keep the rule's alerts until the
model beats the rule?

    python -m tests.bench.failing_modes [--runs 3] [--train-disks 4] [--test-disks 8]
        [--json-dir DIR]                                                         (as root)

`tests.bench.failing_predict` asks the same question offline, by calling the proxy's gate
on outcomes it counts itself.  Here nothing is called by hand: one real mount watches
every disk of the project's own (tests/failing_disk.py, each under a loop device) through
`linux.health`; `mlfs train` (a subprocess, as a user runs it) creates the predictor,
fits it from the mount's labelled rows as disks die and uploads its policy; the model is
under automatic switching from its first tick.

Two cohorts die on schedules drawn from their seeds (run 1 on failing_predict's seeds,
each further run on the next 20): the first `--train-disks` early (healthy about
`--train-healthy` s), so the trainer has positives to fit; the other `--test-disks` later
(healthy about `--test-healthy` s, spread by the draw), one after another, while the
policy runs.  A reader keeps each disk busy
until two seconds after its burst, so a disk is one failure, not a stream of them.

The subsystem's `events` are read throughout: each `mode` event is kept with its `why`,
which for a switch to recommendation names the standing the machine decided on (the
model's and the rule's tallies since the previous switch, `RuleStanding.why`).  At the
end: the switches, the raised alerts per source and mode, the model's `incumbent` file,
and the verdict the issue asks for: recommendation reached only where that standing
shows the model beating the rule (`earned`, with the book's own `beats`); otherwise the
rule's alerts stood (raised on the test disks).
"""

from __future__ import annotations

import argparse
import collections
import json
import mmap
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mlfs.backends.linux.bio import device_number

from mlfs.client import EventStream, MountProcess, end_process, read_attr_or
from mlfs.core.models.predictor import Tally, beats
from tests.bench.failing_predict import TEST_SEEDS_FROM, TRAIN_SEEDS_FROM
from tests.failing_disk import FailingLoop

#: one subsystem over every disk; the store's defaults (the trainer seals what it reads)
CONFIG = """
[[subsystem]]
backend = "linux.health"
devices = {devices}
tick_seconds = {tick}
burst_errors = 5
horizon_ticks = {horizon}
"""

MODEL = "p"
#: a line of the model's `alerts` file (docs/ABI.md, "Predictors")
ALERT = re.compile(r"tick=(?P<tick>\d+) target=\S+ dev=(?P<dev>\d+) source=(?P<source>\w+) "
                   r"p=\S+ mode=(?P<mode>\w+)")
#: a run's seeds start this far after the previous run's (more than a cohort holds)
SEEDS_PER_RUN = 20
#: seconds a reader keeps reading after its disk's burst began
READ_AFTER_BURST_S = 2.0


def _reader(device: str, stop: threading.Event, until: float, seed: int) -> None:
    """O_DIRECT 4 KiB reads at random offsets until `until` (monotonic) or `stop`; a
    short pause between them keeps ten disks' servers from taking both cores."""
    rng = random.Random(seed)
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    block = mmap.mmap(-1, 4096)
    try:
        while not stop.is_set() and time.monotonic() < until:
            try:
                os.preadv(fd, [block], 4096 * rng.randrange(4096))
            except OSError:
                pass  # the disk's errors: what the bench is about
            time.sleep(0.002)
    finally:
        os.close(fd)


#: the standing a switch to recommendation names (`RuleStanding.why`)
STANDING = re.compile(r"caught (?P<caught>\d+)/(?P<events>\d+) \(rule (?P<rule_caught>\d+)\), "
                      r"false alarms (?P<fa>\d+) \(rule (?P<rule_fa>\d+)\), median lead "
                      r"(?P<lead>\S+) ticks \(rule (?P<rule_lead>[^)]+)\)")


def _snapshot(model: Path) -> dict:
    return {"mode": read_attr_or(model / "mode", "?"),
            "efficiency": read_attr_or(model / "efficiency", "?"),
            "incumbent": read_attr_or(model / "incumbent", "")}


def earned(why: str) -> bool:
    """Whether the standing a switch to recommendation names (`RuleStanding.why`) shows
    the model beating the rule, by the book's own measure (`predictor.beats`) applied to
    the tallies as the mount wrote them: a check of the mount's word, not of our copy."""
    m = STANDING.search(why)
    if m is None:  # promoted without naming a standing against the rule
        return False
    events = int(m["events"])

    def tally(caught: str, false_alarms: str, lead: str) -> Tally:
        return Tally(events=events, caught=int(caught), false_alarms=int(false_alarms),
                     leads=[float(lead)] if int(caught) else [])

    return beats(tally(m["caught"], m["fa"], m["lead"]),
                 tally(m["rule_caught"], m["rule_fa"], m["rule_lead"]))


def run(args: argparse.Namespace, work: Path, seed_offset: int = 0) -> dict:
    """One run: the disks, the mount, the trainer and the model's switches."""
    cohorts = [("train", TRAIN_SEEDS_FROM + seed_offset + i, args.train_healthy)
               for i in range(args.train_disks)]
    cohorts += [("test", TEST_SEEDS_FROM + seed_offset + i, args.test_healthy)
                for i in range(args.test_disks)]
    disks: list[tuple[str, FailingLoop]] = []
    stop = threading.Event()
    readers: list[threading.Thread] = []
    daemon = trainer = events = None
    try:
        born: dict[str, float] = {}  # each disk's schedule counts from its own start
        for part, seed, healthy in cohorts:
            began = time.monotonic()
            disk = FailingLoop(work / f"disk-{seed}", seed=seed, healthy=healthy,
                               degrading=args.degrading, size_mb=16).start()
            disks.append((part, disk))
            born[disk.name] = began
        names = [disk.name for _, disk in disks]
        devs = {name: device_number(name) for name in names}  # the key alerts name
        (work / "mnt").mkdir()
        (work / "mlfs.toml").write_text(CONFIG.format(devices=json.dumps(names), tick=args.tick,
                                                      horizon=args.horizon))
        daemon = MountProcess(work / "mnt", work / "state", work / "mlfs.toml", timeout=60)
        daemon.start()
        sub = work / "mnt" / "linux.health"
        model = sub / "models" / MODEL
        schedules = {disk.name: disk.schedule() for _, disk in disks}
        # the schedules are the truth, read only to know when to stop each reader and
        # how long to run
        started = time.monotonic()
        for (_, disk), (_, seed, _) in zip(disks, cohorts, strict=True):
            until = born[disk.name] + schedules[disk.name]["failure_s"] + READ_AFTER_BURST_S
            reader = threading.Thread(target=_reader, args=(disk.device, stop, until, seed),
                                      daemon=True)
            reader.start()
            readers.append(reader)
        last_failure = max(born[n] + s["failure_s"] for n, s in schedules.items()) - started
        duration = last_failure + READ_AFTER_BURST_S + args.horizon * args.tick + 5
        events = EventStream(sub / "events")  # open before the trainer makes the model
        trainer = subprocess.Popen(
            [sys.executable, "-m", "mlfs", "train", str(work / "mnt"), "linux.health",
             "--model", MODEL, "--max-seconds", str(duration)],
            stdout=subprocess.DEVNULL, stderr=open(work / "trainer.log", "w"))  # noqa: SIM115
        switches: list[dict] = []  # the mount's own `mode` events, with their `why`
        policy_at = None
        while time.monotonic() - started < duration:
            now = round(time.monotonic() - started, 1)
            for event in events.read(timeout=args.poll):
                if event.get("model") != MODEL:
                    continue
                if event["event"] == "policy" and event.get("status") == "loaded":
                    policy_at = policy_at or now
                elif event["event"] == "mode":
                    switches.append({"t_s": now, "from": event.get("from"),
                                     "to": event.get("to"), "why": event.get("why", "")})
                    print(f"{now:6.1f} s  {event.get('from')} -> {event.get('to')}: "
                          f"{event.get('why', '')}", flush=True)
        final = _snapshot(model)
        alerts = read_attr_or(model / "alerts", "").splitlines()
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=10)
        if trainer is not None:
            end_process(trainer)
        if events is not None:
            events.close()
        if daemon is not None:
            daemon.stop()
        for _, disk in disks:
            disk.stop()
    return judge(args, disks, devs, cohorts, schedules, switches, final, alerts,
                 policy_at)


def judge(args, disks, devs, cohorts, schedules, switches, final, alerts, policy_at) -> dict:
    """The run's figures and the verdict (see the module docstring)."""
    raised = collections.Counter()
    alerted: dict[int, set[str]] = collections.defaultdict(set)
    for line in alerts:
        m = ALERT.search(line)
        if m:
            raised[f"{m['source']} in {m['mode']}"] += 1
            alerted[int(m["dev"])].add(m["source"])
    test = [name for (part, _), name in zip(disks, devs, strict=True) if part == "test"]
    reached = [s for s in switches if s["to"] == "recommendation"]
    unearned = [s for s in reached if not earned(s["why"])]
    rule_on = [name for name in test if "rule" in alerted.get(devs[name], set())]
    if reached:
        verdict = ("recommendation reached " + ", ".join(f"at {s['t_s']} s" for s in reached)
                   + ("; every time with the model beating the rule" if not unearned else
                      f"; {len(unearned)} time(s) WITHOUT the model beating the rule"))
    else:
        verdict = (f"no recommendation: the model stayed in {final['mode']} and the rule's "
                   f"alerts were raised on {len(rule_on)}/{len(test)} test disks")
    return {"args": vars(args), "schedules": schedules,
            "cohorts": [{"part": p, "seed": s, "device": name, "dev": devs[name]}
                        for (p, s, _), name in zip(cohorts, devs, strict=True)],
            "policy_loaded_s": policy_at, "switches": switches, "final": final,
            "alerts_raised": dict(raised), "rule_alerted_test_disks": rule_on,
            "unearned_recommendations": len(unearned), "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3,
                        help="independent runs, each on disks of its own seeds")
    parser.add_argument("--train-disks", type=int, default=4)
    parser.add_argument("--test-disks", type=int, default=8)
    parser.add_argument("--train-healthy", type=float, default=8.0)
    parser.add_argument("--test-healthy", type=float, default=120.0)
    parser.add_argument("--degrading", type=float, default=16.0)
    parser.add_argument("--tick", type=float, default=0.5)
    parser.add_argument("--horizon", type=int, default=20, help="ticks a warning may lead")
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--json-dir", help="write run<N>.json here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("failing_modes: needs root (loop devices, /dev/kmsg, the BPF capture)",
              file=sys.stderr)
        return 2
    for n in range(1, args.runs + 1):
        work = Path(tempfile.mkdtemp(prefix="mlfs-failing-modes-"))
        out = run(args, work, seed_offset=SEEDS_PER_RUN * (n - 1))
        out["trainer"] = read_attr_or(work / "trainer.log", "").splitlines()[-1:]
        if not any(os.path.ismount(m) for m in work.glob("**/mnt")):
            shutil.rmtree(work, ignore_errors=True)
        print(f"run {n}: {out['verdict']}", flush=True)
        raised = sorted(out["alerts_raised"].items())
        print("  alerts raised: " + ", ".join(f"{k} {v}" for k, v in raised))
        print("  " + out["final"]["incumbent"].replace("\n", "\n  "), flush=True)
        if args.json_dir:
            Path(args.json_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.json_dir) / f"run{n}.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
