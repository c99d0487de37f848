"""The one way to talk to an mlfs mount from outside it, and to run one.

Everything that is not the daemon -- the trainer worker, `mlfs status`,
`mlfs demo`, `mlfs bench`, the tests -- reads and writes the mount the way a
user's shell does, through these functions, so the rules of the exchange are
kept in one place:

- an attribute is read whole and stripped (`read_attr`); a value is written
  with one open, one write(2), one close (`write_line`), because the mount
  checks each write as one command (sysfs style) and refuses a bad one with
  an errno on that write, the reason being the last line of `errors`;
- an `events` stream is read without blocking, woken by poll(2), and cut
  into whole JSON lines (`EventStream`);
- portions are listed by name (`list_portions`) and read whole in one go
  (`read_portion`);
- `collect_status` is what `mlfs status` shows before its decorations.

`MountProcess` starts `mlfs mount` as a subprocess (as a user or systemd
would), knows the daemon's pid and ends it by that pid only -- never by name,
and never a process that merely inherited the number (see `alive`).

This module imports neither pyfuse3 nor the daemon: a trainer on another
checkout or machine needs only this and the shared rules (`mlfs.abi`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: errors that mean "the mount (or this path in it) is not there right now":
#: the daemon restarts (ENOTCONN), the mount point is a plain directory for a
#: while (ENOENT), a model proxy was removed under the caller
GONE = frozenset({errno.ENOTCONN, errno.ENOENT, errno.ENODEV, errno.ESHUTDOWN,
                  errno.ECONNABORTED, errno.ENOTDIR})

#: the whole-line buffer of an event stream is dropped beyond this (a line
#: never gets near it; only a stream that is not JSON lines would)
MAX_EVENT_BUFFER = 1 << 20


class NotMounted(OSError):
    """The path is not (or no longer) an mlfs mount: it has no `version` file."""

    def __init__(self, mountpoint: Path | str) -> None:
        super().__init__(f"{mountpoint}: not an mlfs mount (no version file); "
                         f"`mlfs mount {mountpoint}` mounts it")
        self.strerror = "not an mlfs mount (no version file); is it mounted?"


def gone(exc: OSError) -> bool:
    """True when `exc` says the mount or the path is not there (see GONE)."""
    return exc.errno in GONE


# ---- attributes ---------------------------------------------------------------------------
def read_attr(path: Path | str) -> str:
    """An attribute's value, stripped; OSError (errno kept) when it cannot be read.

    Attributes are ASCII; `errors` quotes what a user wrote, so anything else
    is decoded with replacement characters rather than raising.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().strip()


def read_attr_or(path: Path | str, default: str) -> str:
    """`read_attr`, or `default` when the file cannot be read (a display's placeholder)."""
    try:
        return read_attr(path)
    except OSError:
        return default


def write_line(path: Path | str, data: str | bytes, *, create: bool = False) -> None:
    """One open, one write(2), one close, as `echo data > path` does.

    Raises the write's (or open's) OSError with its errno: the mount refuses a
    bad value there (EINVAL, EBUSY, ...), with the reason in `errors`.
    `create`: open with O_CREAT|O_TRUNC, as the shell's `>` does (for a
    reference file outside the mount); the mount's attributes exist already.
    """
    if isinstance(data, str):
        data = data.encode("ascii")
    flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_errno(path: Path | str, data: str | bytes) -> int:
    """`write_line`, answering 0 or the errno of the refusal instead of raising."""
    try:
        write_line(path, data)
        return 0
    except OSError as exc:
        return exc.errno or errno.EIO


def last_error(directory: Path | str) -> str:
    """The last line of `directory/errors` (the reason of the last refusal), or "?"."""
    lines = read_attr_or(Path(directory) / "errors", "").splitlines()
    return lines[-1] if lines else "?"


# ---- events -------------------------------------------------------------------------------
class EventStream:
    """An open `events` file, cut into whole JSON lines.

    Non-blocking by default: `read(timeout)` sleeps in poll(2) up to `timeout`
    seconds, then reads what is there.  `blocking=True` opens the file
    without O_NONBLOCK (each `read` waits in read(2) for the next chunk), the
    other way a reader may use the stream.  End of file (the mount went away)
    sets `ended`; lines that are not a JSON object are counted in `bad_lines`
    and skipped; `spurious` counts wake-ups by poll with nothing to read (a
    mount without poll support would make a caller spin; it can back off).
    """

    def __init__(self, path: Path | str, *, blocking: bool = False) -> None:
        self.path = Path(path)
        self.blocking = blocking
        self.fd = os.open(path, os.O_RDONLY | (0 if blocking else os.O_NONBLOCK))
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        self._buffer = b""
        self._unread: collections.deque[dict] = collections.deque()
        self.ended = False
        self.spurious = 0
        self.bad_lines = 0
        #: the last events returned, for a caller's diagnostics
        self.recent: collections.deque[dict] = collections.deque(maxlen=16)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def read(self, timeout: float = 0.0) -> list[dict]:
        """The whole events that arrived: waits up to `timeout` s in poll() (0: none)."""
        if self.blocking:
            return self._parse([os.read(self.fd, 1 << 16)])
        if timeout > 0 and not self._poll.poll(max(0, int(timeout * 1000))):
            return []
        chunks = []
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            chunks.append(chunk)
            if not chunk:
                break
        if timeout > 0 and not chunks:
            self.spurious += 1
        return self._parse(chunks)

    def _parse(self, chunks: list[bytes]) -> list[dict]:
        if chunks and not chunks[-1]:
            self.ended = True
        data = b"".join(chunks)
        if not data:
            return []
        self.spurious = 0
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_EVENT_BUFFER:
            self._buffer = b""
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict):
                events.append(event)
            else:
                self.bad_lines += 1
        self.recent.extend(events)
        return events

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float = 10.0) -> dict | None:
        """The next event for which `predicate(event)` holds (earlier ones are skipped);
        None when none came within `timeout` s or the stream ended."""
        deadline = time.monotonic() + timeout
        while True:
            while self._unread:
                event = self._unread.popleft()
                if predicate(event):
                    return event
            left = deadline - time.monotonic()
            if left <= 0 or self.ended:
                return None
            self._unread.extend(self.read(min(0.2, left)))


# ---- portions -----------------------------------------------------------------------------
def list_portions(directory: Path | str) -> list[str]:
    """The sealed portion names in `directory`, oldest first.

    A directory that does not exist yet while its parent does (no portion
    sealed so far) lists as empty; anything else raises OSError.
    """
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except OSError as exc:
        if exc.errno == errno.ENOENT and directory.parent.is_dir():
            return []
        raise
    return sorted(n for n in names if n.endswith(".parquet") and not n.startswith("."))


def read_portion(path: Path | str, columns: list[str] | None = None):
    """One portion as a pyarrow Table, read whole in one go.

    On the mount, `pq.read_table(path)` of a small cold portion costs several
    FUSE round trips (footer, then column chunks: ~80 ms for 8 KB measured);
    reading the bytes sequentially and parsing them in memory costs ~1 ms.
    OSError when the file is gone; pyarrow.ArrowException (a ValueError) when
    it is not Parquet.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    # one thread: a short-lived client must not exit while arrow pool threads start
    # (seen once under load: "terminate called without an active exception")
    return pq.read_table(pa.BufferReader(Path(path).read_bytes()), columns=columns,
                         use_threads=False)


def tail_rows(directory: Path | str, columns: list[str], rows: int,
              max_portions: int = 64) -> tuple[list[dict], bool]:
    """(the newest `rows` rows of a portion directory, oldest first; whether older exist).

    Portions are read newest first until enough rows are in, at most
    `max_portions` of them; one that vanishes meanwhile (retention,
    `discard_dataset`) is skipped.
    """
    import pyarrow as pa

    directory = Path(directory)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
    except OSError:
        return [], False
    chunks: list[list[dict]] = []
    count = read = 0
    for name in reversed(names[-max_portions:]):
        read += 1
        try:
            table = read_portion(directory / name, columns)
        except (OSError, pa.ArrowException):
            continue
        chunks.append(table.to_pylist())
        count += table.num_rows
        if count >= rows:
            break
    out = [row for chunk in reversed(chunks) for row in chunk]
    return out[-rows:], count > rows or read < len(names)


# ---- status -------------------------------------------------------------------------------
#: the attributes of a model that status shows
MODEL_ATTRIBUTES = ("state", "mode", "mode_switching", "efficiency",
                    "efficiency_vs_incumbent", "knobs")


def collect_status(mountpoint: Path | str) -> dict[str, Any]:
    """Version, and per subsystem its backend, objective, knobs, portions and models.

    Unreadable attributes show as "?".  NotMounted when `mountpoint` has no
    `version` file (checked after listing it, so a missing directory raises
    its own OSError first).
    """
    mountpoint = Path(mountpoint)
    out: dict[str, Any] = {"mountpoint": str(mountpoint),
                           "version": read_attr_or(mountpoint / "version", "?"),
                           "subsystems": {}}
    for sub in sorted(p for p in mountpoint.iterdir() if (p / "info").exists()):
        info = json.loads(read_attr_or(sub / "info", "{}"))
        entry = {"backend": info.get("backend"),
                 # config (the configuration file) or load (MOUNT/control, mkdir)
                 "source": info.get("source", "config"),
                 "objective": read_attr_or(sub / "objective", "?"),
                 "knobs": {k: read_attr_or(sub / "knobs" / k, "?") for k in info.get("knobs", {})},
                 "portions": len(list((sub / "dataset").glob("*.parquet"))), "models": {}}
        for model in sorted((sub / "models").iterdir()):
            entry["models"][model.name] = {name: read_attr_or(model / name, "?")
                                           for name in MODEL_ATTRIBUTES}
        out["subsystems"][sub.name] = entry
    if out["version"] == "?":
        raise NotMounted(mountpoint)
    return out


# ---- running a mount ----------------------------------------------------------------------
def end_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """End a child we started, by its pid: SIGTERM, then SIGKILL after `timeout`.

    A Popen's pid cannot be reused while the child is unreaped, so signalling
    it before `wait` never reaches another process."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


class MountFailed(RuntimeError):
    """`mlfs mount` exited non-zero; `output` is what it printed (stdout, then stderr)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message + output)
        self.output = output


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3 = index 0), None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(") ", 1)[1].split()


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot: /proc/PID/stat field 22), None if gone.

    A pid and its start time together name one process for the whole uptime:
    a pid the kernel reuses belongs to a process that started later.
    """
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


class MountProcess:
    """One daemon started with `mlfs mount` (as a user would), ended by its pid.

    `start()` returns once `mlfs mount` has returned, i.e. once the mount
    answers (the parent waits for the daemon's ready signal).  The daemon's
    pid comes from STATE_DIR/mlfs.pid, with its start time, so `alive()` and
    `stop()` never mistake (or signal) a later process that got the same pid.
    """

    def __init__(self, mountpoint: Path | str, state_dir: Path | str,
                 config_path: Path | str | None = None, *, cwd: Path | str | None = None,
                 timeout: float | None = 180.0) -> None:
        self.mountpoint = Path(mountpoint)
        self.state_dir = Path(state_dir)
        self.config_path = Path(config_path) if config_path is not None else None
        self.cwd = cwd
        self.timeout = timeout
        self.pid: int | None = None
        self.started: int | None = None  # the pid's start time (see start_time)
        self.start_seconds = float("nan")

    def command(self, *args: str) -> list[str]:
        """`python -m mlfs ARGS` with this interpreter (the checkout's code in `cwd`)."""
        return [sys.executable, "-m", "mlfs", *args]

    def start(self) -> MountProcess:
        """Run `mlfs mount`; MountFailed with its output when it exits non-zero."""
        args = ["mount", str(self.mountpoint)]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        args += ["--state-dir", str(self.state_dir)]
        began = time.monotonic()
        done = subprocess.run(self.command(*args), capture_output=True, text=True,
                              timeout=self.timeout, cwd=self.cwd)
        if done.returncode != 0:
            self._adopt()  # a daemon that half-started is still ended by stop()
            raise MountFailed(f"mlfs mount failed (exit {done.returncode}): ",
                              done.stdout + done.stderr)
        self.start_seconds = time.monotonic() - began
        self._adopt()
        if self.pid is None:
            raise MountFailed(f"mlfs mount returned 0 but {self.state_dir / 'mlfs.pid'} "
                              "names no running daemon")
        return self

    def _adopt(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.adopt(int((self.state_dir / "mlfs.pid").read_text().split()[0]))

    def adopt(self, pid: int) -> bool:
        """Take `pid` (a daemon started some other way: mount(8), systemd) as this
        mount's, with its start time, so `alive`, `send` and `stop` keep the reuse
        guard; False (nothing changed) when no such process runs."""
        started = start_time(pid)
        if started is None:
            return False
        self.pid, self.started = pid, started
        return True

    def ready(self) -> bool:
        """The mount answers: its `version` file can be read."""
        try:
            read_attr(self.mountpoint / "version")
            return True
        except OSError:
            return False

    def alive(self) -> bool:
        """The daemon still runs: its pid exists with the same start time, not a zombie."""
        if self.pid is None:
            return False
        fields = _proc_stat(self.pid)
        if fields is None or int(fields[19]) != self.started:
            return False  # gone, or the pid now names a later process
        return not fields[0].startswith(("Z", "X"))

    def send(self, sig: int) -> bool:
        """Send `sig` to the daemon if it is still ours; True when sent."""
        if not self.alive():
            return False
        assert self.pid is not None
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        """End the daemon by its pid (SIGTERM seals and unmounts), SIGKILL after
        `timeout`, then make sure nothing stays mounted on the mountpoint."""
        if self.pid is not None:
            self.send(sig)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.send(signal.SIGKILL):
                while self.alive():
                    time.sleep(0.02)
            self.pid = None
        self.clear_mount()

    def umount(self, timeout: float | None = 90.0) -> subprocess.CompletedProcess:
        """`mlfs umount MOUNTPOINT` as a user runs it, then `stop()` whatever is left."""
        done = subprocess.run(self.command("umount", str(self.mountpoint)),
                              capture_output=True, text=True, timeout=timeout, cwd=self.cwd)
        self.stop(signal.SIGTERM)
        return done

    def clear_mount(self, attempts: int = 100) -> None:
        """Lazily unmount what a killed daemon left (a stale mount answers ENOTCONN)."""
        for _ in range(attempts):
            if not os.path.ismount(self.mountpoint) and _stat_ok(self.mountpoint):
                return
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)],
                           capture_output=True)
            time.sleep(0.05)


def _stat_ok(path: Path) -> bool:
    try:
        os.stat(path)
        return True
    except OSError:
        return False
