"""`mlfs umount`: find the daemon serving a mountpoint by its pid file and stop it."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .common import command

EXAMPLES = """examples:
  mlfs umount /mnt/mlfs
  mlfs umount /mnt/mlfs --timeout 10      # then lazily unmount if the daemon is stuck"""


def find_daemon(mountpoint: Path) -> int | None:
    """The pid of the mlfs daemon serving `mountpoint`, from its pid file under /run/mlfs.

    Never scans other daemons or resolves other mounts' paths (a wedged mount
    would block that): only the path given is looked at, then its resolved
    form (which touches this mountpoint alone) in case it was given via a
    symlink.  See mlfs.runfile.
    """
    from .. import runfile

    pid = runfile.read(mountpoint)
    if pid is None:
        real = os.path.realpath(mountpoint)
        if real != os.path.abspath(mountpoint):
            pid = runfile.read(real)
    return pid


def cmd_umount(args: argparse.Namespace) -> int:
    from ..runfile import mounted_fstype

    mountpoint = Path(args.mountpoint)
    pid = find_daemon(mountpoint)
    if pid is None and mounted_fstype(mountpoint) == "fuse.mlfs":
        # mounted, but no pid file names its daemon (removed, or written elsewhere):
        # an external unmount is a clean stop too; the daemon seals and exits itself
        done = subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        if done.returncode == 0:
            print(f"mlfs: {mountpoint}: no pid file for its daemon; unmounted it, the daemon "
                  "seals and exits by itself", file=sys.stderr)
            return 0
        return 1
    if pid is None:
        try:
            os.stat(mountpoint)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
                return 0
        print(f"mlfs: no mlfs daemon serves {mountpoint}", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return 0
        time.sleep(0.05)
    print(f"mlfs: daemon {pid} did not stop in {args.timeout:g} s; unmounting lazily",
          file=sys.stderr)
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
    return 1


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def add_parser(sub) -> None:
    p = command(sub, "umount", "seal open rows, restore knobs, unmount", EXAMPLES)
    p.add_argument("mountpoint", help="the mountpoint of a running mlfs mount")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the daemon to seal and stop before "
                        "unmounting lazily and exiting 1 (default 60)")
    p.set_defaults(func=cmd_umount)
