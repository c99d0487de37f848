"""`mlfs train`: the one parser of the trainer worker's options, and its process
(signals, logging, the fleet policy to start from) around
`mlfs.trainers.kinds.run_trainer`, which runs the worker of the model's kind.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .common import command

EXAMPLES = """examples:
  mlfs train /mnt/mlfs sim.readahead
  mlfs train /mnt/mlfs sda.readahead --model lgbm --relative --max-seconds 600
  mlfs train /mnt/mlfs linux.vm --relative --features dirtied_mb_per_s"""


def _missing_mountpoint(path: str) -> str | None:
    """Why `path` can never become a mount (None: it is one, or may become one).

    An existing directory not yet mounted is waited for (a trainer started
    before its mount, as systemd may order them); a stale mount (ENOTCONN)
    too, since a restarted daemon clears it.  Only a path that does not exist
    or is not a directory is an error.
    """
    try:
        if not os.path.isdir(path) and os.path.exists(path):
            return "not a directory"
        os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "no such directory (mount it first: mlfs mount DIR)"
    return None


#: how often a trainer waiting for its mount or subsystem looks again
WAIT_POLL_SECONDS = 0.25


def subsystems_of(mountpoint: str) -> list[str] | None:
    """The subsystems MOUNTPOINT serves (directories with an `info`), None if it is not
    an mlfs mount (no `version` file: not mounted yet, or a stale mount)."""
    root = Path(mountpoint)
    try:
        if not (root / "version").is_file():
            return None
        return sorted(p.name for p in root.iterdir() if (p / "info").is_file())
    except OSError:
        return None


def wait_for_subsystem(mountpoint: str, subsystem: str, seconds: float,
                       stop: threading.Event) -> str | None:
    """Wait up to `seconds` for MOUNTPOINT/SUBSYSTEM to be served (it may be loaded at
    run time, or the mount may still be coming up); None once it is (or `stop` is set),
    else the one line saying why not and which subsystems the mount serves."""
    log = logging.getLogger("mlfs.train")
    deadline = time.monotonic() + seconds
    said = None
    while not stop.is_set():
        names = subsystems_of(mountpoint)
        if names is not None and subsystem in names:
            return None
        why = "not an mlfs mount yet" if names is None else f"no subsystem {subsystem!r} yet"
        if why != said:
            log.info("waiting for %s/%s (%s; up to %g s, --wait)", mountpoint, subsystem,
                     why, seconds)
            said = why
        if time.monotonic() >= deadline:
            if names is None:
                return (f"{mountpoint}: not an mlfs mount after {seconds:g} s (mount it: "
                        "mlfs mount DIR)")
            return (f"{mountpoint}: no subsystem {subsystem!r} after {seconds:g} s; it serves: "
                    f"{', '.join(names) or 'none'}")
        stop.wait(min(WAIT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    return None


def model_name(text: str) -> str:
    """--model: a model directory's name, as the mount accepts it (mlfs.abi.NAME)."""
    from ..abi import NAME

    if not NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: use [a-z0-9][a-z0-9._-]{{0,63}}")
    return text


def nonnegative_seconds(text: str) -> float:
    """--wait: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: use a number of seconds >= 0")
    return value


def feature_list(text: str) -> list[str]:
    """--features: comma-separated feature names (checked against the subsystem's info)."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME[,NAME...]")
    return names


def cmd_train(args: argparse.Namespace) -> int:
    """Run the trainer worker until SIGINT/SIGTERM (exit 0) or --max-seconds; exit 2 when
    the subsystem is not served within --wait (or --max-seconds if sooner)."""
    started = time.monotonic()  # --max-seconds counts the imports below (11 s at load 14)
    missing = _missing_mountpoint(args.mountpoint)
    if missing:
        # a typo, not a mount still coming up: waiting would look like success (exit 0)
        print(f"mlfs train: {args.mountpoint}: {missing}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("mlfs.train").debug(
        "training %s for %s/%s (seed %d, --wait %g s, --max-seconds %g)", args.model,
        args.mountpoint, args.subsystem, args.seed, args.wait, args.max_seconds)
    from mlfs.trainers.kinds import UnknownKind, run_trainer
    from mlfs.trainers.knob.worker import BadOptions
    from mlfs.trainers.schedule import LEARNING_TTL

    initial = None
    if args.fleet:
        from ..fleet.pull import PullError, fetch
        from ..fleet.signing import SigningError
        from .common import default_state_dir
        from .fleet import mount_state_dir

        # the high-water mark lives in the mount's state directory; a trainer that may
        # not write there (not root's) keeps its own: it could write `policy` anyway
        state_dir = mount_state_dir(args.mountpoint)
        if not os.access(state_dir, os.W_OK):
            state_dir = default_state_dir(args.mountpoint)
        try:
            fleet = fetch(args.fleet, args.subsystem, args.fleet_version,
                          args.trusted_key or [], state_dir=state_dir)
        except SigningError as exc:  # a trusted key anyone could replace: as ssh, refuse
            print(f"mlfs train: {exc}", file=sys.stderr)
            return 2
        except PullError as exc:  # never train from an unchecked policy
            print(f"mlfs train: {exc}", file=sys.stderr)
            return 1
        initial = fleet.text
        logging.getLogger("mlfs.train").info(
            "starting from fleet policy %d (sha256 %s, %d rows from %d hosts)", fleet.version,
            fleet.card["sha256"], fleet.card.get("rows", 0), len(fleet.card.get("hosts", {})))
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        grace = min(args.wait, args.max_seconds) if args.max_seconds else args.wait
        absent = wait_for_subsystem(args.mountpoint, args.subsystem, grace, stop)
        if absent:
            print(f"mlfs train: {absent}", file=sys.stderr)
            return 2
        if stop.is_set():
            return 0
        left = args.max_seconds - (time.monotonic() - started) if args.max_seconds else None
        if left is not None and left <= 0:
            return 0
        run_trainer(args.mountpoint, args.subsystem, args.model, kind=args.kind, stop=stop,
                    max_seconds=left, seed=args.seed,
                    learning_ttl=args.explore_ticks or LEARNING_TTL, relative=args.relative,
                    initial_policy=initial, features=args.features)
    except (BadOptions, UnknownKind) as exc:
        print(f"mlfs train: {exc}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def add_parser(sub) -> None:
    p = command(sub, "train", "run a LightGBM trainer worker against a subsystem", EXAMPLES)
    p.add_argument("mountpoint", help="the mountpoint (waited for while not yet mounted)")
    p.add_argument("subsystem", help="the subsystem to train for")
    p.add_argument("--model", default="lgbm", type=model_name,
                   help="the model directory to create and start (default lgbm)")
    p.add_argument("--kind", metavar="KIND",
                   help="the kind of model to train (default: the model's own, or the "
                   "first of the kinds the subsystem's info lists)")
    p.add_argument("--max-seconds", type=float, default=0.0, metavar="SECONDS",
                   help="stop after this many seconds (default 0: until interrupted)")
    p.add_argument("--wait", type=nonnegative_seconds, default=60.0, metavar="SECONDS",
                   help="how long to wait for the mount and the subsystem to appear (it may be "
                   "loaded at run time) before exiting 2 with the subsystems the mount serves "
                   "(default 60; --max-seconds if sooner)")
    p.add_argument("--explore-ticks", type=int, default=0, metavar="TICKS",
                   help="ticks each exploration lasts (default 10)")
    p.add_argument("--relative", action="store_true",
                   help="fit relative error (objectives spanning orders of magnitude)")
    p.add_argument("--features", type=feature_list, metavar="NAME[,NAME...]",
                   help="the subsystem features the model may use (default all); leave out "
                   "those the knobs themselves move, above all a copy of the objective")
    p.add_argument("--fleet", metavar="URL",
                   help="start from the newest fleet policy (a knob model's, or a "
                   "subsystem with targets: a predictor) in this store whose sha256 "
                   "matches its card; kept while it predicts this host's rows better than "
                   "the host's own (docs/fleet.md)")
    p.add_argument("--fleet-version", type=int, metavar="N",
                   help="with --fleet: start from policy N instead of the newest")
    p.add_argument("--trusted-key", action="append", metavar="FILE",
                   help="with --fleet: an Ed25519 public key (mlfs fleet keygen) whose "
                        "signature a fleet policy must carry (repeatable); with none, no "
                        "fleet policy is installed")
    p.add_argument("--seed", type=int, default=0,
                   help="the learner's random seed (default 0)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    p.set_defaults(func=cmd_train)
