"""`mlfs demo`: the parser; the demo is mlfs.demo."""

from __future__ import annotations

import argparse

from .common import command

EXAMPLES = """examples:
  mlfs demo
  mlfs demo --seconds 60 --seed 3
  mlfs demo --keep /tmp/mlfs-demo-run && mlfs report /tmp/mlfs-demo-run sim.readahead"""


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    return run_demo(seconds=args.seconds, seed=args.seed, keep=args.keep)


def add_parser(sub) -> None:
    p = command(sub, "demo", "mount the simulated subsystem, train, summarise", EXAMPLES)
    p.add_argument("--seconds", type=float, default=120.0,
                   help="how long the trainer runs (default 120)")
    p.add_argument("--seed", type=int, default=0,
                   help="the simulated workload's seed (default 0)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep the run's state directory as DIR (a new or empty directory) "
                        "for `mlfs report DIR sim.readahead`; default: delete everything")
    p.set_defaults(func=cmd_demo)
