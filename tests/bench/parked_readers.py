"""Fair service under load (issue 10, attack 4): root's latency with parked readers.

    .venv/bin/python -m tests.bench.parked_readers [--readers 1000] [--uids 16]
                                                   [--streams 10000] [--json FILE]

A real mount of the simulated subsystem (a portion event every second, as
with the default sealing), then, in one run:

1. root's `version` read and `recommend` write round trips (open, one
   read/write, close) with no reader parked: p50/p99;
2. `--readers` unprivileged `cat MOUNT/sim.readahead/events` processes, spread
   over `--uids` uids (`nobody` and numeric uids through setpriv): as many as
   the limits let park block in read(2), the rest are refused (EMFILE at open
   or EAGAIN at read) and exit; the daemon's CPU share while they are parked
   and nothing is published (what parking costs), root's `version` reads
   then, and the same round trips again (each recommendation's events wake
   every parked reader);
3. `mlfs umount` with them parked: how long it takes;
4. on a new mount: the daemon's RSS and root's `recommend` p50 before, with
   `--streams` opened-but-unread `events` files (opened by root, who is not
   limited, so the figure shows what an unread stream costs) and after they
   are closed; and how many `nobody` gets to open.

Every reader is ended by its PID; both mounts are unmounted.  A timed-out
operation is reported as such (the mount wedged) instead of hanging the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.harness import FAST_CONFIG, REPO, Mount, mlfs_command, new_model

NOBODY_UID = 65534
NOGROUP_GID = 65534
#: an interpreter other users may run (the venv's may live under a 0700 /root)
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"
#: further unprivileged uids (no passwd entry needed: setpriv takes numbers)
FIRST_EXTRA_UID = 61000


def _stat_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_share(pid: int, seconds: float) -> float:
    """The daemon's CPU over `seconds` of wall time, in % of one core."""
    before, start = _stat_cpu(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (_stat_cpu(pid) - before) / (time.monotonic() - start)


class Watchdog:
    """Fail the run (not hang it) if one operation takes longer than `limit` s."""

    def __init__(self, limit: float, on_fire) -> None:
        self.limit = limit
        self.on_fire = on_fire
        self.deadline: float | None = None
        self.fired = False
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self) -> None:
        self.deadline = time.monotonic() + self.limit

    def disarm(self) -> None:
        self.deadline = None

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.fired = True
                self.on_fire()
                return


def round_trips(mount: Mount, model: Path, count: int, watchdog: Watchdog,
                seconds: float = 120.0) -> dict:
    """`count` root reads of `version` and writes to `recommend` (ms), within `seconds`."""
    version = mount.mountpoint / "version"
    recommend = model / "recommend"
    reads, writes = [], []
    deadline = time.monotonic() + seconds
    for i in range(count):
        if time.monotonic() > deadline or watchdog.fired:
            break
        watchdog.arm()
        start = time.perf_counter()
        fd = os.open(version, os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
        reads.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        fd = os.open(recommend, os.O_WRONLY)
        try:
            os.write(fd, f"read_ahead_kb={64 + i % 64}\n".encode())
        finally:
            os.close(fd)
        writes.append((time.perf_counter() - start) * 1000)
        watchdog.disarm()
    if watchdog.fired:  # the operation that wedged never finished: count it as the limit
        reads.append(watchdog.limit * 1000)
        writes.append(watchdog.limit * 1000)
    return {"version": _summary(reads), "recommend": _summary(writes),
            "wedged": watchdog.fired}


def _summary(values: list[float]) -> dict:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]
    return {"n": len(values), "p50_ms": round(statistics.median(values), 3),
            "p99_ms": round(p99, 3), "max_ms": round(values[-1], 3)}


def spawn_readers(path: Path, count: int, uids: list[int]) -> list[subprocess.Popen]:
    procs = []
    for i in range(count):
        uid = uids[i % len(uids)]
        procs.append(subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={NOGROUP_GID}", "--clear-groups",
             "cat", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True))
    return procs


def end_readers(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        if proc.stderr is not None and proc.poll() is not None:
            proc.stderr.close()


def settle(procs: list[subprocess.Popen], seconds: float = 3.0) -> None:
    """Wait until no reader has exited for `seconds` (the refused ones are out)."""
    alive = -1
    stable_since = time.monotonic()
    while time.monotonic() - stable_since < seconds:
        now = sum(1 for p in procs if p.poll() is None)
        if now != alive:
            alive, stable_since = now, time.monotonic()
        time.sleep(0.2)


def refusals(procs: list[subprocess.Popen]) -> dict:
    out: dict[str, int] = {}
    for proc in procs:
        if proc.poll() is None:
            continue
        err = proc.stderr.read().decode(errors="replace").strip()
        reason = err.rsplit(": ", 1)[-1] if err else f"exit {proc.returncode}"
        out[reason] = out.get(reason, 0) + 1
    return out


def metric(mount: Mount, name: str) -> float | None:
    for line in (mount.mountpoint / "metrics").read_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


#: no portion or feedback events unless root causes them (its recommend writes do):
#: the CPU measured with readers parked is what parking itself costs
CONFIG = FAST_CONFIG.replace("silence_seconds = 600.0", "silence_seconds = 3600.0").replace(
    "\nseal_seconds = 1.0", "\nseal_seconds = 3600.0").replace(
    "feedback_seal_seconds = 1.0", "feedback_seal_seconds = 3600.0")


#: `--raised`: limits that let 1,024 readers of 16 uids park (issue 28, item 10)
RAISED = CONFIG.replace("[mount]\n", "[mount]\nmax_tasks = 2048\nevents_blocked_reads = 1024\n"
                        "events_blocked_reads_per_uid = 64\n")


def parked_phase(root: Path, args, result: dict) -> None:
    mount = Mount(root, RAISED if args.raised else CONFIG, name="parked").start()
    procs: list[subprocess.Popen] = []
    watchdog = Watchdog(60.0, lambda: end_readers(procs))
    try:
        model = new_model(mount.sub, "bench")
        round_trips(mount, model, 20, watchdog)  # warm-up
        result["idle"] = round_trips(mount, model, args.samples, watchdog)
        result["idle"]["daemon_cpu_percent"] = round(cpu_share(mount.pid, 5.0), 1)
        uids = [NOBODY_UID] + [FIRST_EXTRA_UID + i for i in range(args.uids - 1)]
        started = time.monotonic()
        procs += spawn_readers(mount.sub / "events", args.readers, uids)
        settle(procs)
        parked = sum(1 for p in procs if p.poll() is None)
        result["readers"] = {
            "started": args.readers, "uids": len(uids), "parked": parked,
            "refused": refusals(procs),
            "seconds_to_settle": round(time.monotonic() - started, 1),
            "daemon_blocked_reads": metric(mount, "mlfs_event_reads_blocked"),
        }
        print(f"  {parked} of {args.readers} readers parked", file=sys.stderr)
        parked_cpu = round(cpu_share(mount.pid, 5.0), 1)  # no event meanwhile
        quiet = []  # root reads version while nothing wakes the parked readers
        for _ in range(args.samples):
            watchdog.arm()
            start = time.perf_counter()
            fd = os.open(mount.mountpoint / "version", os.O_RDONLY)
            os.read(fd, 4096)
            os.close(fd)
            quiet.append((time.perf_counter() - start) * 1000)
            watchdog.disarm()
            if watchdog.fired:
                break
        result["parked_no_events_version"] = _summary(quiet)
        result["parked"] = round_trips(mount, model, args.samples, watchdog)
        result["parked"]["daemon_cpu_percent"] = parked_cpu
        result["parked"]["daemon_rss_mb"] = round(_rss_mb(mount.pid), 1)
        start = time.monotonic()
        done = subprocess.run(mlfs_command("umount", str(mount.mountpoint)),
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        result["umount_seconds_with_readers_parked"] = round(time.monotonic() - start, 2)
        result["umount_status"] = done.returncode
        result["watchdog_fired"] = watchdog.fired
    finally:
        end_readers(procs)
        mount.kill(signal.SIGTERM)


_NOBODY_OPENER = """
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds, error = [], ""
for _ in range(int(sys.argv[2])):
    try:
        fds.append(os.open(sys.argv[1], os.O_RDONLY))
    except OSError as exc:
        error = exc.strerror
        break
print(len(fds), error, flush=True)
sys.stdin.read()
"""


def streams_phase(root: Path, args, result: dict) -> None:
    mount = Mount(root, CONFIG, name="streams").start()
    watchdog = Watchdog(60.0, lambda: None)
    fds: list[int] = []
    try:
        model = new_model(mount.sub, "bench")
        round_trips(mount, model, 20, watchdog)
        time.sleep(1)
        rss_before = _rss_mb(mount.pid)
        before = round_trips(mount, model, args.samples, watchdog)["recommend"]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        events = mount.sub / "events"
        for _ in range(args.streams):
            fds.append(os.open(events, os.O_RDONLY))
        # each recommendation publishes events every unread stream would keep
        with_open = round_trips(mount, model, max(args.samples, 2000), watchdog)["recommend"]
        rss_open = _rss_mb(mount.pid)
        for fd in fds:
            os.close(fd)
        fds.clear()
        time.sleep(2)
        after = round_trips(mount, model, args.samples, watchdog)["recommend"]
        rss_after = _rss_mb(mount.pid)
        nobody = subprocess.run(
            ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOGROUP_GID}", "--clear-groups",
             SYSTEM_PYTHON, "-c", _NOBODY_OPENER, str(events), str(args.streams)],
            input="", capture_output=True, text=True, timeout=120)
        opened, _, error = nobody.stdout.strip().partition(" ")
        result["streams"] = {
            "opened_by_root": args.streams,
            "rss_mb": {"before": round(rss_before, 1), "open": round(rss_open, 1),
                       "after_close": round(rss_after, 1)},
            "recommend_before": before, "recommend_with_streams_open": with_open,
            "recommend_after_close": after,
            "nobody_opened": int(opened or 0), "nobody_refused_with": error or None,
        }
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass  # closed before an interruption
        mount.kill(signal.SIGTERM)


def markdown(result: dict) -> str:
    idle, parked, readers = result["idle"], result["parked"], result["readers"]
    streams = result.get("streams")
    rows = [
        ("root `version` read, p50 / p99 ms", f"{idle['version']['p50_ms']} / "
         f"{idle['version']['p99_ms']}", f"{parked['version']['p50_ms']} / "
         f"{parked['version']['p99_ms']} (max {parked['version']['max_ms']})"),
        ("root `recommend` write, p50 / p99 ms", f"{idle['recommend']['p50_ms']} / "
         f"{idle['recommend']['p99_ms']}", f"{parked['recommend']['p50_ms']} / "
         f"{parked['recommend']['p99_ms']} (max {parked['recommend']['max_ms']})"),
        ("root `version` read, no event meanwhile, p50 / p99 ms",
         f"{idle['version']['p50_ms']} / {idle['version']['p99_ms']}",
         f"{result['parked_no_events_version']['p50_ms']} / "
         f"{result['parked_no_events_version']['p99_ms']}"),
        ("daemon CPU, % of one core", str(idle["daemon_cpu_percent"]),
         str(parked["daemon_cpu_percent"])),
    ]
    lines = [
        "| | 0 readers parked | " + f"{readers['parked']} parked |",
        "|---|---|---|",
    ] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines += [
        "",
        "Wedged: root's round trips stopped after one took over "
        f"{result.get('watchdog_limit', 60)} s and the watchdog ended the readers."
        if parked.get("wedged") else "",
        "",
        f"Readers: {readers['started']} `cat` processes over {readers['uids']} uids; "
        f"{readers['parked']} parked, refused: {readers['refused']}.  "
        f"`mlfs umount` with them parked: {result['umount_seconds_with_readers_parked']} s "
        f"(exit {result['umount_status']}).",
    ]
    if streams:
        lines += [
            "",
            f"{streams['opened_by_root']} unread streams opened by root: daemon RSS "
            f"{streams['rss_mb']['before']} MB before, {streams['rss_mb']['open']} MB open, "
            f"{streams['rss_mb']['after_close']} MB after closing; root `recommend` p50 "
            f"{streams['recommend_before']['p50_ms']} ms before, "
            f"{streams['recommend_with_streams_open']['p50_ms']} ms with them open "
            f"(p99 {streams['recommend_with_streams_open']['p99_ms']}), "
            f"{streams['recommend_after_close']['p50_ms']} ms after.  `nobody` opened "
            f"{streams['nobody_opened']} (refused with: {streams['nobody_refused_with']}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=1000)
    parser.add_argument("--uids", type=int, default=16)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--raised", action="store_true",
                        help="raise the limits so that 1,024 readers of 16 uids park")
    parser.add_argument("--parked-only", action="store_true",
                        help="skip the unread-streams phase")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the benchmark mounts and runs setpriv: run it as root", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="mlfs-bench-", dir="/tmp"))
    os.chmod(root, 0o755)
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "load_average_start": os.getloadavg()[0], "args": vars(args) | {
                        "json": str(args.json) if args.json else None}}
    try:
        parked_phase(root, args, result)
        print(json.dumps(result, indent=2), file=sys.stderr)  # kept if a later phase fails
        if not args.parked_only:
            streams_phase(root, args, result)
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    result["load_average_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
