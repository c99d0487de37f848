"""Action commands: what root configured to run when a predictor raises an alert.

A predictor in recommendation mode may do more than warn: for a subsystem whose
`[[subsystem]]` table in root's configuration file names an `action` (mlfs.abi
ACTION_SETTINGS), each alert the model raises runs that command once with the alerted
entity (a device) as its last argument.  mlfs itself has no action that writes to a
device; what the command does is the operator's.  The action belongs to the configured
subsystem *instance*: when that instance is unloaded the action goes with it (`drop`), and
a subsystem loaded later under the same name has none.

The command runs without a shell of the operator's choosing, with no input and its
output discarded, in a session and process group of its own and, where the daemon may
create cgroups, in a cgroup of its own (`Group`, containment.py).  It is bounded:
- in time: `action_timeout_seconds`, then every process of its cgroup (or its process
  group and session) is killed; the grandchild of a `setsid sleep &` is caught by the
  cgroup, not by the process-group fallback (it left both);
- in processes: a command is *alive* while any process it started lives, not just the
  direct child, and at most MAX_RUNNING commands are alive at once (an alert beyond is
  counted as skipped, never queued); its cgroup holds at most MAX_PROCESSES processes;
- in rate: at most `mount.action_spawns_per_minute` starts over the whole mount (a token
  bucket; a refusal is counted as `limited` and logged), whatever the entities;
- per entity: at most once per `action_every_seconds`.  An entity is never forgotten
  before its interval passed: with MAX_REMEMBERED entities remembered, an alert for a
  new one is refused (`unremembered`) rather than letting an old one run again early.

Nothing waits for a command, ever: the exchange `reap`s on every tick with waitpid
WNOHANG and a read of the cgroup's process list, both of which return at once whatever
the process does.  A process killed at its timeout that is still there KILL_GRACE
seconds later (uninterruptible sleep on a hung device: SIGKILL waits for the I/O) is
*abandoned*: counted, reported in the root `errors`, the log and the model's `alerts`,
and only looked at again (never waited for) so it is reaped if it ever ends.  The red
team's A9 had the tick loop in `wait()` on such a process: the whole mount, and the
emergency switch, hung for as long as the device did.

A command's end is recorded as an `action` event (status, exit code, seconds), a line in
the model's `alerts` file and the `mlfs_actions_total` counter.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from .containment import Cgroups, Group, spawn

log = logging.getLogger("mlfs.actions")

#: commands alive at once, over the whole mount (alive: any process of the command lives)
MAX_RUNNING = 4
#: entities whose last run is remembered (for `action_every_seconds`); when full, a new
#: entity is refused until one's interval passed (never forgotten early)
MAX_REMEMBERED = 4096
DEFAULT_TIMEOUT = 30.0
DEFAULT_EVERY = 3600.0
#: starts per minute over the whole mount (mount.action_spawns_per_minute's default)
DEFAULT_SPAWNS_PER_MINUTE = 60
#: seconds a killed command may take to go before it is abandoned
KILL_GRACE = 5.0
#: abandoned commands still alive before no new command starts (something is badly stuck)
MAX_ABANDONED = 8
#: seconds within which the alerts of one tick share one reap
START_REAP_EVERY = 0.02
#: seconds between two log lines about refusals of the same kind (the count is in metrics)
LOG_EVERY = 10.0


@dataclass
class Running:
    subsystem: str
    process: subprocess.Popen
    group: Group
    argv: list[str]
    started: float
    deadline: float
    report: Callable[[str, int | None, float], None]
    #: the leader's exit code once reaped (its other processes may still live)
    code: int | None = None
    #: when it was killed (monotonic), None before its deadline
    killed_at: float | None = None


class ActionRunner:
    """Every action command of one mount: started, bounded, reaped, counted.

    Built once per mount by the exchange, which reaps it on every tick; the trio thread
    calls every method and none of them waits for a process.
    """

    def __init__(self, actions: dict[str, dict] | None = None,
                 spawns_per_minute: float = DEFAULT_SPAWNS_PER_MINUTE,
                 problem: Callable[[str, str], None] | None = None,
                 cgroups: Cgroups | None = None) -> None:
        #: subsystem -> its checked action settings (from root's configuration only);
        #: the exchange drops a subsystem's when that configured instance leaves
        self.actions = dict(actions or {})
        self._running: list[Running] = []
        #: killed commands whose processes would not die: looked at, never waited for
        self.abandoned: list[Running] = []
        #: (subsystem, entity) -> (when it last ran, its interval), oldest first
        self._last: dict[tuple[str, str], tuple[float, float]] = {}
        self._purged_at = -1e18
        self._reaped_at = -1e18
        #: commands by how they ended or why they did not start: exited, killed,
        #: abandoned, failed, skipped, limited, unremembered
        self.counts: collections.Counter[str] = collections.Counter()
        #: the token bucket: refilled at this rate, holding at most `burst` starts
        self.spawns_per_minute = float(spawns_per_minute)
        self._tokens = self.burst
        self._refilled = time.monotonic()
        self._logged: dict[str, float] = {}
        #: (reason, shown) -> the mount's root `errors` (the exchange's)
        self._problem = problem or (lambda reason, shown: None)
        self._cgroups = cgroups if cgroups is not None else (
            Cgroups.find() if self.actions else Cgroups(None))

    @property
    def burst(self) -> float:
        """Starts the bucket holds: twice MAX_RUNNING, less for a rate below that."""
        return max(1.0, min(self.spawns_per_minute, float(MAX_RUNNING * 2)))

    def configured(self, subsystem: str) -> bool:
        return subsystem in self.actions

    def running(self) -> int:
        """Commands alive now (any of their processes lives), abandoned ones apart."""
        return len(self._running)

    def drop(self, subsystem: str) -> None:
        """The configured instance `subsystem` left the mount: its action goes with it.

        A subsystem loaded later under the same name never inherits it; commands of the
        instance still running are killed at the next reap.
        """
        if self.actions.pop(subsystem, None) is not None:
            log.warning("%s: its configured action goes with it (unloaded)", subsystem)
        for run in self._running:
            if run.subsystem == subsystem:
                run.deadline = 0.0
        for key in [k for k in self._last if k[0] == subsystem]:
            del self._last[key]
        self.reap()

    def start(self, subsystem: str, argument: str,
              report: Callable[[str, int | None, float], None]) -> bool:
        """Run `subsystem`'s command for `argument` unless bounded; `report(status, exit
        code, seconds)` is called when it ends (from `reap`, on the tick loop)."""
        spec = self.actions.get(subsystem)
        if spec is None:
            return False
        now = time.monotonic()
        key = (subsystem, argument)
        every = float(spec.get("action_every_seconds", DEFAULT_EVERY))
        last = self._last.get(key)
        if last is not None and now - last[0] < last[1]:
            return False  # ran for this entity recently: the alert alone stands
        self.reap(every=START_REAP_EVERY)  # one look serves a tick's storm of alerts
        if last is None and len(self._last) >= MAX_REMEMBERED and not self._purge(now):
            return self._refuse("unremembered", report, f"{MAX_REMEMBERED} entities ran "
                                "within their action_every_seconds; a new one waits")
        if len(self._running) >= MAX_RUNNING:
            return self._refuse("skipped", report, None)
        if len(self.abandoned) >= MAX_ABANDONED:
            return self._refuse("skipped", report, f"{len(self.abandoned)} abandoned "
                                "commands are still alive (a hung device?)")
        if not self._take_token(now):
            return self._refuse("limited", report, f"over mount.action_spawns_per_minute "
                                f"= {self.spawns_per_minute:g}")
        self._last.pop(key, None)
        self._last[key] = (now, every)
        argv = [*spec["action"], argument]
        timeout = float(spec.get("action_timeout_seconds", DEFAULT_TIMEOUT))
        try:
            process, group = spawn(argv, self._cgroups)
        except OSError as exc:
            self.counts["failed"] += 1
            log.error("%s: action %s did not start: %s", subsystem, argv[0],
                      exc.strerror or exc)
            report("failed", None, 0.0)
            return False
        self._running.append(Running(subsystem, process, group, argv, now, now + timeout,
                                     report))
        log.warning("%s: action started: %s", subsystem, " ".join(argv))
        return True

    def _take_token(self, now: float) -> bool:
        rate = self.spawns_per_minute / 60.0
        self._tokens = min(self.burst, self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _purge(self, now: float) -> bool:
        """Forget entities whose interval passed (at most once a second); True if any."""
        if now - self._purged_at < 1.0:
            return False
        self._purged_at = now
        for key in [k for k, (at, every) in self._last.items() if now - at >= every]:
            del self._last[key]
        return len(self._last) < MAX_REMEMBERED

    def _refuse(self, status: str, report, reason: str | None) -> bool:
        self.counts[status] += 1
        report(status, None, 0.0)
        if reason is not None:
            self._say(status, logging.WARNING, "actions %s: %s (%d so far)", status, reason,
                      self.counts[status])
        return False

    def _say(self, kind: str, level: int, message: str, *args) -> None:
        now = time.monotonic()
        if now - self._logged.get(kind, -1e18) >= LOG_EVERY:
            self._logged[kind] = now
            log.log(level, message, *args)

    def reap(self, every: float = 0.0) -> None:
        """Record the commands that ended, kill those past their time, abandon those that
        would not die.  Never blocks: waitpid WNOHANG and a read of the process list.

        `every`: do nothing if the last reap was less than this many seconds ago (the
        exchange reaps on every tick of every subsystem, some ticking 50 times a second;
        without cgroups a look at a command whose shell exited is a walk of /proc).
        """
        now = time.monotonic()
        if not self._running and not self.abandoned:
            return
        if now - self._reaped_at < every:
            return
        self._reaped_at = now
        still = []
        for run in self._running:
            if run.code is None:
                run.code = run.process.poll()
            alive = run.code is None or bool(run.group.members())
            if not alive:
                self._end(run, "killed" if run.killed_at is not None else "exited", now)
                continue
            if run.killed_at is None and now >= run.deadline:
                run.group.kill(run.code is not None)
                run.killed_at = now
            elif run.killed_at is not None:
                run.group.kill(run.code is not None)  # again: what it forked meanwhile
                if now - run.killed_at >= KILL_GRACE:
                    self._abandon(run, now)
                    continue
            still.append(run)
        self._running = still
        self._look_at_abandoned()

    def _end(self, run: Running, status: str, now: float) -> None:
        run.group.remove()
        self.counts[status] += 1
        seconds = round(now - run.started, 3)
        log.warning("action %s %s (exit %s) after %.1f s", run.argv[0], status, run.code,
                    seconds)
        run.report(status, run.code, seconds)

    def _abandon(self, run: Running, now: float) -> None:
        self.counts["abandoned"] += 1
        seconds = round(now - run.started, 3)
        pids = run.group.members() or [run.process.pid]
        reason = (f"{run.subsystem}: action abandoned: processes {pids[:8]} still alive "
                  f"{now - run.killed_at:.0f} s after SIGKILL (uninterruptible sleep?); "
                  "never waited for")
        log.error("%s", reason)
        self._problem(reason, " ".join(run.argv)[:200])
        run.report("abandoned", None, seconds)
        self.abandoned.append(run)

    def _look_at_abandoned(self) -> None:
        still = []
        for run in self.abandoned:
            if run.code is None:
                run.code = run.process.poll()  # reaps the zombie once it dies
            if run.code is None or run.group.members():
                still.append(run)
                continue
            run.group.remove()
            log.warning("action %s: an abandoned command ended after all (exit %s)",
                        run.argv[0], run.code)
        self.abandoned = still

    def close(self, wait: float = 1.0) -> None:
        """Unmount: every command still alive is killed whole (cgroup, else process group
        and session); what has not gone within `wait` seconds is left, and logged."""
        for run in self._running:
            run.deadline = 0.0
        for run in [*self._running, *self.abandoned]:
            run.group.kill(run.code is not None)
        deadline = time.monotonic() + wait
        while True:
            self.reap()
            if not self._running or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        for run in [*self._running, *self.abandoned]:
            run.group.kill(run.code is not None)
            log.error("action %s: processes %s outlive the mount (killed, not gone)",
                      run.argv[0], run.group.members()[:8] or [run.process.pid])
        self._cgroups.close()
