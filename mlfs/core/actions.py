"""Action commands: what root configured to run when a predictor raises an alert.

A predictor in recommendation mode may do more than warn: for a subsystem whose
`[[subsystem]]` table in root's configuration file names an `action` (mlfs.abi
ACTION_SETTINGS), each alert the model raises runs that command once with the alerted
entity (a device) as its last argument.  mlfs itself has no action that writes to a
device; what the command does is the operator's.

The command runs without a shell, in a session of its own, with no input and its output
discarded, and is bounded: at most `action_timeout_seconds` (then killed with its
process group), at most once per `action_every_seconds` for one entity, and at most
MAX_RUNNING at once (an alert beyond is counted as skipped, never queued); the last run
of at most MAX_REMEMBERED entities is remembered, the oldest forgotten first.  Nothing
waits for it: the tick loop starts it and `reap`s it on later ticks, so a hung command
never delays a tick.  Its end is recorded as an `action` event (exit status, seconds),
a line in the model's `alerts` file and the `mlfs_actions_total` counter.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("mlfs.actions")

#: commands running at once, over the whole mount
MAX_RUNNING = 4
#: entities whose last run is remembered (for `action_every_seconds`); the oldest go first
MAX_REMEMBERED = 4096
DEFAULT_TIMEOUT = 30.0
DEFAULT_EVERY = 3600.0


@dataclass
class Running:
    process: subprocess.Popen
    argv: list[str]
    started: float
    deadline: float
    report: Callable[[str, int | None, float], None]


class ActionRunner:
    """Every action command of one mount: started, bounded, reaped, counted."""

    def __init__(self, actions: dict[str, dict] | None = None) -> None:
        #: subsystem -> its checked action settings (from root's configuration only)
        self.actions = dict(actions or {})
        self._running: list[Running] = []
        self._last: dict[tuple[str, str], float] = {}
        #: commands by how they ended: exited, killed, failed, skipped
        self.counts: collections.Counter[str] = collections.Counter()

    def configured(self, subsystem: str) -> bool:
        return subsystem in self.actions

    def start(self, subsystem: str, argument: str,
              report: Callable[[str, int | None, float], None]) -> bool:
        """Run `subsystem`'s command for `argument` unless bounded; `report(status, exit
        code, seconds)` is called when it ends (from `reap`, on the tick loop)."""
        spec = self.actions.get(subsystem)
        if spec is None:
            return False
        self.reap()
        now = time.monotonic()
        last = self._last.get((subsystem, argument))
        if last is not None and now - last < spec.get("action_every_seconds", DEFAULT_EVERY):
            return False  # ran for this entity recently: the alert alone stands
        if len(self._running) >= MAX_RUNNING:
            self.counts["skipped"] += 1
            report("skipped", None, 0.0)
            return False
        argv = [*spec["action"], argument]
        self._last.pop((subsystem, argument), None)  # re-inserted: the dict stays in age order
        self._last[(subsystem, argument)] = now
        if len(self._last) > MAX_REMEMBERED:  # a population of entities: memory stays bounded
            self._last.pop(next(iter(self._last)))
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       close_fds=True, start_new_session=True)
        except OSError as exc:
            self.counts["failed"] += 1
            log.error("%s: action %s did not start: %s", subsystem, argv[0],
                      exc.strerror or exc)
            report("failed", None, 0.0)
            return False
        timeout = spec.get("action_timeout_seconds", DEFAULT_TIMEOUT)
        self._running.append(Running(process, argv, now, now + timeout, report))
        log.warning("%s: action started: %s", subsystem, " ".join(argv))
        return True

    def reap(self) -> None:
        """Record the commands that ended; kill (their process group) those past their time."""
        now = time.monotonic()
        still = []
        for run in self._running:
            code = run.process.poll()
            if code is None and now >= run.deadline:
                try:
                    os.killpg(run.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                code = run.process.wait()
                status = "killed"
            elif code is None:
                still.append(run)
                continue
            else:
                status = "exited"
            self.counts[status] += 1
            seconds = round(now - run.started, 3)
            log.warning("action %s %s (exit %s) after %.1f s", run.argv[0], status, code,
                        seconds)
            run.report(status, code, seconds)
        self._running = still

    def close(self) -> None:
        """Unmount: commands still running are killed (their process groups) and reaped."""
        for run in self._running:
            run.deadline = 0.0
        self.reap()
