"""`mlfs demo --predict`: a drive-failure predictor climbing from learning to recommendation.

Mounts `sim.disks` (a simulated population of drives, docs/predictors.md) on a temporary
directory, runs the predictor trainer against it (`mlfs train`: it labels drive-days
with what happened next, fits a calibrated LightGBM classifier and uploads it as the
model's policy), and prints one line per mode change and a progress line, then the
model's first alert that came before a failure, and the proxy's side-by-side score of
the model and SMART's threshold trip on the same drive-days.  Everything is removed
afterwards, also on Ctrl-C.
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

from mlfs.client import EventStream, MountProcess, read_attr_or
from mlfs.demos.knob import _keep_problem, start_daemon

SUBSYSTEM = "sim.disks"
MODEL = "lgbm"
CONFIG = """
[mount]
allow_other = {allow_other}

[store]
seal_seconds = 2.0
feedback_seal_seconds = 2.0

[[subsystem]]
backend = "sim.disks"
seed = {seed}
drives = 2000
tick_seconds = 0.02
"""


def run_predict_demo(seconds: float = 120.0, seed: int = 0, keep: str | None = None) -> int:
    """The predictor demo; `keep`: a new or empty directory to keep the state in."""
    from mlfs.trainers.predictor.worker import run_predictor

    problem = _keep_problem(keep) if keep is not None else None
    if problem:
        print(f"mlfs demo: --keep {keep}: {problem}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="mlfs-predict-demo-"))
    mountpoint = workdir / "mnt"
    state_dir = Path(keep).resolve() if keep is not None else workdir / "state"
    mountpoint.mkdir()
    config = workdir / "mlfs.toml"
    config.write_text(CONFIG.format(seed=seed,
                                    allow_other="true" if os.geteuid() == 0 else "false"))
    daemon = MountProcess(mountpoint, state_dir, config, timeout=None)
    print(f"mlfs demo --predict: mounting {SUBSYSTEM} (2,000 simulated drives, a day per "
          f"tick) on {mountpoint}")
    if not start_daemon(daemon, workdir):
        return 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    stats: dict = {}

    def train() -> None:
        stats.update(run_predictor(str(mountpoint), SUBSYSTEM, MODEL, stop=stop,
                                   max_seconds=seconds, seed=seed, refit_seconds=10.0))

    worker = threading.Thread(target=train, name="predictor-trainer", daemon=True)
    model = mountpoint / SUBSYSTEM / "models" / MODEL
    events = EventStream(mountpoint / SUBSYSTEM / "events")
    try:
        worker.start()
        started = time.monotonic()
        print(f"  {0.0:6.1f} s  mode learning        (a new model)")
        while worker.is_alive():
            for event in events.read():
                if event.get("event") == "mode" and event.get("model") == MODEL:
                    efficiency = read_attr_or(model / "efficiency", "?").strip()
                    print(f"  {time.monotonic() - started:6.1f} s  mode {event['to']:<15} "
                          f"efficiency {efficiency}  ({event.get('why', '')})")
            worker.join(1.0)
        _summary(mountpoint, model, stats)
    except KeyboardInterrupt:
        print("\nmlfs demo --predict: interrupted; cleaning up", file=sys.stderr)
        stop.set()
        worker.join(30)
    finally:
        events.close()
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if keep is not None:
        print(f"\nmlfs demo: the run is kept in {state_dir}; mlfs report {state_dir} "
              f"{SUBSYSTEM}")
    return 0


def _summary(mountpoint: Path, model: Path, stats: dict) -> None:
    import pyarrow.dataset as ds

    from mlfs.client import write_line

    write_line(mountpoint / SUBSYSTEM / "control", "prepare_dataset")
    time.sleep(2.5)  # the feedback store seals on its own 2 s interval
    rows = []
    if any((model / "feedback").glob("*.parquet")):
        rows = ds.dataset(str(model / "feedback"), format="parquet").to_table().to_pylist()
    caught = [r for r in rows if r["outcome"] == 1 and r["model_alert"]]
    print(f"\n  fits {stats.get('fits', 0)}, policies uploaded {stats.get('policies', 0)}, "
          f"final mode {stats.get('mode', '?').strip()}, efficiency (SMART threshold's cost "
          f"over the model's) {stats.get('efficiency', '?').strip()}")
    if caught:
        first = min(caught, key=lambda r: r["tick"])
        print(f"  first model alert before a failure: drive {first['key']} at day "
              f"{first['tick']}, p={first['p']:.2f}")
    model_hits = len({(r["key"]) for r in rows if r["outcome"] == 1 and r["model_alert"]})
    rule_hits = len({(r["key"]) for r in rows if r["outcome"] == 1 and r["rule_alert"]})
    failed = len({r["key"] for r in rows if r["outcome"] == 1})
    print(f"  failing drives judged: {failed}; warned by the model: {model_hits}, by "
          f"SMART's threshold trip: {rule_hits}")
    alerts = read_attr_or(model / "alerts", "").splitlines()
    print(f"  alerts raised: {len(alerts)} (the rule's while learning, the model's once "
          "trusted); the last:")
    for line in alerts[-3:]:
        print(f"    {line}")
