"""`mlfs config default|check`: the embedded configuration, and checking a file."""

from __future__ import annotations

import argparse
import sys

from .common import command

EXAMPLES = """examples:
  mlfs config default > /etc/mlfs/mlfs.toml
  mlfs config check /etc/mlfs/mlfs.toml && echo valid"""


def cmd_config_default(args: argparse.Namespace) -> int:
    from ..config import default_text

    sys.stdout.write(default_text())
    return 0


def config_error(path: str, exc: Exception) -> str:
    """One line naming the file: what `mlfs config check` prints."""
    if isinstance(exc, OSError):
        text = exc.strerror or str(exc)
    else:
        text = " ".join(str(exc).split())
    return text if path in text else f"{path}: {text}"


def cmd_config_check(args: argparse.Namespace) -> int:
    from ..config import load_config

    try:
        load_config(args.file)
    except (OSError, ValueError) as exc:
        print(f"mlfs: {config_error(args.file, exc)}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub) -> None:
    p = command(sub, "config", "print the embedded default configuration or check a file", EXAMPLES)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                               help="default or check")
    q = actions.add_parser("default", help="print the embedded default configuration",
                           description="Print the embedded default configuration (TOML).")
    q.set_defaults(func=cmd_config_default)
    q = actions.add_parser("check", help="load FILE as `mlfs mount` would: exit 0, or print "
                           "the error on one line and exit 2",
                           description="Load FILE as `mlfs mount --config FILE` would, "
                           "without mounting: exit 0 when valid, else one line and exit 2.")
    q.add_argument("file", help="the TOML configuration to check")
    q.set_defaults(func=cmd_config_check)
