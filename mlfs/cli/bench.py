"""`mlfs bench`: the parser; the benchmarks are the mlfs.bench package."""

from __future__ import annotations

import argparse

from .common import command

EXAMPLES = """examples:
  mlfs bench --quick
  mlfs bench --json-out bench.json        # also bench.md beside it
  mlfs bench --quick --json | python3 -m json.tool"""


def outputs(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(the JSON file to write, whether stdout is JSON): `--json` alone is the flag every
    command has; `--json FILE`, the old spelling of `--json-out FILE`, is kept."""
    path = args.json_out or (args.json if isinstance(args.json, str) else None)
    return path, args.json is True


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import main as bench_main

    path, as_json = outputs(args)
    return bench_main(quick=args.quick, json_path=path, as_json=as_json)


def add_parser(sub) -> None:
    p = command(sub, "bench", "what the exchange costs, against same-run references", EXAMPLES)
    p.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    p.add_argument("--json", nargs="?", const=True, default=None, metavar="FILE",
                   help="print the report as JSON on stdout instead of the table, as "
                   "--json does on every command; `--json FILE` is the old spelling of "
                   "--json-out FILE (kept working)")
    p.add_argument("--json-out", metavar="FILE",
                   help="also write the report as JSON to FILE, and its table to FILE.md")
    p.set_defaults(func=cmd_bench)
