"""The `mlfs` command line: the parser of every command and what each one runs."""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path


def default_state_dir(mountpoint: Path) -> Path:
    """One state directory per mountpoint, so two mounts never share rows."""
    real = os.path.realpath(mountpoint)
    tag = real.strip("/").replace("/", "_") or "root"
    tag = f"{tag[:80]}-{hashlib.sha1(real.encode()).hexdigest()[:8]}"
    if os.geteuid() == 0:
        base = Path("/var/lib/mlfs")
    else:
        base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "mlfs"
    return base / tag


def find_daemon(mountpoint: Path) -> int | None:
    """The pid of the mlfs daemon serving `mountpoint`, from its pid file under /run/mlfs.

    Never scans other daemons or resolves other mounts' paths (a wedged mount
    would block that): only the path given is looked at, then its resolved
    form (which touches this mountpoint alone) in case it was given via a
    symlink.  See mlfs.runfile.
    """
    from . import runfile

    pid = runfile.read(mountpoint)
    if pid is None:
        real = os.path.realpath(mountpoint)
        if real != os.path.abspath(mountpoint):
            pid = runfile.read(real)
    return pid


#: the mount's bdi read-ahead: the kernel asks the daemon for up to this much per request
READ_AHEAD_KB = 1024


def raise_read_ahead(mountpoint: Path, kb: int = READ_AHEAD_KB) -> int | None:
    """Raise the mount's bdi `read_ahead_kb` so a sequential read costs fewer requests.

    A FUSE mount starts at 128 KiB: a cold portion read is then one round trip
    through the single-threaded daemon per 128 KiB.  At 1024 KiB the kernel
    sends 1 MiB requests (the libfuse maximum), which roughly doubled a first
    read (docs/fuse-notes.md; `mlfs bench`).  Called by the *parent* `mlfs mount` once
    the daemon answers: the daemon must never do this itself (touching its own
    mount deadlocks).  Best effort: without root the write fails and the
    kernel default stays.  Returns the value in effect, None when unknown.
    """
    try:
        dev = os.stat(mountpoint).st_dev
        path = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        current = int(path.read_text())
        if current < kb:
            path.write_text(f"{kb}\n")
            current = int(path.read_text())
        return current
    except (OSError, ValueError):
        return None


def cmd_mount(args: argparse.Namespace) -> int:
    from .config import check_host, load_config
    from .core import statedir

    mountpoint = Path(args.mountpoint)
    try:
        config = load_config(args.config)
        check_host(config)
    except ValueError as exc:  # ConfigError: one line naming the file and the key
        print(f"mlfs: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(mountpoint)
    problem = _mountpoint_problem(mountpoint)
    if problem:
        print(f"mlfs: {mountpoint}: {problem}", file=sys.stderr)
        return 2
    try:
        statedir.check(state_dir)
    except statedir.FormatError as exc:
        print(f"mlfs: {exc}", file=sys.stderr)
        return 2
    if not args.foreground:
        other = statedir.live_daemon(state_dir, repair=False)
        if other is not None:
            print(f"mlfs: {state_dir}: in use by the mlfs daemon {other} (see its mlfs.pid)",
                  file=sys.stderr)
            return 2
    if args.foreground:
        from . import daemon

        state_dir.mkdir(parents=True, exist_ok=True)
        daemon.setup_logging(state_dir, foreground=args.ready_fd is None)
        return daemon.serve(mountpoint, config, state_dir, ready_fd=args.ready_fd)
    state_dir.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "mlfs", "mount", str(mountpoint), "--foreground",
               "--state-dir", str(state_dir), "--ready-fd", str(write_end)]
    if args.config:
        command += ["--config", str(args.config)]
    with open(state_dir / "mlfs.log", "ab") as log_file:
        child = subprocess.Popen(command, pass_fds=(write_end,), stdin=subprocess.DEVNULL,
                                 stdout=log_file, stderr=log_file, start_new_session=True)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        answer = ready.read(3)
    if answer == b"ok\n":
        raise_read_ahead(mountpoint)
        print(f"mlfs: {mountpoint} mounted (pid {child.pid}, state {state_dir})")
        return 0
    child.wait(timeout=10)
    print(f"mlfs: mount failed (exit {child.returncode}); see {state_dir / 'mlfs.log'}:",
          file=sys.stderr)
    tail = (state_dir / "mlfs.log").read_text(errors="replace").splitlines()[-15:]
    print("\n".join(tail), file=sys.stderr)
    return 1


def _mountpoint_problem(mountpoint: Path) -> str | None:
    """Why `mountpoint` cannot be mounted on, or None (a stale mount is fine).

    A mountpoint left by a daemon that was killed before its auto_unmount
    helper could clean up answers ENOTCONN to everything; the daemon clears
    it (`clean_stale_mount`) before mounting, so it is not a problem here.
    """
    try:
        st = os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            return None
        return os.strerror(exc.errno or errno.EIO)
    return None if stat.S_ISDIR(st.st_mode) else "not a directory"


def cmd_umount(args: argparse.Namespace) -> int:
    from .runfile import mounted_fstype

    mountpoint = Path(args.mountpoint)
    pid = find_daemon(mountpoint)
    if pid is None and mounted_fstype(mountpoint) == "fuse.mlfs":
        # mounted, but no pid file names its daemon (removed, or written elsewhere):
        # an external unmount is a clean stop too; the daemon seals and exits itself
        done = subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        if done.returncode == 0:
            print(f"mlfs: {mountpoint}: no pid file for its daemon; unmounted it, the daemon "
                  "seals and exits by itself", file=sys.stderr)
            return 0
        return 1
    if pid is None:
        try:
            os.stat(mountpoint)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
                return 0
        print(f"mlfs: no mlfs daemon serves {mountpoint}", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return 0
        time.sleep(0.05)
    print(f"mlfs: daemon {pid} did not stop in {args.timeout:g} s; unmounting lazily",
          file=sys.stderr)
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
    return 1


def cmd_restore(args: argparse.Namespace) -> int:
    """Put back every original knob value a state directory's ledger recorded."""
    import logging

    from mlfs.backends.linux_common import restore_state_dir

    from .core import statedir

    state_dir = Path(args.state_dir)
    if not state_dir.is_dir():
        print(f"mlfs: {state_dir}: no such state directory", file=sys.stderr)
        return 2
    other = statedir.live_daemon(state_dir, repair=False)
    if other is not None:
        print(f"mlfs: {state_dir}: the mlfs daemon {other} still serves it; "
              f"`mlfs umount` restores its knobs", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR, format="mlfs restore: %(message)s")
    outcomes = restore_state_dir(state_dir)
    if not outcomes:
        print(f"mlfs: {state_dir}: no original knob value recorded; nothing to restore")
        return 0
    for path, outcome, ok in outcomes:
        print(f"{path}: {outcome}", file=sys.stdout if ok else sys.stderr)
    failed = sum(not ok for _, _, ok in outcomes)
    if failed:
        print(f"mlfs: {failed} of {len(outcomes)} could not be restored (see above)",
              file=sys.stderr)
        return 1
    return 0


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _read(path: Path, default: str = "?") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def collect_status(mountpoint: Path) -> dict:
    out: dict = {"mountpoint": str(mountpoint), "version": _read(mountpoint / "version"),
                 "subsystems": {}}
    for sub in sorted(p for p in mountpoint.iterdir() if (p / "info").exists()):
        info = json.loads(_read(sub / "info", "{}"))
        entry = {"backend": info.get("backend"),
                 # config (the configuration file) or load (MOUNT/control, mkdir)
                 "source": info.get("source", "config"),
                 "objective": _read(sub / "objective"),
                 "knobs": {k: _read(sub / "knobs" / k) for k in info.get("knobs", {})},
                 "portions": len(list((sub / "dataset").glob("*.parquet"))), "models": {}}
        for model in sorted((sub / "models").iterdir()):
            entry["models"][model.name] = {
                name: _read(model / name)
                for name in ("state", "mode", "mode_switching", "efficiency", "knobs")
            }
        out["subsystems"][sub.name] = entry
    return out


def cmd_status(args: argparse.Namespace) -> int:
    from .status_view import main as status_main

    mountpoint, watch = args.mountpoint, args.watch
    if watch is not None:
        try:
            watch = float(watch)
        except ValueError:  # `mlfs status --watch /mnt/mlfs`: the mountpoint, not SECONDS
            if mountpoint is not None:
                print(f"mlfs status: --watch takes seconds, not {watch!r}", file=sys.stderr)
                return 2
            mountpoint, watch = watch, 2.0
    if mountpoint is None:
        print("usage: mlfs status [--json] [--watch [SECONDS]] MOUNTPOINT", file=sys.stderr)
        return 2
    return status_main(Path(mountpoint), as_json=args.json, watch_seconds=watch)


def cmd_train(args: argparse.Namespace) -> int:
    from mlfs.trainers.worker import main as train_main

    argv = [args.mountpoint, args.subsystem, "--model", args.model]
    if args.max_seconds:
        argv += ["--max-seconds", str(args.max_seconds)]
    if args.explore_ticks:
        argv += ["--explore-ticks", str(args.explore_ticks)]
    if args.relative:
        argv.append("--relative")
    if args.fleet:
        argv += ["--fleet", args.fleet]
    if args.fleet_version is not None:
        argv += ["--fleet-version", str(args.fleet_version)]
    return train_main(argv)


def cmd_fleet_push(args: argparse.Namespace) -> int:
    import logging

    from .fleet.push import main as push_main

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    mountpoint = Path(args.mountpoint)
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(mountpoint)
    return push_main(mountpoint, args.store, state_dir, args.subsystem or (), args.once,
                     args.interval, args.max_backoff,
                     Path(args.metrics_file) if args.metrics_file else None)


def cmd_fleet_train(args: argparse.Namespace) -> int:
    import json
    import logging

    from .fleet.train import TrainError, train

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # LightGBM's network setup prints to fd 1 in the LocalCluster's workers (our
    # children): send it to stderr, so stdout is the card alone
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        card = train(args.store, args.subsystem, args.scheduler, folds=args.folds,
                     n_workers=args.workers, since=args.since, until=args.until,
                     fit_timeout=args.fit_timeout)
    except TrainError as exc:
        print(f"mlfs fleet train: {exc}", file=sys.stderr)
        return 1
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if args.json:
        print(json.dumps(card, indent=2))
    else:
        mae = card["validation"]["mae"]
        print(f"mlfs fleet train: published {card['subsystem']} policy {card['version']} "
              f"({card['rows']} rows, {len(card['hosts'])} hosts, held-out-host MAE "
              f"{'n/a' if mae is None else f'{mae:.4g}'}, {card['seconds']:.1f} s)")
    return 0


def cmd_fleet_report(args: argparse.Namespace) -> int:
    from .fleet.report import main as report_main

    return report_main(args.store, args.json)


def cmd_fleet_status(args: argparse.Namespace) -> int:
    from .fleet.status import main as status_main

    return status_main(args.store, args.json)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(seconds=args.seconds, seed=args.seed, keep=args.keep)


def cmd_config_default(args: argparse.Namespace) -> int:
    from .config import default_text

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
    from .config import load_config

    try:
        load_config(args.file)
    except (OSError, ValueError) as exc:
        print(f"mlfs: {config_error(args.file, exc)}", file=sys.stderr)
        return 2
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main

    argv = (["--quick"] if args.quick else []) + (["--json", args.json] if args.json else [])
    return bench_main(argv)


#: one line per command for the top-level description; each command's help= says the rest
SUMMARY = """mlfs exchanges data and decisions between kernel subsystems and user-space ML
trainers through a FUSE filesystem: subsystems publish Parquet datasets, trainers
write recommendations and upload LightGBM policies into sysfs-style files.

commands: """

EXAMPLES = {
    "mlfs": """examples:
  mlfs demo                               # mount the simulated subsystem, train, summarise
  mlfs mount /mnt/mlfs --config /etc/mlfs/mlfs.toml
  mlfs status /mnt/mlfs
  mlfs umount /mnt/mlfs

Every command takes --help.  Manual page: mlfs(8).""",
    "mount": """examples:
  mlfs mount /mnt/mlfs                            # the embedded default configuration
  mlfs mount /mnt/mlfs --config /etc/mlfs/mlfs.toml
  mlfs mount /mnt/mlfs --foreground --state-dir /var/lib/mlfs/mnt-mlfs   # under systemd""",
    "umount": """examples:
  mlfs umount /mnt/mlfs
  mlfs umount /mnt/mlfs --timeout 10      # then lazily unmount if the daemon is stuck""",
    "status": """examples:
  mlfs status /mnt/mlfs
  mlfs status --watch /mnt/mlfs           # redraw every 2 s until Ctrl-C
  mlfs status --json /mnt/mlfs | python3 -m json.tool""",
    "report": """examples:
  mlfs report /mnt/mlfs sim.readahead     # a mounted exchange
  mlfs report /mnt/mlfs sim.readahead --model lgbm --png
  mlfs report /var/lib/mlfs/mnt-mlfs sim.readahead   # after umount, from the state
  mlfs report /tmp/mlfs-demo-run sim.readahead       # what `mlfs demo --keep` kept""",
    "train": """examples:
  mlfs train /mnt/mlfs sim.readahead
  mlfs train /mnt/mlfs sda.readahead --model lgbm --relative --max-seconds 600""",
    "demo": """examples:
  mlfs demo
  mlfs demo --seconds 60 --seed 3
  mlfs demo --keep /tmp/mlfs-demo-run && mlfs report /tmp/mlfs-demo-run sim.readahead""",
    "bench": """examples:
  mlfs bench --quick
  mlfs bench --json bench.json""",
    "backends": """examples:
  mlfs backends                           # name, package, description, settings
  mlfs backends --json | python3 -m json.tool""",
    "restore": """examples:
  mlfs restore --state-dir /var/lib/mlfs/mnt-mlfs   # the daemon is gone for good""",
    "fleet": """examples:
  mlfs fleet push /mnt/mlfs --store /srv/fleet --once      # ship what is sealed, exit
  mlfs fleet push /mnt/mlfs --store s3://bucket/fleet --subsystem 'linux.block.*'
  mlfs fleet train --store /srv/fleet --subsystem linux.vm --scheduler tcp://10.0.0.5:8786
  mlfs fleet train --store /srv/fleet --subsystem linux.vm --since 2026-11-01
  mlfs fleet status --store /srv/fleet
  mlfs fleet report --store /srv/fleet      # per host: mode, efficiency, fleet policy""",
    "config": """examples:
  mlfs config default > /etc/mlfs/mlfs.toml
  mlfs config check /etc/mlfs/mlfs.toml && echo valid""",
}


def _command(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:]
                          + ".", epilog=EXAMPLES.get(name),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


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
            for s in backend["settings"]:
                default = f" = {json.dumps(s['default'])}" if "default" in s else ""
                print(f"    {s['name']}: {s['type']}{default}")
    for problem in problems:
        print(f"mlfs backends: {problem}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="mlfs", epilog=EXAMPLES["mlfs"],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mlfs {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands below; `mlfs COMMAND --help` says more")
    p = _command(sub, "mount", "mount and serve (returns when the mount answers)")
    p.add_argument("mountpoint", help="an existing directory to mount on")
    p.add_argument("--config", metavar="FILE",
                   help="the TOML configuration (default: the embedded one, "
                        "see `mlfs config default`)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where portions, journals, the knob ledger and mlfs.log live "
                        "(default: one per mountpoint under /var/lib/mlfs, or "
                        "$XDG_STATE_HOME/mlfs when not root)")
    p.add_argument("--foreground", action="store_true",
                   help="serve in this process and log to stderr (systemd, containers) "
                        "instead of forking a daemon")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_mount)
    p = _command(sub, "umount", "seal open rows, restore knobs, unmount")
    p.add_argument("mountpoint", help="the mountpoint of a running mlfs mount")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the daemon to seal and stop before "
                        "unmounting lazily and exiting 1 (default 60)")
    p.set_defaults(func=cmd_umount)
    p = _command(sub, "restore", "put back every original knob value a state directory "
                 "recorded (the daemon gone for good), without mounting")
    p.add_argument("--state-dir", required=True,
                   help="the state directory whose ledger of original values is restored")
    p.set_defaults(func=cmd_restore)
    p = _command(sub, "status", "subsystems, models, modes, efficiency")
    p.add_argument("mountpoint", nargs="?",  # optional only so `--watch MOUNTPOINT` works
                   help="the mountpoint of a running mlfs mount")
    p.add_argument("--json", action="store_true",
                   help="machine-readable (with --watch: one JSON line per refresh)")
    p.add_argument("--watch", nargs="?", const="2", metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C")
    p.set_defaults(func=cmd_status)
    def _report(args: argparse.Namespace) -> int:  # imported when asked (it loads pyarrow)
        from .report import main as report_main

        return report_main(args)

    p = _command(sub, "report", "an HTML report (inline SVG) of a subsystem's run")
    p.add_argument("mountpoint", metavar="MOUNTPOINT|STATE_DIR",
                   help="a mounted exchange, or a mount's state directory (also after "
                        "umount: its sealed portions are reported)")
    p.add_argument("subsystem", help="the subsystem's name (a directory of the mount)")
    p.add_argument("--model", help="the model whose modes and efficiency to show "
                   "(default: the one that controlled most ticks)")
    p.add_argument("--out", metavar="FILE",
                   help="the HTML file (default: mlfs-report-SUBSYSTEM-MODEL.html)")
    p.add_argument("--all", action="store_true",
                   help="every dataset row (default: from 500 rows before the model's first)")
    p.add_argument("--last", type=int, default=0, metavar="ROWS",
                   help="only the newest ROWS of those rows")
    p.add_argument("--max-points", type=int, default=5000, metavar="N",
                   help="plot at most this many objective points (every k-th row beyond)")
    p.add_argument("--png", action="store_true",
                   help="also write FILE.png with matplotlib (pip install 'mlfs[plots]')")
    p.set_defaults(func=_report)
    p = _command(sub, "train", "run a LightGBM trainer worker against a subsystem")
    p.add_argument("mountpoint", help="the mountpoint (waited for while not yet mounted)")
    p.add_argument("subsystem", help="the subsystem to train for")
    p.add_argument("--model", default="lgbm",
                   help="the model directory to create and start (default lgbm)")
    p.add_argument("--max-seconds", type=float, default=0.0, metavar="SECONDS",
                   help="stop after this many seconds (default 0: until interrupted)")
    p.add_argument("--explore-ticks", type=int, default=0, metavar="TICKS",
                   help="ticks each exploration lasts (default 10)")
    p.add_argument("--relative", action="store_true",
                   help="fit relative error (objectives spanning orders of magnitude)")
    p.add_argument("--fleet", metavar="URL",
                   help="start from the newest fleet policy for the subsystem in this store "
                   "whose sha256 matches its card (docs/fleet.md)")
    p.add_argument("--fleet-version", type=int, metavar="N",
                   help="with --fleet: start from policy N instead of the newest")
    p.set_defaults(func=cmd_train)
    p = _command(sub, "demo", "mount the simulated subsystem, train, summarise")
    p.add_argument("--seconds", type=float, default=120.0,
                   help="how long the trainer runs (default 120)")
    p.add_argument("--seed", type=int, default=0,
                   help="the simulated workload's seed (default 0)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep the run's state directory as DIR (a new or empty directory) "
                        "for `mlfs report DIR sim.readahead`; default: delete everything")
    p.set_defaults(func=cmd_demo)
    p = _command(sub, "bench", "what the exchange costs, against same-run references")
    p.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON here")
    p.set_defaults(func=cmd_bench)
    p = _command(sub, "config", "print the embedded default configuration or check a file")
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
    p = _command(sub, "fleet", "share rows and policies with a fleet store (docs/fleet.md)")
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
                   "(default: the one `mlfs mount` picks for the mountpoint)")
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
    q.add_argument("--since", metavar="TIME", help="only rows at or after TIME (ISO 8601, UTC)")
    q.add_argument("--until", metavar="TIME", help="only rows before TIME (ISO 8601, UTC)")
    q.add_argument("--fit-timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="give up a fit after this long, publishing nothing (default 3600)")
    q.add_argument("--json", action="store_true", help="print the model card as JSON")
    q.set_defaults(func=cmd_fleet_train)
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
    p = _command(sub, "backends", "installed backends, their settings, types and defaults")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_backends)
    parser.description = SUMMARY + ", ".join(sub.choices) + "."
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    if argv and argv[0] not in commands and not argv[0].startswith("-") and "-o" in argv:
        # mount.fuse3 runs `mlfs none DIR -o OPTS` for fstab's `mlfs#none` form
        from .mount_helper import main as helper_main

        return helper_main(argv)
    args = parser.parse_args(argv)
    return args.func(args)


def entry() -> None:
    """The `mlfs` console script: main(), then leave without C++ static teardown.

    pyarrow 26 sometimes aborts a process at exit ("terminate called without
    an active exception": its I/O thread pool, used by pre-buffered Parquet
    reads, is destroyed while a thread is still joinable) — seen on this
    machine in about 1 of 5 short scripts that read a portion, under load.
    Everything of ours is finished and flushed by then, so end the process
    directly rather than let a library's destructor turn success into SIGABRT.
    """
    import logging

    try:
        code = main()
        logging.shutdown()
        sys.stdout.flush()
    except BrokenPipeError:  # `mlfs backends | head`: the reader is gone, as with ls
        os._exit(141)  # what a shell reports for a command ended by SIGPIPE
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)

