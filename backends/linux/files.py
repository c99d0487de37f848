"""Kernel file I/O for the real Linux backends: one read, one write(2), the parsers.

Every write mlfs makes to a sysctl or sysfs attribute goes through
`write_text`, the single place a kernel setting is changed (the tests record
kernel writes here).  The safety rules built on top are described in
`mlfs.backends.linux`.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class UnavailableError(ValueError):
    """A kernel file a subsystem needs cannot be read (no such device, no PSI...)."""


def read_text(path: str | Path) -> str:
    """The stripped contents of a proc/sys file; raises OSError."""
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read().strip()


#: the most a declared file may hold (a proc or sysfs attribute is a page or a few)
MAX_DECLARED_BYTES = 1 << 20


def stream_problem(path: str | Path) -> str | None:
    """Why reading `path` could block a tick, or None: read to its end with O_NONBLOCK.

    A proc or sysfs attribute answers at once and ends; a stream (/proc/kmsg, a
    device) answers EAGAIN once it has nothing more to say, and a blocking read of
    it would wait for the kernel's next word for good.  Such a file is refused
    when a subsystem is declared, before anything is built.  (What a stream held
    is read, and so taken from it: /proc/kmsg is root's, as declaring files is.)
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot be opened: {os.strerror(exc.errno or 0)}"
    try:
        total = 0
        while total <= MAX_DECLARED_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            total += len(chunk)
        return f"holds over {MAX_DECLARED_BYTES} bytes: not a kernel attribute"
    except BlockingIOError:
        return "would block (a stream such as /proc/kmsg, not an attribute)"
    except OSError as exc:
        return f"cannot be read: {os.strerror(exc.errno or 0)}"
    finally:
        os.close(fd)


def write_text(path: str | Path, value: str) -> None:
    """Write one value with a single write(2), the way `echo v > file` does.

    sysfs and procfs report a refusal from write(2) itself (EINVAL, EBUSY...),
    so a plain os.write surfaces it as OSError with the kernel's errno.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        data = value.encode("ascii") + b"\n"
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.EIO, f"short write to {path}")
    finally:
        os.close(fd)


def parse_bracketed(text: str) -> tuple[str, tuple[str, ...]]:
    """`none [mq-deadline] kyber` -> ("mq-deadline", ("none", "mq-deadline", "kyber"))."""
    current = ""
    choices: list[str] = []
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            word = word[1:-1]
            current = word
        choices.append(word)
    if not current and len(choices) == 1:  # e.g. a device offering only "none"
        current = choices[0]
    return current, tuple(choices)


def read_key_values(path: str | Path) -> dict[str, int]:
    """`key value` (/proc/vmstat) or `Key: value kB` (/proc/meminfo) lines as ints."""
    out: dict[str, int] = {}
    with open(path, encoding="ascii", errors="replace") as fh:
        for line in fh:
            parts = line.replace(":", " ").split()
            if len(parts) >= 2:
                try:
                    out[parts[0]] = int(parts[1])
                except ValueError:
                    continue
    return out


def read_write_calls(proc: str | Path = "/proc") -> dict[int, tuple[int, int]]:
    """{pid: (wchar, syscw)} of every process /proc/<pid>/io lets us read.

    wchar is the bytes a process handed to write(2) and its kin (pwrite,
    writev...), syscw how many such calls it made, both since it started and
    summed over its threads.  A process that is gone, or whose io file we may
    not read (another user's, for an unprivileged caller), is left out.

    Cost: one open and one read(2) per process, parsed as bytes (~9 us each
    here, ~0.6 ms for 64 processes; `read_key_values` took 2.7x that); a
    linux.vm tick reads it twice, so a host with 1,000 processes pays
    ~20 ms of a worker thread per tick.
    """
    out: dict[int, tuple[int, int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"{proc}/{name}/io", os.O_RDONLY)
        except OSError:
            continue
        try:
            data = os.read(fd, 1024)
        except OSError:
            continue
        finally:
            os.close(fd)
        wchar = syscw = None
        for line in data.split(b"\n"):
            key, _, value = line.partition(b":")
            try:
                if key == b"wchar":
                    wchar = int(value)
                elif key == b"syscw":
                    syscw = int(value)
            except ValueError:
                break
        if wchar is not None and syscw is not None:
            out[int(name)] = (wchar, syscw)
    return out


def write_calls_by_process(before: dict[int, tuple[int, int]],
                           after: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """(bytes, calls) of write(2) each process made between two `read_write_calls`.

    A process present in both counts its increase; one that started in
    between (or whose counters went backwards: its pid was reused) counts
    all of its own; one that ended in between is not seen, nor its last writes.
    """
    out = []
    for pid, (wchar, syscw) in after.items():
        old = before.get(pid)
        if old is not None and wchar >= old[0] and syscw >= old[1]:
            wchar, syscw = wchar - old[0], syscw - old[1]
        if syscw:
            out.append((wchar, syscw))
    return out


def bulk_write_kb_per_call(deltas: list[tuple[int, int]]) -> float:
    """KiB per write(2) call of the writers that carry the bytes (0 with no bytes).

    `deltas` is `write_calls_by_process` of one window.  The byte-weighted
    median of each process's own call size: the call size of the process
    holding the window's median byte, so a writer with more
    than half the bytes reads exactly its own size.  The plain mean (all
    bytes over all calls) counts every call alike, so a checkpoint writer's
    1 MiB calls read as 250-990 KiB depending on how many small calls the
    machine's other processes (a daemon's log, a metrics agent) made in the
    same window, which is most when the writer waits in fdatasync
    (bench-results/dirty-win-11).  A byte-weighted mean still moved by tenths
    of a KiB with them, and a tree split on that (bench-results/dirty-win-12).
    """
    sizes = sorted((nbytes / ncalls, nbytes) for nbytes, ncalls in deltas if nbytes)
    half = sum(nbytes for _, nbytes in sizes) / 2
    carried = 0
    for size, nbytes in sizes:
        carried += nbytes
        if carried >= half:
            return size / 1024
    return 0.0


_PSI_KEYS = ("avg10", "avg60", "avg300", "total")


def read_psi(resource: str) -> dict[str, float]:
    """/proc/pressure/<resource> as {some_avg10, some_total, full_avg10, full_total, ...}.

    Missing file (kernel without PSI) or line (cpu `full` before 5.13) -> zeros.
    """
    try:
        return read_psi_file(f"/proc/pressure/{resource}")
    except OSError:
        return {f"{kind}_{key}": 0.0 for kind in ("some", "full") for key in _PSI_KEYS}


def read_psi_file(path: str | Path) -> dict[str, float]:
    """A PSI file (/proc/pressure/<r>, a cgroup v2 <r>.pressure) as {some_avg10, ...}.

    A missing line reads zeros; an unreadable file raises OSError.
    """
    out = {f"{kind}_{key}": 0.0 for kind in ("some", "full") for key in _PSI_KEYS}
    for line in read_text(path).splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        for item in parts[1:]:
            key, _, value = item.partition("=")
            if key in _PSI_KEYS:
                try:
                    out[f"{parts[0]}_{key}"] = float(value)
                except ValueError:
                    pass
    return out


def boot_id() -> str:
    try:
        return read_text(_BOOT_ID)
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """The start time (clock ticks since boot) of `pid`, or None if it is gone."""
    try:
        stat = read_text(f"/proc/{pid}/stat")
    except OSError:
        return None
    fields = stat.rsplit(") ", 1)[-1].split()
    if not fields or fields[0] == "Z":
        return None
    return fields[19] if len(fields) > 19 else None

