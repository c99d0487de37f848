"""`mlfs config default|check|show|schema`: the embedded configuration, checking a file,
the effective configuration, and the JSON Schema of the file."""

from __future__ import annotations

import argparse
import json
import sys

from .common import command

EXAMPLES = """examples:
  mlfs config default > /etc/mlfs/mlfs.toml
  mlfs config check /etc/mlfs/mlfs.toml && echo valid
  mlfs config check --json /etc/mlfs/mlfs.toml   # {"file", "valid", "error", "line"}
  mlfs config show /etc/mlfs/mlfs.toml           # every setting, defaults filled in
  mlfs config schema > mlfs.schema.json          # for editors (docs/config.schema.json)"""


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
        if args.json:
            print(json.dumps({"file": args.file, "valid": False,
                              "error": config_error(args.file, exc),
                              "line": getattr(exc, "line", None)}))
        else:
            print(f"mlfs: {config_error(args.file, exc)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": args.file, "valid": True, "error": None, "line": None}))
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from ..config import as_dict, as_toml, load_config

    try:
        config = load_config(args.file)
    except (OSError, ValueError) as exc:
        print(f"mlfs: {config_error(args.file or '<embedded default>', exc)}",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(as_dict(config), indent=2))
    else:
        sys.stdout.write(as_toml(config))
    return 0


def cmd_config_schema(args: argparse.Namespace) -> int:
    from ..config import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def add_parser(sub) -> None:
    p = command(sub, "config", "print the default or effective configuration, check a file, "
                "or print its JSON Schema", EXAMPLES)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                               help="default, check, show or schema")
    q = actions.add_parser("default", help="print the embedded default configuration",
                           description="Print the embedded default configuration (TOML).")
    q.set_defaults(func=cmd_config_default)
    q = actions.add_parser("check", help="load FILE as `mlfs mount` would: exit 0, or print "
                           "the error on one line and exit 2",
                           description="Load FILE as `mlfs mount --config FILE` would, "
                           "without mounting: exit 0 when valid, else one line (with the "
                           "line of the file where known) and exit 2.")
    q.add_argument("file", help="the TOML configuration to check")
    q.add_argument("--json", action="store_true",
                   help='print {"file", "valid", "error", "line"} on stdout instead')
    q.set_defaults(func=cmd_config_check)
    q = actions.add_parser("show", help="print the effective configuration: every setting "
                           "of FILE (default: the embedded one), defaults filled in",
                           description="Print the configuration `mlfs mount --config FILE` "
                           "would run with: every [mount], [store] and [modes] setting, "
                           "defaults filled in, and the [[subsystem]] tables as written. "
                           "An invalid FILE is one line and exit 2.")
    q.add_argument("file", nargs="?", help="the TOML configuration (default: the embedded "
                   "default)")
    q.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    q.set_defaults(func=cmd_config_show)
    q = actions.add_parser("schema", help="print the JSON Schema of the configuration file",
                           description="Print the JSON Schema (draft 2020-12) of the "
                           "configuration file, generated from the settings and their "
                           "ranges (docs/config.schema.json is this output).")
    q.set_defaults(func=cmd_config_schema)
