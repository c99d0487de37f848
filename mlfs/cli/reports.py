"""`mlfs reports`: the kernel's crash and error reports a mount keeps (linux.kmsg)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import command

EXAMPLES = """examples:
  mlfs reports /mnt/mlfs                  # one line per signature, most frequent first
  mlfs reports /mnt/mlfs --json           # with each report's first block
  mlfs reports /mnt/mlfs --html > reports.html
  mlfs fleet reports --store /srv/fleet   # merged over every host, most hosts first"""


def cmd_reports(args: argparse.Namespace) -> int:
    from mlfs.cli.kernel_reports import local_reports, main

    try:
        reports = local_reports(Path(args.mountpoint), args.subsystem)
    except OSError as exc:
        print(f"mlfs reports: {exc}", file=sys.stderr)
        return 2
    return main(reports, args.format, f"kernel reports of {args.mountpoint}")


def add_format_options(p) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json", dest="format", action="store_const", const="json",
                       help="print JSON (each report whole)")
    group.add_argument("--html", dest="format", action="store_const", const="html",
                       help="print one self-contained HTML page")
    p.set_defaults(format="text")


def add_parser(sub) -> None:
    p = command(sub, "reports", "the kernel's crash and error reports a mount keeps", EXAMPLES)
    p.add_argument("mountpoint", help="a mounted exchange serving linux.kmsg")
    p.add_argument("--subsystem", default="linux.kmsg",
                   help="the kernel-log subsystem's name (default linux.kmsg)")
    add_format_options(p)
    p.set_defaults(func=cmd_reports)
