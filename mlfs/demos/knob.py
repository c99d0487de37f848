"""`mlfs demo`: the whole loop on the simulated subsystem, in a few minutes.

Mounts `sim.readahead` (embedded default configuration) on a temporary
directory with a temporary state directory, runs a LightGBM trainer worker
against it, shows one live progress line, and ends with a summary that scores
the run against the default, the best static value and an oracle on the very
same workload (the simulation replays from its seed).  Everything is removed
afterwards, also on Ctrl-C, except with `--keep DIR`: then DIR is the run's
state directory and stays, for `mlfs report DIR sim.readahead`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from mlfs.client import MountFailed, MountProcess, read_attr_or

SUBSYSTEM = "sim.readahead"
MODEL = "lgbm"


def _read(path: Path) -> str:
    return read_attr_or(path, "?")


def _tick(mountpoint: Path) -> str:
    for line in _read(mountpoint / "metrics").splitlines():
        if line.startswith("mlfs_tick{"):
            return line.rsplit(" ", 1)[1]
    return "?"


def _demo_config(seed: int) -> str | None:
    """None (the embedded default) unless the seed or the user's rights differ."""
    from mlfs.config import default_text

    text = default_text()
    changed = False
    if seed != 0:
        text = text.replace("seed = 0", f"seed = {seed}")
        changed = True
    if os.geteuid() != 0:  # allow_other needs root or user_allow_other in fuse.conf
        text = text.replace("allow_other = true", "allow_other = false")
        changed = True
    return text if changed else None


def start_daemon(daemon: MountProcess, workdir: Path) -> bool:
    """Start a demo's daemon; when it fails, say why (its output) and clean up."""
    try:
        daemon.start()
    except MountFailed as exc:
        print(exc.output, file=sys.stderr)
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        return False
    return True


def _keep_problem(keep: str) -> str | None:
    """Why `--keep DIR` cannot be the run's state directory (None: new or empty)."""
    try:
        if any(Path(keep).iterdir()):
            return "not empty (give a new or empty directory)"
    except FileNotFoundError:
        pass
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def _follow(mountpoint: Path, seconds: float, settle: float) -> list[tuple[str, str]]:
    """One live progress line a second until `seconds` pass or the model has been in
    recommendation mode for `settle` s; returns the mode changes (tick, mode)."""
    mode_changes: list[tuple[str, str]] = []
    started = time.monotonic()
    model = mountpoint / SUBSYSTEM / "models" / MODEL
    last_mode = None
    in_recommendation_since = None
    while time.monotonic() - started < seconds:
        time.sleep(1.0)
        mode = _read(model / "mode")
        if mode != last_mode:
            mode_changes.append((_tick(mountpoint), mode))
            last_mode = mode
        if mode == "recommendation":
            in_recommendation_since = in_recommendation_since or time.monotonic()
            if time.monotonic() - in_recommendation_since >= settle:
                break
        else:
            in_recommendation_since = None
        line = (f"\r  {time.monotonic() - started:5.0f} s  tick {_tick(mountpoint):>6}  "
                f"mode {mode:<15} efficiency {_read(model / 'efficiency'):>6}  "
                f"read_ahead_kb {_read(mountpoint / SUBSYSTEM / 'knobs/read_ahead_kb'):>5}")
        print(line, end="", flush=True)
    print()
    return mode_changes


def run_demo(seconds: float = 120.0, seed: int = 0, settle: float = 30.0,
             keep: str | None = None) -> int:
    from mlfs.trainers.knob.worker import run_worker

    problem = _keep_problem(keep) if keep is not None else None
    if problem:
        print(f"mlfs demo: --keep {keep}: {problem}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="mlfs-demo-"))
    mountpoint = workdir / "mnt"
    state_dir = Path(keep).resolve() if keep is not None else workdir / "state"
    mountpoint.mkdir()
    config_text = _demo_config(seed)
    config_path = None
    if config_text:
        config_path = workdir / "mlfs.toml"
        config_path.write_text(config_text)
    daemon = MountProcess(mountpoint, state_dir, config_path, timeout=None)
    print(f"mlfs demo: mounting {SUBSYSTEM} on {mountpoint}")
    if not start_daemon(daemon, workdir):
        return 1
    stop = threading.Event()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    worker_stats: dict = {}

    def worker() -> None:
        worker_stats.update(run_worker(str(mountpoint), SUBSYSTEM, MODEL, stop=stop) or {})

    thread = threading.Thread(target=worker, name="trainer", daemon=True)
    interrupted = False
    mode_changes: list[tuple[str, str]] = []
    try:
        thread.start()
        mode_changes = _follow(mountpoint, seconds, settle)
    except KeyboardInterrupt:
        interrupted = True
        print("\nmlfs demo: interrupted; cleaning up")
    finally:
        stop.set()
        thread.join(timeout=15)
        daemon.umount(timeout=None)  # then stop(): by its pid, only if still ours
    try:
        if not interrupted:
            _summary(state_dir, seed, mode_changes, worker_stats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if keep is not None:
        print(f"\nmlfs demo: the run is kept in {state_dir}; "
              f"mlfs report {state_dir} {SUBSYSTEM}")
    return 130 if interrupted else 0


def _summary(state_dir: Path, seed: int, mode_changes: list, worker_stats: dict) -> None:
    from mlfs.backends.sim_replay import Counterfactuals

    files = sorted((state_dir / SUBSYSTEM / "dataset").glob("*.parquet"))
    if not files:
        print("no dataset rows were sealed")
        return
    table = _concat(files)
    ticks = np.array(table.column("tick").to_pylist())
    applied = np.array(table.column("knob_read_ahead_kb").to_pylist())
    modes = np.array(table.column("mode").to_pylist())
    controller = np.array(table.column("controller").to_pylist())
    n = int(ticks.max()) + 1
    full = np.full(n, 128)
    full[ticks] = applied
    cf = Counterfactuals(seed, n, full)
    print("\nmode changes (tick: mode): "
          + ", ".join(f"{tick}: {mode}" for tick, mode in mode_changes))
    print(f"ticks {n}, ML-controlled {int((controller == 'ml').sum())}")
    rows = [("whole run", ticks)]
    rec = ticks[modes == "recommendation"]
    if len(rec):
        rows.append(("in recommendation mode", rec))
    print(f"\n{'window':<24} {'ticks':>6} {'mlfs MB/s':>10} {'default':>9} "
          f"{'best static':>17} {'oracle':>8} {'vs default':>10} {'vs static':>9} "
          f"{'of oracle':>9}")
    for label, window in rows:
        s = cf.score(window)
        r = s.ratios()
        print(f"{label:<24} {s.ticks:>6} {s.run:>10.1f} {s.default:>9.1f} "
              f"{s.best_static:>9.1f} ({s.best_static_kb:>4} KiB) {s.oracle:>8.1f} "
              f"{r['vs_default']:>10.3f} {r['vs_best_static']:>9.3f} {r['vs_oracle']:>9.3f}")
    print("\n(noise-free throughput of the simulated device on the same workload; "
          "'best static' is the single read_ahead_kb best in hindsight over the window)")


def _concat(files: list[Path]):
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(f) for f in files])
