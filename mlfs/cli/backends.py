"""`mlfs backends`: every installed backend with its settings."""

from __future__ import annotations

import argparse
import json
import sys

from .common import command

EXAMPLES = """examples:
  mlfs backends                           # name, package, description, rights, settings
  mlfs backends --json | python3 -m json.tool"""


def cmd_backends(args: argparse.Namespace) -> int:
    """Every installed backend (entry-point group mlfs.backends) with its settings.

    A backend that fails to import is reported on stderr (package, reason);
    the others are still listed.
    """
    from mlfs.backends import describe_backends

    backends, problems = describe_backends()
    if args.json:
        print(json.dumps({"backends": backends, "problems": problems}, indent=2))
    else:
        for backend in backends:
            print(f"{backend['name']}  ({backend['package']})\n    {backend['description']}")
            traits = [f"kinds: {', '.join(backend['kinds'])}"] if backend["kinds"] else []
            traits += ["root only"] if backend["root_only"] else []
            traits += ["uses the state directory"] if backend["uses_state_dir"] else []
            if traits:
                print(f"    ({'; '.join(traits)})")
            for s in backend["settings"]:
                default = f" = {json.dumps(s['default'])}" if "default" in s else ""
                print(f"    {s['name']}: {s['type']}{default}")
    for problem in problems:
        print(f"mlfs backends: {problem}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = command(sub, "backends", "installed backends, their settings, types and defaults", EXAMPLES)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_backends)
