"""`mlfs mount`: check the configuration and the mountpoint, fork the daemon, wait
until the mount answers.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

from .common import command, default_state_dir

EXAMPLES = """examples:
  mlfs mount /mnt/mlfs                            # the embedded default configuration
  mlfs mount /mnt/mlfs --config /etc/mlfs/mlfs.toml
  mlfs mount /mnt/mlfs --foreground --state-dir /var/lib/mlfs/mnt-mlfs   # under systemd"""


#: the mount's bdi read-ahead: the kernel asks the daemon for up to this much per request
READ_AHEAD_KB = 1024


def raise_read_ahead(mountpoint: Path, kb: int = READ_AHEAD_KB) -> int | None:
    """Raise the mount's bdi `read_ahead_kb` so a sequential read costs fewer requests.

    A FUSE mount starts at 128 KiB: a cold portion read is then one round trip
    through the single-threaded daemon per 128 KiB.  At 1024 KiB the kernel
    sends 1 MiB requests (the libfuse maximum), which roughly doubled a first
    read (docs/fuse-notes.md; `mlfs bench`).  Called by the *parent* `mlfs mount` once
    the daemon answers: the daemon must never do this itself (touching its own
    mount deadlocks).  Best effort: without root the write fails and the
    kernel default stays.  Returns the value in effect, None when unknown.
    """
    try:
        dev = os.stat(mountpoint).st_dev
        path = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        current = int(path.read_text())
        if current < kb:
            path.write_text(f"{kb}\n")
            current = int(path.read_text())
        return current
    except (OSError, ValueError):
        return None


def cmd_mount(args: argparse.Namespace) -> int:
    from mlfs.base import statedir

    from ..config import check_host, load_config

    mountpoint = Path(args.mountpoint)
    try:
        config = load_config(args.config)
        check_host(config)
    except ValueError as exc:  # ConfigError: one line naming the file and the key
        print(f"mlfs: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(mountpoint)
    problem = _mountpoint_problem(mountpoint)
    if problem:
        print(f"mlfs: {mountpoint}: {problem}", file=sys.stderr)
        return 2
    try:
        statedir.check(state_dir)
    except statedir.FormatError as exc:
        print(f"mlfs: {exc}", file=sys.stderr)
        return 2
    if not args.foreground:
        other = statedir.live_daemon(state_dir, repair=False)
        if other is not None:
            print(f"mlfs: {state_dir}: in use by the mlfs daemon {other} (see its mlfs.pid)",
                  file=sys.stderr)
            return 2
    if args.foreground:
        from .. import daemon

        state_dir.mkdir(parents=True, exist_ok=True)
        daemon.setup_logging(state_dir, foreground=args.ready_fd is None)
        return daemon.serve(mountpoint, config, state_dir, ready_fd=args.ready_fd)
    state_dir.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "mlfs", "mount", str(mountpoint), "--foreground",
               "--state-dir", str(state_dir), "--ready-fd", str(write_end)]
    if args.config:
        command += ["--config", str(args.config)]
    with open(state_dir / "mlfs.log", "ab") as log_file:
        child = subprocess.Popen(command, pass_fds=(write_end,), stdin=subprocess.DEVNULL,
                                 stdout=log_file, stderr=log_file, start_new_session=True)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        answer = ready.read(3)
    if answer == b"ok\n":
        raise_read_ahead(mountpoint)
        print(f"mlfs: {mountpoint} mounted (pid {child.pid}, state {state_dir})")
        return 0
    child.wait(timeout=10)
    print(f"mlfs: mount failed (exit {child.returncode}); see {state_dir / 'mlfs.log'}:",
          file=sys.stderr)
    tail = (state_dir / "mlfs.log").read_text(errors="replace").splitlines()[-15:]
    print("\n".join(tail), file=sys.stderr)
    return 1


def _mountpoint_problem(mountpoint: Path) -> str | None:
    """Why `mountpoint` cannot be mounted on, or None (a stale mount is fine).

    A mountpoint left by a daemon that was killed before its auto_unmount
    helper could clean up answers ENOTCONN to everything; the daemon clears
    it (`clean_stale_mount`) before mounting, so it is not a problem here.
    """
    try:
        st = os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            return None
        return os.strerror(exc.errno or errno.EIO)
    return None if stat.S_ISDIR(st.st_mode) else "not a directory"


def add_parser(sub) -> None:
    p = command(sub, "mount", "mount and serve (returns when the mount answers)", EXAMPLES)
    p.add_argument("mountpoint", help="an existing directory to mount on")
    p.add_argument("--config", metavar="FILE",
                   help="the TOML configuration (default: the embedded one, "
                        "see `mlfs config default`)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where portions, journals, the knob ledger and mlfs.log live "
                        "(default: one per mountpoint under /var/lib/mlfs, or "
                        "$XDG_STATE_HOME/mlfs when not root)")
    p.add_argument("--foreground", action="store_true",
                   help="serve in this process and log to stderr (systemd, containers) "
                        "instead of forking a daemon")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_mount)
