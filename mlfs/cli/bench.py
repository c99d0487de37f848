"""`mlfs bench`: the parser; the benchmarks are the mlfs.bench package."""

from __future__ import annotations

import argparse

from .common import command

EXAMPLES = """examples:
  mlfs bench --quick
  mlfs bench --json bench.json"""


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import main as bench_main

    return bench_main(quick=args.quick, json_path=args.json)


def add_parser(sub) -> None:
    p = command(sub, "bench", "what the exchange costs, against same-run references", EXAMPLES)
    p.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON here")
    p.set_defaults(func=cmd_bench)
