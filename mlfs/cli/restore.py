"""`mlfs restore`: put back the original knob values a state directory recorded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import command

EXAMPLES = """examples:
  mlfs restore --state-dir /var/lib/mlfs/mnt-mlfs   # the daemon is gone for good"""


def cmd_restore(args: argparse.Namespace) -> int:
    """Put back every original knob value a state directory's ledger recorded."""
    import logging

    from mlfs.backends.linux.ledger import restore_state_dir
    from mlfs.base import statedir

    state_dir = Path(args.state_dir)
    if not state_dir.is_dir():
        print(f"mlfs: {state_dir}: no such state directory", file=sys.stderr)
        return 2
    other = statedir.live_daemon(state_dir, repair=False)
    if other is not None:
        print(f"mlfs: {state_dir}: the mlfs daemon {other} still serves it; "
              f"`mlfs umount` restores its knobs", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR, format="mlfs restore: %(message)s")
    outcomes = restore_state_dir(state_dir)
    if not outcomes:
        print(f"mlfs: {state_dir}: no original knob value recorded; nothing to restore")
        return 0
    for path, outcome, ok in outcomes:
        print(f"{path}: {outcome}", file=sys.stdout if ok else sys.stderr)
    failed = sum(not ok for _, _, ok in outcomes)
    if failed:
        print(f"mlfs: {failed} of {len(outcomes)} could not be restored (see above)",
              file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    p = command(sub, "restore", "put back every original knob value a state directory "
                 "recorded (the daemon gone for good), without mounting", EXAMPLES)
    p.add_argument("--state-dir", required=True,
                   help="the state directory whose ledger of original values is restored")
    p.set_defaults(func=cmd_restore)
