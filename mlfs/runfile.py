"""The daemon's pid file under /run/mlfs, named after its mountpoint.

`mlfs umount DIR` must find the daemon serving DIR without touching any other
mount: resolving another mount's path (`realpath`, `stat`) blocks for as long
as that mount's daemon does not answer, so one wedged mount could hang every
unrelated `mlfs umount`.  The pid file is found from DIR's path alone, and its
name is the path escaped as `systemd-escape --path` escapes it (the unit's
instance name): /mnt/mlfs -> /run/mlfs/mnt-mlfs.pid.

A pid file can outlive its daemon (SIGKILL, a crash) and its pid be reused,
so the file also records the mountpoint as the daemon was given it, and a pid
counts only while /proc/PID/cmdline still names that mountpoint.

Root uses /run/mlfs (tmpfs: nothing survives a reboot); other users
$XDG_RUNTIME_DIR/mlfs.  MLFS_RUN_DIR overrides both (tests, unusual layouts).
"""

from __future__ import annotations

import os
from pathlib import Path

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def run_dir() -> Path:
    if os.environ.get("MLFS_RUN_DIR"):
        return Path(os.environ["MLFS_RUN_DIR"])
    if os.geteuid() == 0:
        return Path("/run/mlfs")
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/mlfs-{os.getuid()}"
    return Path(runtime) / "mlfs"


def escape_path(path: str) -> str:
    """`systemd-escape --path PATH` (systemd.unit(5), "String Escaping"), without a stat."""
    parts = [p for p in os.path.normpath("/" + path).split("/") if p]
    if not parts:
        return "-"
    out = []
    for index, byte in enumerate("/".join(parts).encode()):
        if byte == ord("/"):
            out.append("-")
        elif byte in _SAFE and not (index == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def pid_path(mountpoint: str | Path) -> Path:
    return run_dir() / f"{escape_path(os.path.abspath(mountpoint))}.pid"


def write(mountpoint: str | Path, given: str, state_dir: str | Path | None = None) -> Path:
    """Record this process as the daemon of `mountpoint` (atomically); returns the file.

    `given` is the mountpoint as it appears in this process's command line;
    `state_dir` the daemon's state directory (recorded absolute).
    """
    path = pid_path(mountpoint)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    state = f"{os.path.abspath(state_dir)}\n" if state_dir is not None else ""
    tmp.write_text(f"{os.getpid()}\n{given}\n{state}")
    os.replace(tmp, path)
    return path


def remove(path: Path) -> None:
    """Remove `path` if it is still this process's pid file."""
    try:
        if path.read_text().split("\n", 1)[0] == str(os.getpid()):
            path.unlink()
    except OSError:
        pass


def names_mountpoint(pid: int, given: str) -> bool:
    """True while `pid` is an mlfs process whose command line names `given`."""
    try:
        args = [a.decode(errors="replace")
                for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return False
    return given in args and any("mlfs" in a for a in args[:4])


def read(mountpoint: str | Path) -> int | None:
    """The pid of the live daemon serving `mountpoint`, from its pid file; None if none."""
    try:
        pid_text, given = pid_path(mountpoint).read_text().split("\n")[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and names_mountpoint(pid, given) else None


def state_dir(mountpoint: str | Path) -> Path | None:
    """The state directory of the live daemon serving `mountpoint`, from its pid file;
    None if no live daemon serves it or its pid file does not record one."""
    try:
        lines = pid_path(mountpoint).read_text().split("\n")
        pid, given = int(lines[0]), lines[1]
    except (OSError, ValueError, IndexError):
        return None
    if len(lines) < 3 or not lines[2] or pid <= 0 or not names_mountpoint(pid, given):
        return None
    return Path(lines[2])


def mounted_fstype(mountpoint: str | Path) -> str | None:
    """The type of the filesystem mounted right on `mountpoint`, from /proc/self/mountinfo.

    Compared as strings (the absolute path, not resolved): no other mount is touched.
    """
    target = os.path.abspath(mountpoint)
    fstype = None
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            for line in fh:
                fields, _, rest = line.partition(b" - ")
                parts = fields.split()
                if len(parts) > 4 and _unoctal(parts[4]) == target:
                    fstype = (rest.split() or [b""])[0].decode(errors="replace")
    except OSError:
        return None
    return fstype


def _unoctal(field: bytes) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    out, i = bytearray(), 0
    while i < len(field):
        if field[i] == 0x5C and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return out.decode(errors="surrogateescape")
