"""`mlfs emergency|auto MOUNT`: the kill switch as a verb, like `tuned-adm off`.

Each writes one word into MOUNT/control, as `echo emergency > MOUNT/control`
does, so the mount enforces the rights (docs/ABI.md, "Rights"): root or the
mount's group may pull the switch; only root may release a pin root pulled.
A refusal is the write's errno on one line, exit 1; a path that is not an
mlfs mount is one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import command

EMERGENCY_EXAMPLES = """examples:
  mlfs emergency /mnt/mlfs                # every model to emergency: the default decides
  mlfs auto /mnt/mlfs                     # release: each model back to its own mode"""

AUTO_EXAMPLES = """examples:
  mlfs auto /mnt/mlfs                     # release the pin `mlfs emergency` pulled
  mlfs status /mnt/mlfs                   # `emergency pin` is gone from its head"""


def cmd_switch(args: argparse.Namespace) -> int:
    from ..client import write_line

    verb, mountpoint = args.command, Path(args.mountpoint)
    if not (mountpoint / "version").is_file():
        print(f"mlfs {verb}: {mountpoint}: not an mlfs mount (no version file)", file=sys.stderr)
        return 2
    try:
        write_line(mountpoint / "control", verb)
    except OSError as exc:
        print(f"mlfs {verb}: {mountpoint / 'control'}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    p = command(sub, "emergency", "pin every model to emergency until `mlfs auto`",
                EMERGENCY_EXAMPLES)
    p.add_argument("mountpoint", help="the mountpoint of a running mlfs mount")
    p.set_defaults(func=cmd_switch)
    p = command(sub, "auto", "release the emergency pin of `mlfs emergency`", AUTO_EXAMPLES)
    p.add_argument("mountpoint", help="the mountpoint of a running mlfs mount")
    p.set_defaults(func=cmd_switch)
