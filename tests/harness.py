"""What the tests share: a real mlfs daemon (`Mount`), configurations, and helpers.

Plain functions and classes, imported by test modules and by the experiment
harnesses in tests/bench/ (`from tests.harness import Mount, wait_for`).  The
pytest fixtures built on them live in conftest files: the mount fixtures in
tests/mount/conftest.py, the loop device in tests/conftest.py.  Every daemon a
helper starts is ended by its PID, and every mount is unmounted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest

from mlfs import client
from mlfs.abi import candidate_values
from mlfs.client import MountProcess, write_errno  # noqa: F401  (write_errno: for the tests)

if TYPE_CHECKING:
    from mlfs.trainers.knob.learner import KnobLearner

REPO = Path(__file__).resolve().parent.parent

#: the mount and store of every test daemon: others may read it, and portions seal
#: each second; a trainer's silence is never long enough to matter
FAST_MOUNT = """
[mount]
allow_other = true

[store]
seal_rows = 4096
seal_seconds = 1.0
feedback_seal_seconds = 1.0
journal_seal_seconds = 1.0

[modes]
silence_seconds = 600.0
"""

FAST_CONFIG = FAST_MOUNT + """
[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 1
tick_seconds = 0.02
"""


def fuse_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mount tests need root (allow_other, default_permissions, setpriv)"
    if not os.path.exists("/dev/fuse"):
        return "mount tests need /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "mount tests need fusermount3 (Debian package fuse3)"
    return None


def sim_disks_config(seed: int, drives: int) -> str:
    """A test daemon serving sim.disks: `drives` drives, a day each 0.02 s."""
    return FAST_MOUNT + f"""
[[subsystem]]
backend = "sim.disks"
seed = {seed}
drives = {drives}
tick_seconds = 0.02
"""


def fleet_push_once(mount, store: Path, timeout: float = 120.0) -> None:
    """`mlfs fleet push MOUNT --store STORE --once` for a test host (it must succeed)."""
    done = subprocess.run(
        mlfs_command("fleet", "push", str(mount.mountpoint), "--store", str(store),
                     "--state-dir", str(mount.state_dir), "--once"),
        capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr


def new_mount_root() -> Path:
    """A 0755 directory under /tmp (so `nobody` can traverse it) for a test's mounts;
    skips the test, saying why, where FUSE mounts cannot run."""
    import tempfile

    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mlfs-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    return root


def mlfs_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlfs", *args]


class Mount(MountProcess):
    """One daemon for a test: `MountProcess` (start, ready, stop by PID with the reuse
    guard) on `root/name`, with the configuration written to `root/name.toml`."""

    def __init__(self, root: Path, config: str = FAST_CONFIG, name: str = "mnt") -> None:
        self.root = root
        mountpoint = root / name
        mountpoint.mkdir(exist_ok=True)
        config_path = root / (name + ".toml")
        config_path.write_text(config)
        super().__init__(mountpoint, root / (name + "-state"), config_path, cwd=REPO,
                         timeout=60)

    @property
    def sub(self) -> Path:
        return self.mountpoint / "sim.readahead"

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """End the daemon by its pid (SIGKILL: a crash) and wait until it is gone."""
        self.stop(sig, timeout)


#: how long a condition may take before the test calls it broken: generous, because a
#: timeout must say "broken", never "slow" (CI's machines differ ~3x in speed by day, and
#: a loaded one took over 20 s to seal a traced device's first row)
BROKEN_AFTER = 60.0


def wait_for(predicate, timeout: float = BROKEN_AFTER, interval: float = 0.05, what: str = ""):
    """Poll until `predicate()` is truthy; fail the test with `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


def metric(m: Mount, name: str) -> float:
    """One unlabelled metric of MOUNT/metrics (AssertionError when it is missing)."""
    for line in (m.mountpoint / "metrics").read_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def wait_blocked(m: Mount, readers: int, timeout: float = 20.0) -> None:
    """Wait until `readers` reads of events files are parked in read(2), as the mount
    counts them (mlfs_event_reads_blocked): the observable end of "let it block"."""
    wait_for(lambda: metric(m, "mlfs_event_reads_blocked") >= readers, timeout=timeout,
             what=f"{readers} reader(s) blocked in read(2)")


def sh(script: str, timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
    """Run a bash script the way a user would."""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def unmount_everything_under(root: Path) -> None:
    """Lazily unmount every mount below `root`, stale ones included.

    Taken from /proc/self/mountinfo, not os.path.ismount: a mount whose daemon
    was killed together with its auto_unmount helper answers ENOTCONN, which
    ismount reports as "not a mount", and it would outlive the test.
    """
    prefix = str(root) + "/"
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4].encode().decode("unicode_escape") for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
        subprocess.run(["umount", "-l", point], capture_output=True)  # a tmpfs a test made


#: like FAST_CONFIG, but nothing is sealed unless asked (prepare_dataset) and no
#: event is sent unless a test causes one: a quiet stream for blocking readers
QUIET_CONFIG = FAST_CONFIG.replace("seal_seconds = 1.0", "seal_seconds = 3600.0").replace(
    "feedback_seal_seconds = 1.0", "feedback_seal_seconds = 3600.0").replace(
    "journal_seal_seconds = 1.0", "journal_seal_seconds = 3600.0")


def two_subsystems(config: str = FAST_CONFIG) -> str:
    """`config` serving two simulated subsystems, `sim.a` and `sim.b` (seeds 1 and 2)."""
    return config.replace('name = "sim.readahead"', 'name = "sim.a"') + """
[[subsystem]]
backend = "sim.readahead"
name = "sim.b"
seed = 2
tick_seconds = 0.02
"""


def new_model(sub: Path, name: str, start: bool = True) -> Path:
    """mkdir models/<name> (and `echo start > control`); returns its directory."""
    model = sub / "models" / name
    model.mkdir()
    if start:
        assert write_errno(model / "control", b"start\n") == 0
    return model


@contextlib.contextmanager
def exploring_mounts(root: Path, seeds: tuple[int, ...], portions: int = 8):
    """Mounts of sim.readahead (one per seed, named h<seed>), each with a model pinned to
    collaboration (half the ticks follow its recommendations) trying the read_ahead_kb
    settings in turn, until every mount sealed `portions` dataset portions: the rows of a
    fleet of hosts that explored.  Yields the running mounts; ends them (SIGTERM) on exit."""
    mounts = [Mount(root, config=FAST_CONFIG.replace("seed = 1", f"seed = {s}"), name=f"h{s}")
              for s in seeds]
    try:
        models = []
        for m in mounts:
            m.start()
            models.append(new_model(m.sub, "explore"))
            (models[-1] / "mode").write_text("collaboration\n")
        settings = [0, 16, 64, 128, 512, 1024, 2048, 4096]
        step = 0
        while min(len(list((m.sub / "dataset").glob("*.parquet"))) for m in mounts) < portions:
            for model in models:
                (model / "recommend").write_text(
                    f"read_ahead_kb={settings[step % len(settings)]}\n")
            step += 1
            time.sleep(0.1)
        yield mounts
    finally:
        for m in mounts:
            m.kill(signal.SIGTERM)


def read_rows(directory: Path) -> list[dict]:
    """Every row of every portion in `directory` (a Parquet dataset), in portion order."""
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for portion in sorted(directory.glob("*.parquet")):
        rows += pq.read_table(portion).to_pylist()
    return rows


class Models:
    """Models a test makes on a shared mount; all removed (rmdir) at teardown."""

    def __init__(self, sub: Path) -> None:
        self.sub = sub
        self.made: list[Path] = []

    def __call__(self, name: str, start: bool = True) -> Path:
        path = new_model(self.sub, name, start)
        self.made.append(path)
        return path

    def cleanup(self) -> None:
        for path in self.made:
            try:
                os.rmdir(path)
            except OSError:
                pass


class EventStream(client.EventStream):
    """The client's `events` reader, strict for tests: every event is kept in `seen`,
    a line that is not a JSON object fails the test, and so does a `wait_for` timeout."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path)
        self.seen: list[dict] = []

    def read(self, timeout: float = 0.0) -> list[dict]:
        events = super().read(timeout)
        if self.bad_lines:
            pytest.fail(f"{self.path}: {self.bad_lines} line(s) that are not a JSON object")
        self.seen += events
        return events

    def wait_for(self, predicate, timeout: float = BROKEN_AFTER, what: str = "") -> dict:
        """The next event for which predicate(event) is true (earlier ones are skipped)."""
        event = super().wait_for(predicate, timeout)
        if event is None:
            pytest.fail(f"no event {what or predicate} within {timeout:g} s; "
                        f"last seen: {self.seen[-3:]}")
        return event




# ---- a linux.block subsystem on a loop device (the safety tests) ----------------------
BLOCK_CONFIG = """
[store]
seal_seconds = 1.0

[modes]
silence_seconds = 600.0

[[subsystem]]
backend = "linux.block"
devices = ["{device}"]
tick_seconds = 0.1
measure_seconds = 0.05
{apply}
"""

APPLY = "apply = {read_ahead_kb = [16, 4096]}"


def read_ahead(device: str) -> str:
    return Path(f"/sys/block/{device}/queue/read_ahead_kb").read_text().strip()


def ledger(m: Mount) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((m.state_dir / "ledger").glob("*.json"))]


def recommend(m: Mount, device: str, value: int) -> Path:
    """A started model pinned in recommendation mode that recommends `value`."""
    sub = m.mountpoint / f"linux.block.{device}"
    info = json.loads((sub / "info").read_text())
    assert info["knobs"]["read_ahead_kb"]["min"] == 16
    assert info["knobs"]["read_ahead_kb"]["max"] == 4096
    model = sub / "models" / "m"
    done = sh(f"mkdir {model} && echo start > {model}/control && "
              f"echo recommendation > {model}/mode && "
              f"echo read_ahead_kb={value} > {model}/recommend")
    assert done.returncode == 0, done.stderr
    return model


# ---- a small file system to fill (the storage-fault tests) -------------------------------
@contextlib.contextmanager
def tmpfs(directory: Path, size: str):
    """A tmpfs of `size` at `directory`; unmounted after (the mlfs mount goes first)."""
    directory.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill(directory: Path) -> Path:
    """Write a file until the file system is full (ENOSPC)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as fh:
        block = b"\0" * 65536
        try:
            while True:
                fh.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:  # the last pages, byte by byte-ish
                fh.write(b"\0" * 512)
        except OSError:
            pass
    return filler


# ---- a synthetic subsystem (the trainer and verifier tests, no mount) ----------------------
# Workload phases told apart by their features, each with its own best read_ahead_kb;
# the throughput of a tick falls off with the log2-distance of the knob from the
# phase's best.  The default algorithm keeps the stock 128, and 10% of ticks try a
# grid value, as in learning mode.
INFO = {
    "backend": "synthetic",
    "description": "test subsystem",
    "tick_seconds": 0.05,
    "objective": {"name": "throughput", "unit": "MB/s", "goal": "max"},
    "knobs": {"read_ahead_kb": {"type": "int", "min": 0, "max": 4096, "default": 128}},
    "features": {
        "seq_ratio": "float64",
        "mmap_ratio": "float64",
        "avg_request_kb": "float64",
        "queue_depth": "int64",
        "noise": "float64",
    },
}
FEATURES = list(INFO["features"])
COLUMNS = FEATURES + ["knob_read_ahead_kb"]

# phase -> (typical features, best knob, peak objective)
PHASES = {
    "sequential": ({"seq_ratio": 0.95, "mmap_ratio": 0.05, "avg_request_kb": 256.0,
                    "queue_depth": 4, "noise": 0.0}, 1024, 400.0),
    "random": ({"seq_ratio": 0.05, "mmap_ratio": 0.05, "avg_request_kb": 4.0,
                "queue_depth": 32, "noise": 0.0}, 8, 60.0),
    "strided": ({"seq_ratio": 0.5, "mmap_ratio": 0.6, "avg_request_kb": 64.0,
                 "queue_depth": 8, "noise": 0.0}, 256, 150.0),
}
GRID = candidate_values(INFO["knobs"]["read_ahead_kb"])


def true_objective(phase: str, knob: float, goal: str = "max") -> float:
    _, best, peak = PHASES[phase]
    distance = math.log2(1 + knob) - math.log2(1 + best)
    value = peak * math.exp(-distance**2 / (2 * 1.5**2))
    return value if goal == "max" else 1000.0 / (1.0 + value)  # latency-like for "min"


def phase_features(phase: str, rng: np.random.Generator) -> dict:
    typical = PHASES[phase][0]
    return {
        "seq_ratio": float(np.clip(typical["seq_ratio"] + rng.normal(0, 0.03), 0, 1)),
        "mmap_ratio": float(np.clip(typical["mmap_ratio"] + rng.normal(0, 0.03), 0, 1)),
        "avg_request_kb": float(typical["avg_request_kb"] * rng.lognormal(0, 0.1)),
        "queue_depth": int(typical["queue_depth"] + rng.integers(-1, 2)),
        "noise": float(rng.normal()),
    }


def make_dataset(n: int, seed: int = 1, start_tick: int = 0, goal: str = "max",
                 explore_share: float = 0.1, phase_len: int = 60) -> pa.Table:
    """Rows in the dataset schema: a phase runs for `phase_len` ticks at a time."""
    rng = np.random.default_rng(seed)
    names = list(PHASES)
    rows: dict[str, list] = {c: [] for c in ["ts", "tick", "controller", "model", "mode",
                                             *COLUMNS, "objective"]}
    phase = names[0]
    t0 = 1_700_000_000_000_000
    for i in range(n):
        if i % phase_len == 0:
            phase = names[int(rng.integers(len(names)))]
        ml = rng.random() < explore_share
        knob = int(rng.choice(GRID)) if ml else 128
        feats = phase_features(phase, rng)
        objective = true_objective(phase, knob, goal) * rng.lognormal(0, 0.05)
        tick = start_tick + i
        rows["ts"].append(t0 + tick * 50_000)
        rows["tick"].append(tick)
        rows["controller"].append("ml" if ml else "default")
        rows["model"].append("lgbm" if ml else None)
        rows["mode"].append("learning")
        rows["knob_read_ahead_kb"].append(knob)
        for name in FEATURES:
            rows[name].append(feats[name])
        rows["objective"].append(objective)
    schema = pa.schema(
        [("ts", pa.timestamp("us", tz="UTC")), ("tick", pa.int64()),
         ("controller", pa.string()), ("model", pa.string()), ("mode", pa.string()),
         ("knob_read_ahead_kb", pa.int64())]
        + [(f, pa.int64() if INFO["features"][f] == "int64" else pa.float64())
           for f in FEATURES]
        + [("objective", pa.float64())]
    )
    return pa.table(rows, schema=schema)


def make_feedback(learner: KnobLearner, n: int, seed: int, bias: float) -> pa.Table:
    """Feedback rows of policy ticks in a world where throughput is `bias` times higher."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {c: [] for c in ["tick", "model", "source", "recommendation_id",
                                             *COLUMNS, "expected", "observed", "baseline",
                                             "efficiency", "error"]}
    names = list(PHASES)
    for i in range(n):
        phase = names[i % len(names)]
        feats = phase_features(phase, rng)
        knobs, expected = learner.recommend(feats)
        knob = knobs["read_ahead_kb"]
        observed = bias * true_objective(phase, knob) * rng.lognormal(0, 0.02)
        baseline = true_objective(phase, 128)
        rows["tick"].append(100_000 + i)
        rows["model"].append("lgbm")
        rows["source"].append("policy")
        rows["recommendation_id"].append(None)
        rows["knob_read_ahead_kb"].append(knob)
        for name in FEATURES:
            rows[name].append(feats[name])
        rows["expected"].append(expected)
        rows["observed"].append(observed)
        rows["baseline"].append(baseline)
        rows["efficiency"].append(observed / baseline)
        rows["error"].append(observed - expected)
    return pa.table(rows)


# ---- LightGBM model text ---------------------------------------------------------------
def fix_sizes(text: str) -> str:
    """Recompute tree_sizes the way LightGBM writes them (bytes from Tree= to Tree=)."""
    starts = [m.start() for m in re.finditer(r"^Tree=\d+$", text, re.M)]
    end = text.find("\nend of trees") + 1
    sizes = [b - a for a, b in zip(starts, starts[1:] + [end], strict=True)]
    return re.sub(r"^tree_sizes=.*$", "tree_sizes=" + " ".join(map(str, sizes)), text,
                  count=1, flags=re.M)
