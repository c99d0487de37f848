"""`mlfs demo`: the parser; one demo per kind of model (`mlfs.demos.DEMOS`, --kind) and the
fleet demo (mlfs.fleet.demo, --fleet N)."""

from __future__ import annotations

import argparse
import sys

from .common import command

EXAMPLES = """examples:
  mlfs demo
  mlfs demo --seconds 60 --seed 3
  mlfs demo --keep /tmp/mlfs-demo-run && mlfs report /tmp/mlfs-demo-run sim.readahead
  mlfs demo --kind predictor              # a drive-failure predictor against SMART
  mlfs demo --fleet 3
  mlfs demo --fleet 2 --host-ticks 1000 --ticks 1000"""

#: --fleet's defaults: 2,000 ticks at 0.05 s are 100 s a phase, enough for a host
#: learning alone to reach recommendation mode (median ~1,100 ticks,
#: docs/results/fleet-coldstart.md), so the demo takes a few minutes
FLEET_DEFAULTS = {"host_ticks": 2000, "ticks": 2000, "tick": 0.05}


def cmd_demo(args: argparse.Namespace) -> int:
    fleet_only = [f"--{name.replace('_', '-')}" for name in FLEET_DEFAULTS
                  if getattr(args, name) is not None]
    from mlfs.demos import DEMOS

    kind = "predictor" if args.predict else args.kind
    if kind is not None and kind not in DEMOS:
        print(f"mlfs demo: --kind {kind}: one of {', '.join(DEMOS)}", file=sys.stderr)
        return 2
    if kind is not None and (args.fleet is not None or fleet_only):
        print("mlfs demo: --kind and --fleet are two demos: give one", file=sys.stderr)
        return 2
    if args.fleet is None:
        if fleet_only:
            print(f"mlfs demo: {', '.join(fleet_only)} needs --fleet N", file=sys.stderr)
            return 2
        demo = DEMOS[kind or next(iter(DEMOS))]
        return demo.load()(seconds=args.seconds, seed=args.seed, keep=args.keep)
    from ..fleet.demo import MAX_HOSTS, MIN_HOSTS, run_fleet_demo

    try:
        hosts = int(args.fleet)
    except ValueError:
        hosts = -1
    if not MIN_HOSTS <= hosts <= MAX_HOSTS:
        print(f"mlfs demo: --fleet {args.fleet}: give a number of hosts from {MIN_HOSTS} "
              f"to {MAX_HOSTS}", file=sys.stderr)
        return 2
    values = {name: getattr(args, name) if getattr(args, name) is not None else default
              for name, default in FLEET_DEFAULTS.items()}
    if values["host_ticks"] < 1 or values["ticks"] < 1 or not 0 < values["tick"] <= 1:
        print("mlfs demo: --host-ticks and --ticks must be >= 1, --tick in (0, 1] s",
              file=sys.stderr)
        return 2
    return run_fleet_demo(hosts, seed=args.seed, keep=args.keep, **values)


def add_parser(sub) -> None:
    p = command(sub, "demo", "mount the simulated subsystem, train, summarise", EXAMPLES)
    p.add_argument("--seconds", type=float, default=120.0,
                   help="how long the trainer runs (default 120)")
    p.add_argument("--seed", type=int, default=0,
                   help="the simulated workload's seed (default 0); with --fleet the "
                        "newcomer's, the fleet hosts get SEED+101 onwards")
    p.add_argument("--keep", metavar="DIR",
                   help="keep the run's state directory as DIR (a new or empty directory) "
                        "for `mlfs report DIR sim.readahead`; with --fleet DIR holds every "
                        "host's state and the fleet store; default: delete everything")
    from mlfs.demos import DEMOS

    p.add_argument("--kind", metavar="KIND",
                   help="the kind of model to show (default knob): "
                        + "; ".join(f"{d.name}: {d.help}" for d in DEMOS.values()))
    p.add_argument("--predict", action="store_true",
                   help="the predictor demo (--kind predictor)")
    p.add_argument("--fleet", metavar="N",
                   help="the fleet demo: N hosts (2 to 16) learn alone and push to a local "
                        "store, one `mlfs fleet train` round, then a newcomer starting from "
                        "the fleet policy beside a host learning alone on the same seed")
    p.add_argument("--host-ticks", type=int, metavar="TICKS",
                   help=f"with --fleet: ticks each fleet host learns alone "
                        f"(default {FLEET_DEFAULTS['host_ticks']})")
    p.add_argument("--ticks", type=int, metavar="TICKS",
                   help=f"with --fleet: ticks the newcomer and the lone host run "
                        f"(default {FLEET_DEFAULTS['ticks']})")
    p.add_argument("--tick", type=float, metavar="SECONDS",
                   help=f"with --fleet: the simulated subsystem's tick "
                        f"(default {FLEET_DEFAULTS['tick']:g} s)")
    p.set_defaults(func=cmd_demo)
