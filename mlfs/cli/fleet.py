"""`mlfs fleet push|train|status`: the command lines of mlfs.fleet (docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import reports
from .common import command, default_state_dir

EXAMPLES = """examples:
  mlfs fleet push /mnt/mlfs --store /srv/fleet --once      # ship what is sealed, exit
  mlfs fleet push /mnt/mlfs --store s3://bucket/fleet --subsystem 'linux.block.*'
  mlfs fleet train --store /srv/fleet --subsystem linux.vm --scheduler tcp://10.0.0.5:8786
  mlfs fleet keygen /etc/mlfs/fleet.key   # fleet.key (secret) and fleet.key.pub
  mlfs fleet train --store /srv/fleet --subsystem linux.vm --key /etc/mlfs/fleet.key
  mlfs fleet train --store /srv/fleet --subsystem linux.vm --since 2026-11-01
  mlfs fleet train --store /srv/fleet --subsystem sim.disks --kind anomaly
  mlfs fleet status --store /srv/fleet
  mlfs fleet report --store /srv/fleet      # per host: mode, efficiency, fleet policy
  mlfs fleet reports --store /srv/fleet     # kernel crash reports merged over hosts"""


def mount_state_dir(mountpoint: Path) -> Path:
    """The state directory of the daemon serving `mountpoint`, as its pid file records
    it (a mount made with --state-dir too); the default one when no daemon records it."""
    from .. import runfile

    found = runfile.state_dir(mountpoint)
    if found is None and os.path.abspath(mountpoint) != os.path.realpath(mountpoint):
        found = runfile.state_dir(os.path.realpath(mountpoint))
    return found or default_state_dir(mountpoint)


def cmd_fleet_push(args: argparse.Namespace) -> int:
    import logging

    from ..fleet.push import main as push_main

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    mountpoint = Path(args.mountpoint)
    state_dir = Path(args.state_dir) if args.state_dir else mount_state_dir(mountpoint)
    return push_main(mountpoint, args.store, state_dir, args.subsystem or (), args.once,
                     args.interval, args.max_backoff,
                     Path(args.metrics_file) if args.metrics_file else None)


def cmd_fleet_train(args: argparse.Namespace) -> int:
    import logging

    from ..fleet.signing import SigningError
    from ..fleet.train import TrainError, train

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # LightGBM's network setup prints to fd 1 in the LocalCluster's workers (our
    # children): send it to stderr, so stdout is the card alone
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        card = train(args.store, args.subsystem, args.scheduler, folds=args.folds,
                     n_workers=args.workers, since=args.since, until=args.until,
                     fit_timeout=args.fit_timeout,
                     key=Path(args.key) if args.key else None,
                     progress=None if args.quiet else _stage, dashboard=args.dashboard,
                     kind=args.kind)
    except TrainError as exc:
        print(f"mlfs fleet train: {exc}", file=sys.stderr)
        return 1
    except SigningError as exc:  # a key refused as ssh refuses one: the operator's to mend
        print(f"mlfs fleet train: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if args.json:
        print(json.dumps(card, indent=2))
    else:
        what, error = "MAE", card["validation"]["mae"]
        if card.get("kind") == "predictor":
            what, error = "log loss", card["validation"]["log_loss"]
        print(f"mlfs fleet train: published {card['subsystem']} policy {card['version']} "
              f"({card['rows']} rows, {len(card['hosts'])} hosts, held-out-host {what} "
              f"{'n/a' if error is None else f'{error:.4g}'}, {card['seconds']:.1f} s)")
    return 0


def _stage(line: str) -> None:
    """A stage line on stderr: `mlfs fleet train 12.3 s: portions read 40/92` (never
    `mlfs fleet train: `, the prefix of its one result or error line)."""
    print(f"mlfs fleet train {line}", file=sys.stderr, flush=True)


def cmd_fleet_keygen(args: argparse.Namespace) -> int:
    from ..fleet.signing import SigningError, keygen

    try:
        public = keygen(Path(args.file))
    except SigningError as exc:
        print(f"mlfs fleet keygen: {exc}", file=sys.stderr)
        return 2
    print(f"mlfs fleet keygen: private key {args.file} (keep it secret), public key {public}")
    return 0


def cmd_fleet_report(args: argparse.Namespace) -> int:
    from ..fleet.report import main as report_main

    return report_main(args.store, args.json)


def cmd_fleet_reports(args: argparse.Namespace) -> int:
    from mlfs.cli.kernel_reports import fleet_reports, main

    return main(fleet_reports(args.store, args.subsystem), args.format,
                f"kernel reports of {args.store}")


def cmd_fleet_status(args: argparse.Namespace) -> int:
    from ..fleet.status import main as status_main

    return status_main(args.store, args.json)


def add_parser(sub) -> None:
    p = command(sub, "fleet", "share rows and policies with a fleet store (docs/fleet.md)",
                EXAMPLES)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                               help="push, train or status")
    q = actions.add_parser(
        "push", help="ship every sealed portion of a mount to a fleet store, exactly once",
        description="Ship every sealed portion (dataset, feedback, recommendations) of a "
        "mount to a fleet store as hive-partitioned Parquet, exactly once; a service "
        "(SIGTERM ends it) unless --once.")
    q.add_argument("mountpoint", help="the mounted exchange")
    q.add_argument("--store", required=True, metavar="URL",
                   help="the fleet store: a directory or an fsspec URL (s3://... with s3fs)")
    q.add_argument("--subsystem", action="append", metavar="S",
                   help="a subsystem name or glob to ship (repeatable; default: all)")
    q.add_argument("--state-dir", metavar="DIR",
                   help="the mount's state directory, where the cursor is kept "
                   "(default: the one the running daemon of MOUNTPOINT records in its pid "
                   "file, else the one `mlfs mount` picks for the mountpoint)")
    q.add_argument("--once", action="store_true",
                   help="one pass, then exit: 0 when nothing waits, 1 on a store error")
    q.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between passes (default 5)")
    q.add_argument("--max-backoff", type=float, default=60.0, metavar="SECONDS",
                   help="longest wait between retries while the store fails (default 60)")
    q.add_argument("--metrics-file", metavar="FILE",
                   help="Prometheus text file of backlog, losses and failures "
                   "(default: STATE_DIR/fleet/push-<store key>.prom)")
    q.set_defaults(func=cmd_fleet_push)
    q = actions.add_parser(
        "train", help="train one policy from every host's rows on a Dask cluster; publish it",
        description="Train one LightGBM policy for a subsystem from every host's rows in "
        "the store with lightgbm.dask, validate it on held-out hosts, and publish "
        "policies/S/N.txt with its model card N.json.")
    q.add_argument("--store", required=True, metavar="URL", help="the fleet store")
    q.add_argument("--subsystem", required=True, metavar="S",
                   help="a subsystem name, or a glob pooling subsystems with the same knobs")
    q.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="a running Dask scheduler (default: a LocalCluster on this machine)")
    q.add_argument("--workers", type=int, default=2, metavar="N",
                   help="LocalCluster workers when no scheduler is given (default 2)")
    q.add_argument("--folds", type=int, default=5, metavar="N",
                   help="hosts held out one at a time for validation (default 5)")
    q.add_argument("--kind", metavar="KIND",
                   help="the kind of model to train (knob, predictor, anomaly, ...; default: "
                   "the first kind the subsystem's info lists)")
    q.add_argument("--since", metavar="TIME", help="only rows at or after TIME (ISO 8601, UTC)")
    q.add_argument("--until", metavar="TIME", help="only rows before TIME (ISO 8601, UTC)")
    q.add_argument("--fit-timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="give up a fit after this long, publishing nothing (default 3600)")
    q.add_argument("--key", metavar="FILE",
                   help="sign the card with this Ed25519 private key (mlfs fleet keygen): "
                        "hosts install only policies a key they trust signed")
    q.add_argument("--dashboard", metavar="HOST:PORT",
                   help="serve Dask's dashboard here while training (a LocalCluster; a "
                   "named scheduler serves its own, whose link is printed)")
    q.add_argument("--quiet", action="store_true",
                   help="no stage lines on stderr (portions read, alignment, folds, fit)")
    q.add_argument("--json", action="store_true", help="print the model card as JSON")
    q.set_defaults(func=cmd_fleet_train)
    q = actions.add_parser("keygen", help="make an Ed25519 key pair to sign fleet policies",
                           description="Write FILE (the private key, 0600: keep it where "
                           "`mlfs fleet train --key` runs) and FILE.pub (the public key: give "
                           "it to every host's `mlfs train --trusted-key`).")
    q.add_argument("file", help="where the private key goes (FILE.pub: the public key)")
    q.set_defaults(func=cmd_fleet_keygen)
    q = actions.add_parser(
        "status", help="hosts, rows, backlog, losses, modes and policies of a fleet store",
        description="Per host and subsystem: rows and portions shipped, last push, backlog, "
        "losses, each model's mode and efficiency, and the newest policy.")
    q.add_argument("--store", required=True, metavar="URL", help="the fleet store")
    q.add_argument("--json", action="store_true", help="print JSON instead of text")
    q.set_defaults(func=cmd_fleet_status)
    q = actions.add_parser("report", help="per host, subsystem and model: rows, mode, "
                           "efficiency and which fleet policy runs")
    q.add_argument("--store", required=True, metavar="URL", help="the fleet store")
    q.add_argument("--json", action="store_true", help="print JSON instead of text")
    q.set_defaults(func=cmd_fleet_report)
    q = actions.add_parser("reports", help="the kernel's crash and error reports merged by "
                           "signature over every host, most hosts first")
    q.add_argument("--store", required=True, metavar="URL", help="the fleet store")
    q.add_argument("--subsystem", default="linux.kmsg",
                   help="the kernel-log subsystem's name (default linux.kmsg)")
    reports.add_format_options(q)
    q.set_defaults(func=cmd_fleet_reports)
