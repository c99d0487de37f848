"""`mlfs report`: the parser; the report is mlfs.report (imported when run: pyarrow)."""

from __future__ import annotations

import argparse

from .common import command

EXAMPLES = """examples:
  mlfs report /mnt/mlfs sim.readahead     # a mounted exchange
  mlfs report /mnt/mlfs sim.readahead --model lgbm --png
  mlfs report /var/lib/mlfs/mnt-mlfs sim.readahead   # after umount, from the state
  mlfs report /tmp/mlfs-demo-run sim.readahead       # what `mlfs demo --keep` kept"""


def cmd_report(args: argparse.Namespace) -> int:
    from ..report import main as report_main  # imported when asked (it loads pyarrow)

    return report_main(args)


def add_parser(sub) -> None:
    p = command(sub, "report", "an HTML report (inline SVG) of a subsystem's run", EXAMPLES)
    p.add_argument("mountpoint", metavar="MOUNTPOINT|STATE_DIR",
                   help="a mounted exchange (its pending rows are sealed first, as "
                        "prepare_dataset does), or a mount's state directory (also after "
                        "umount: its sealed portions are reported)")
    p.add_argument("subsystem", help="the subsystem's name (a directory of the mount)")
    p.add_argument("--model", help="the model whose modes and efficiency to show "
                   "(default: the one that controlled most ticks)")
    p.add_argument("--out", metavar="FILE",
                   help="the HTML file (default: mlfs-report-SUBSYSTEM-MODEL.html)")
    p.add_argument("--all", action="store_true",
                   help="every dataset row (default: from 500 rows before the model's first)")
    p.add_argument("--last", type=int, default=0, metavar="ROWS",
                   help="only the newest ROWS of those rows")
    p.add_argument("--max-points", type=int, default=5000, metavar="N",
                   help="plot at most this many objective points (every k-th row beyond)")
    p.add_argument("--png", action="store_true",
                   help="also write FILE.png with matplotlib (pip install 'mlfs[plots]'; "
                   "without it: one line, exit 2, nothing written)")
    p.set_defaults(func=cmd_report)
