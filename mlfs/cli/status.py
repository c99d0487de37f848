"""`mlfs status`: the parser; the view is mlfs.status_view."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import command

EXAMPLES = """examples:
  mlfs status /mnt/mlfs
  mlfs status --watch /mnt/mlfs           # redraw every 2 s until Ctrl-C
  mlfs status --json /mnt/mlfs | python3 -m json.tool"""


def cmd_status(args: argparse.Namespace) -> int:
    from ..status_view import main as status_main

    mountpoint, watch = args.mountpoint, args.watch
    if watch is not None:
        try:
            watch = float(watch)
        except ValueError:  # `mlfs status --watch /mnt/mlfs`: the mountpoint, not SECONDS
            if mountpoint is not None:
                print(f"mlfs status: --watch takes seconds, not {watch!r}", file=sys.stderr)
                return 2
            mountpoint, watch = watch, 2.0
    if mountpoint is None:
        print("usage: mlfs status [--json] [--watch [SECONDS]] MOUNTPOINT", file=sys.stderr)
        return 2
    return status_main(Path(mountpoint), as_json=args.json, watch_seconds=watch)


def add_parser(sub) -> None:
    p = command(sub, "status", "subsystems, models, modes, efficiency", EXAMPLES)
    p.add_argument("mountpoint", nargs="?",  # optional only so `--watch MOUNTPOINT` works
                   help="the mountpoint of a running mlfs mount")
    p.add_argument("--json", action="store_true",
                   help="machine-readable (with --watch: one JSON line per refresh)")
    p.add_argument("--watch", nargs="?", const="2", metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C")
    p.set_defaults(func=cmd_status)
