"""Containment of one action command: its cgroup, else its process group and session.

Why a module of its own: what "every process of a command" means, how it is found without
waiting (a read of `cgroup.procs`, else a walk of /proc) and how it is killed whole is a
question of the kernel's process model, apart from the runner's bookkeeping (rates,
intervals, deadlines) in `actions.py`.  A command runs in a fresh cgroup where the daemon
may make one (`Cgroups`), capped at MAX_PROCESSES processes; without cgroups it is contained
by process group and session only, which a `setsid`'ed grandchild escapes.  Nothing here
waits for a process.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("mlfs.actions")

#: processes one command may have at once (its cgroup's pids.max, where there is one)
MAX_PROCESSES = 16

#: the first exec in a cgroup: wait until the daemon moved this process into the command's
#: cgroup (one line on its stdin, a pipe), then become the command with no input.  Without
#: the gate, a command that forks at once could leave a child outside the cgroup.  The
#: command's argv is passed as positional parameters, never parsed by the shell.
_GATE = 'read -r go && [ "$go" = go ] || exit 126; exec </dev/null; exec "$@"'


def _proc_ids(pid: int) -> tuple[int, int] | None:
    """(process group, session) of `pid` from /proc, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    if fields[0] == b"Z":  # a zombie is nothing to kill or count
        return None
    return int(fields[2]), int(fields[3])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _session_members(leader: int) -> list[int]:
    """Processes in `leader`'s process group or session (the fallback without cgroups)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            ids = _proc_ids(int(name))
            if ids is not None and leader in ids:
                out.append(int(name))
    return out


class Cgroups:
    """Where the daemon may make a cgroup per command (cgroup v1 `pids` or cgroup v2).

    `base` is a directory of the daemon's own (`mlfs-actions.<pid>`) under the daemon's
    cgroup, or None when cgroups are not writable here (a container, no root): commands
    are then contained by process group and session only.
    """

    def __init__(self, base: Path | None) -> None:
        self.base = base
        self._made = 0

    @classmethod
    def find(cls) -> Cgroups:
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return cls(None)
        where = None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "pids" in controllers.split(","):
                where = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
                break
        if where is None and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            for line in lines:
                if line.startswith("0::"):
                    where = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
        if where is None:
            return cls(None)
        base = where / f"mlfs-actions.{os.getpid()}"
        cls._clear_stale(where)
        try:
            base.mkdir(exist_ok=True)
        except OSError as exc:
            log.warning("actions: no cgroup (%s: %s); commands are contained by process "
                        "group and session only (a setsid'ed grandchild escapes)",
                        base, exc.strerror or exc)
            return cls(None)
        return cls(base)

    @staticmethod
    def _clear_stale(where: Path) -> None:
        """The cgroups of daemons that died without unmounting (SIGKILL, a crash): their
        commands are killed now, as an unmount would have, and the directories removed.
        A directory whose daemon's pid is alive is left alone (another mount's)."""
        try:
            stale = [p for p in where.glob("mlfs-actions.*")
                     if p.suffix[1:].isdigit() and not _pid_alive(int(p.suffix[1:]))]
        except OSError:
            return
        for base in stale:
            runs = [p for p in base.iterdir() if p.is_dir()] if base.is_dir() else []
            for run in runs:
                group = Group(0, run)
                if group.members():
                    log.warning("actions: killing %s left by a daemon that is gone", run)
                    group.kill()
                group.remove()
            try:
                base.rmdir()
            except OSError:
                pass  # a process in D state: removed by a later mount

    def make(self) -> Path | None:
        if self.base is None:
            return None
        self._made += 1
        path = self.base / f"run-{self._made}"
        try:
            path.mkdir()
            try:
                (path / "pids.max").write_text(f"{MAX_PROCESSES}\n")
            except OSError:
                pass  # cgroup v2 without the pids controller: counted, not capped
        except OSError as exc:
            log.warning("actions: cgroup %s not made (%s): process group only", path,
                        exc.strerror or exc)
            return None
        return path

    def close(self) -> None:
        if self.base is not None:
            try:
                self.base.rmdir()
            except OSError as exc:  # an abandoned command still in it
                log.warning("actions: %s stays (%s)", self.base, exc.strerror or exc)


@dataclass
class Group:
    """Every process of one command: its cgroup, else its process group and session."""

    leader: int
    cgroup: Path | None = None

    def members(self) -> list[int]:
        """Its live processes (the leader included while it runs); never blocks."""
        if self.cgroup is not None:
            try:
                text = (self.cgroup / "cgroup.procs").read_text()
                return [int(pid) for pid in text.split()]
            except OSError:
                return []
        return _session_members(self.leader)

    def kill(self, leader_reaped: bool = False) -> None:
        """SIGKILL every process of it; returns at once (a process in D dies later).

        Once the leader was reaped (`leader_reaped`) its pid may name another process:
        only the listed members and the process group (a pid is not reused while a
        process group of that number has members) are signalled.
        """
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.kill").write_text("1\n")  # cgroup v2, 5.14+
            except OSError:
                pass
        leader = [self.leader] if self.leader and not leader_reaped else []
        for pid in [*leader, *self.members()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.leader and (not leader_reaped or self.cgroup is None):
            try:
                os.killpg(self.leader, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def remove(self) -> None:
        if self.cgroup is not None:
            try:
                self.cgroup.rmdir()
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("actions: %s stays (%s)", self.cgroup, exc.strerror or exc)


def spawn(argv: list[str], cgroups: Cgroups) -> tuple[subprocess.Popen, Group]:
    """Start `argv` in its own session, inside a fresh cgroup when there is one."""
    cgroup = cgroups.make()
    if cgroup is None:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   close_fds=True, start_new_session=True)
        return process, Group(process.pid)
    if not os.access(argv[0], os.X_OK):  # said now, as a direct exec would say it
        Group(0, cgroup).remove()
        raise FileNotFoundError(errno.ENOENT, "not an executable file", argv[0])
    gate_r, gate_w = os.pipe()
    try:
        process = subprocess.Popen(["/bin/sh", "-c", _GATE, "mlfs-action", *argv],
                                   stdin=gate_r, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, close_fds=True,
                                   start_new_session=True)
    except OSError:
        os.close(gate_w)
        Group(0, cgroup).remove()
        raise
    finally:
        os.close(gate_r)
    try:
        (cgroup / "cgroup.procs").write_text(f"{process.pid}\n")
    except OSError as exc:
        log.warning("actions: %d not moved into %s (%s): process group only",
                    process.pid, cgroup, exc.strerror or exc)
        Group(0, cgroup).remove()
        cgroup = None
    try:
        os.write(gate_w, b"go\n")
    except OSError:
        pass  # it died already: reaped as any other
    finally:
        os.close(gate_w)
    return process, Group(process.pid, cgroup)
