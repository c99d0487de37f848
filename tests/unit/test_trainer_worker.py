"""The trainer worker against a fake mount made of plain files and FIFOs.

No FUSE here: `FakeMount` lays out the mount's tree in a temporary directory
(`events`, `control` and `recommend` are FIFOs, so every write(2) arrives
whole, as on the mount) and a thread plays the daemon: it ticks the synthetic
subsystem of test_trainer_learner, seals dataset and feedback portions with
their events, accepts recommendations and runs the uploaded policy the way the
proxy does.  The tests then break things under the worker (rmdir of the
proxy, the whole mount vanishing and coming back, a malformed portion) and
check it carries on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlfs.trainers.knob.worker import run_worker

from mlfs.base.errors import Refused
from mlfs.base.verifier import verify
from tests.harness import (
    COLUMNS,
    GRID,
    INFO,
    PHASES,
    make_dataset,
    phase_features,
    true_objective,
)

SUB = "sim.test"
#: how long a wait may last before the test calls the worker (or the fake daemon) broken:
#: never a measure of speed (a knob fit took seconds beside two busy loops at load 14)
BROKEN_SECONDS = 120.0


class FakeMount:
    """A directory tree shaped like MOUNT/, driven by a daemon-like thread."""

    def __init__(self, root: Path, tick_seconds: float = 0.005) -> None:
        self.root = root
        self.sub = root / SUB
        self.tick_seconds = tick_seconds
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.tick = 0
        self.portion = 0
        self.feedback_no = 0
        self.rows: list[dict] = []
        self.models: dict[str, dict] = {}
        self.credit = 0.0
        self.rng = np.random.default_rng(3)
        self.phase = "sequential"
        self.last_features = phase_features(self.phase, self.rng)
        self.events_fd: int | None = None
        self.accepted: list[str] = []
        self.policies = 0
        self.cut_short: list[tuple[int, int]] = []
        self.online = False
        self.error: BaseException | None = None
        self.build()

    # ---- the tree ---------------------------------------------------------
    def build(self) -> None:
        self.sub.mkdir(parents=True)
        (self.sub / "dataset").mkdir()
        (self.sub / "models").mkdir()
        info = dict(INFO, tick_seconds=self.tick_seconds)
        (self.sub / "info").write_text(json.dumps(info) + "\n")
        os.mkfifo(self.sub / "events")
        self.go_online()

    def go_online(self) -> None:
        self.events_fd = os.open(self.sub / "events", os.O_RDWR | os.O_NONBLOCK)
        self.online = True

    def go_offline(self) -> Path:
        """The mount vanishes: readers see end of file, the path is gone."""
        self.online = False
        with self.lock:
            for model in self.models.values():
                for fd in model["fds"].values():
                    os.close(fd)
            self.models.clear()
            os.close(self.events_fd)
            self.events_fd = None
        away = self.root.parent / (self.root.name + "-away")
        os.rename(self.root, away)
        self.root.mkdir()  # the mount point is a plain directory for a while
        return away

    def come_back(self, away: Path) -> None:
        self.root.rmdir()
        os.rename(away, self.root)
        self.go_online()

    def publish(self, event: str, **fields: object) -> None:
        if self.events_fd is None:
            return
        line = json.dumps({"seq": 0, "subsystem": SUB, "event": event, **fields}) + "\n"
        with contextlib.suppress(BlockingIOError):  # a full queue: the reader lost it
            os.write(self.events_fd, line.encode())

    def adopt(self, name: str) -> None:
        """What mkdir models/<name> does on the mount: the attributes appear."""
        d = self.sub / "models" / name
        for fifo in ("control", "recommend"):
            if not (d / fifo).exists():
                os.mkfifo(d / fifo)
        fds = {f: os.open(d / f, os.O_RDONLY | os.O_NONBLOCK) for f in ("control", "recommend")}
        (d / "feedback").mkdir(exist_ok=True)
        for attr, text in (("mode", "learning\n"), ("knobs", "read_ahead_kb\n"),
                           ("efficiency", "nan\n"), ("errors", ""), ("policy", "")):
            if not (d / attr).exists():
                (d / attr).write_text(text)
        state = "initialized"
        if (d / "state").exists():  # a proxy that outlived a daemon restart
            state = (d / "state").read_text().strip()
        (d / "state").write_text(state + "\n")
        self.models[name] = {"dir": d, "fds": fds, "state": state, "rec": None,
                             "policy": None, "policy_mtime": 0.0, "feedback": [],
                             "buf": {"control": b"", "recommend": b""}}

    # ---- the daemon -------------------------------------------------------
    def lines(self, model: dict, name: str) -> list[str]:
        try:
            data = os.read(model["fds"][name], 65536)
        except BlockingIOError:
            return []
        model["buf"][name] += data
        *whole, model["buf"][name] = model["buf"][name].split(b"\n")
        return [w.decode() for w in whole if w.strip()]

    def serve(self, name: str, model: dict) -> bool:
        """Control, recommend and policy inputs of one model; False if it was removed."""
        if not model["dir"].is_dir():
            for fd in model["fds"].values():
                os.close(fd)
            return False
        for line in self.lines(model, "control"):
            if line == "start" and model["state"] not in ("started", "running"):
                model["state"] = "started"
                (model["dir"] / "state").write_text("started\n")
                self.publish("state", model=name, **{"from": "initialized", "to": "started"})
            elif line == "prepare_dataset":
                self.seal()
        for line in self.lines(model, "recommend"):
            pairs = dict(part.split("=", 1) for part in line.split())
            assert set(pairs) <= {"read_ahead_kb", "expect", "ttl"}, line
            value = int(pairs["read_ahead_kb"])
            assert 0 <= value <= 4096
            self.accepted.append(line)
            ttl = int(pairs.get("ttl", 10**9))
            model["rec"] = (value, self.tick + ttl,
                            float(pairs["expect"]) if "expect" in pairs else None, ttl)
        policy = model["dir"] / "policy"
        mtime = policy.stat().st_mtime
        if mtime != model["policy_mtime"] and policy.stat().st_size:
            text = policy.read_text()
            try:
                # the real mount verifies before LightGBM sees a byte; so must this
                # stand-in: a half-written policy can make LightGBM abort the process
                verify(text)
                booster = lgb.Booster(model_str=text)
            except (Refused, lgb.basic.LightGBMError):
                return True  # caught half-written: the mount sees it whole on close
            model["policy_mtime"] = mtime
            assert booster.feature_name() == COLUMNS
            model["policy"] = booster
            rec = model["rec"]
            if rec is not None and self.tick < rec[1]:
                # a recommendation still running, superseded: its ticks run, of its ttl
                self.cut_short.append((rec[3] - (rec[1] - self.tick), rec[3]))
            model["rec"] = None  # a newer policy wins over an older recommendation
            self.policies += 1
        return True

    def decide(self, model: dict) -> tuple[int, float | None, str] | None:
        rec = model["rec"]
        if rec is not None and self.tick < rec[1]:
            return rec[0], rec[2], "recommendation"
        if model["policy"] is not None:
            names = model["policy"].feature_name()
            matrix = np.zeros((len(GRID), len(names)))
            for j, column in enumerate(names):
                matrix[:, j] = GRID if column == "knob_read_ahead_kb" else \
                    self.last_features[column]
            pred = model["policy"].predict(matrix)
            best = int(np.argmax(pred))
            return GRID[best], float(pred[best]), "policy"
        return None

    def step(self) -> None:
        with self.lock:
            if not self.online:
                return
            for name in list(self.models):
                if not self.serve(name, self.models[name]):
                    del self.models[name]
            for d in (self.sub / "models").iterdir():
                if d.name not in self.models and d.is_dir():
                    self.adopt(d.name)
            if self.tick % 60 == 0:
                self.phase = list(PHASES)[int(self.rng.integers(len(PHASES)))]
            knob, decision, owner = 128, None, None
            self.credit += 0.25
            if self.credit >= 1:
                self.credit -= 1
                for name, model in self.models.items():
                    if model["state"] in ("started", "running"):
                        decision = self.decide(model)
                        if decision is not None:
                            owner = name
                            knob = decision[0]
                            break
            objective = true_objective(self.phase, knob) * self.rng.lognormal(0, 0.03)
            features = phase_features(self.phase, self.rng)
            self.rows.append({"ts": 1_700_000_000_000_000 + self.tick * 1000,
                              "tick": self.tick, "controller": "ml" if owner else "default",
                              "model": owner, "mode": "learning", "knob_read_ahead_kb": knob,
                              **features, "objective": objective})
            if owner:
                expected = decision[1]
                self.models[owner]["feedback"].append({
                    "tick": self.tick, "model": owner, "source": decision[2],
                    "recommendation_id": None, "knob_read_ahead_kb": knob,
                    **self.last_features, "expected": expected, "observed": objective,
                    "baseline": None, "efficiency": None,
                    "error": None if expected is None else objective - expected})
            self.last_features = features
            self.tick += 1
            if len(self.rows) >= 150:
                self.seal()
            if self.tick % 40 == 0:
                self.seal_feedback()

    def seal(self) -> None:
        if not self.rows:
            return
        self.portion += 1
        name = f"{self.portion:010d}.parquet"
        tmp = self.root.parent / f".{self.root.name}-{name}"
        pq.write_table(pa.Table.from_pylist(self.rows), tmp)
        os.rename(tmp, self.sub / "dataset" / name)
        self.publish("portion", path=f"{SUB}/dataset/{name}", rows=len(self.rows))
        self.rows = []

    def seal_feedback(self) -> None:
        for name, model in self.models.items():
            if not model["feedback"]:
                continue
            self.feedback_no += 1
            file = f"{self.feedback_no:010d}.parquet"
            tmp = self.root.parent / f".{self.root.name}-fb-{file}"
            pq.write_table(pa.Table.from_pylist(model["feedback"]), tmp)
            os.rename(tmp, model["dir"] / "feedback" / file)
            self.publish("feedback", model=name, path=f"{SUB}/models/{name}/feedback/{file}",
                         rows=len(model["feedback"]))
            model["feedback"] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                time.sleep(self.tick_seconds)
        except BaseException as exc:  # surfaced by the fixture
            self.error = exc
            raise

    def write_history(self, rows: int) -> None:
        """Portions sealed before the trainer started (with exploration in them)."""
        table = make_dataset(rows, seed=8, explore_share=0.25)
        for start in range(0, rows, 1000):
            self.portion += 1
            pq.write_table(table.slice(start, 1000),
                           self.sub / "dataset" / f"{self.portion:010d}.parquet")
        self.tick = rows + 5  # a gap, as after a restart


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    from mlfs.trainers.knob import worker as worker_module

    # the daemon's timings, scaled down with the fake's 5 ms ticks
    monkeypatch.setattr(worker_module, "POLICY_MIN_SECONDS", 0.5)
    monkeypatch.setattr(worker_module, "START_RETRY_SECONDS", 0.5)
    mount = FakeMount(tmp_path / "mnt")
    mount.write_history(3000)
    thread = threading.Thread(target=mount.run, daemon=True)
    thread.start()
    yield mount
    mount.stop.set()
    thread.join(BROKEN_SECONDS)
    assert mount.error is None, f"the fake daemon failed: {mount.error!r}"
    shutil.rmtree(tmp_path / "mnt-away", ignore_errors=True)


def start_worker(fake: FakeMount, **kwargs) -> tuple[threading.Thread, threading.Event, dict]:
    stop = threading.Event()
    result: dict = {}

    def target() -> None:
        result.update(run_worker(str(fake.root), SUB, "lgbm", stop=stop,
                                 log=logging.getLogger("test.train"), **kwargs))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, stop, result


class Seen(logging.Handler):
    """The worker's log lines, as its operator would read them."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_worker_trains_uploads_explores_and_corrects(fake: FakeMount) -> None:
    seen = Seen()
    logging.getLogger("test.train").addHandler(seen)
    thread, stop, result = start_worker(fake)
    try:
        model_dir = fake.sub / "models" / "lgbm"
        wait_for(lambda: (model_dir / "state").exists()
                 and (model_dir / "state").read_text() == "started\n",
                 BROKEN_SECONDS, "proxy started")
        wait_for(lambda: fake.policies >= 1, BROKEN_SECONDS, "a policy upload")
        wait_for(lambda: len(fake.accepted) >= 3, BROKEN_SECONDS, "exploration recommendations")
        for line in fake.accepted:
            pairs = dict(p.split("=") for p in line.split())
            assert pairs["ttl"] == "10" and math.isfinite(float(pairs.get("expect", "0")))
            assert int(pairs["read_ahead_kb"]) != 128
        (fake.sub / "dataset" / "9999999999.parquet").write_bytes(b"PAR1 not really")
        fake.publish("portion", path=f"{SUB}/dataset/9999999999.parquet", rows=1)
        wait_for(lambda: list((model_dir / "feedback").iterdir()), BROKEN_SECONDS, "feedback")
        wait_for(lambda: any("skipping malformed portion" in m for m in seen.messages),
                 BROKEN_SECONDS,
                 "the malformed portion skipped, the worker going on")
    finally:
        stop.set()
        thread.join(BROKEN_SECONDS)
    logging.getLogger("test.train").removeHandler(seen)
    assert not thread.is_alive(), "the worker did not stop after stop.set()"
    assert result["fits"] >= 1 and result["policies"] >= 1
    assert result["skipped_portions"] >= 1
    assert result["feedback_portions"] >= 1
    assert result["rows"] > 2900


def test_a_policy_upload_waits_for_the_exploration_in_flight(tmp_path, monkeypatch) -> None:
    """A newer policy wins over an older recommendation, so an upload during an
    exploration ends it after the ticks it has run: in bench-results/dirty-win-16 six
    explorations of ten ticks ran one or two (the 1 % ratio in checkpoint among them)
    and the policy ran the rest.  Here the fake ticks at the info's own 50 ms, every
    decision explores, and feedback every 40 ticks brings corrections and uploads."""
    from mlfs.trainers import schedule as schedule_module
    from mlfs.trainers.knob import worker as worker_module

    monkeypatch.setattr(worker_module, "POLICY_MIN_SECONDS", 0.2)
    monkeypatch.setattr(schedule_module.TrainerSchedule, "exploration_rate", lambda self: 1.0)
    mount = FakeMount(tmp_path / "mnt", tick_seconds=0.05)
    mount.write_history(3000)
    daemon = threading.Thread(target=mount.run, daemon=True)
    daemon.start()
    thread, stop, result = start_worker(mount)
    try:
        wait_for(lambda: mount.policies >= 3 and len(mount.accepted) >= 16, BROKEN_SECONDS,
                 "policies and explorations")
    finally:
        stop.set()
        thread.join(BROKEN_SECONDS)
        mount.stop.set()
        daemon.join(BROKEN_SECONDS)
    assert mount.error is None, f"the fake daemon failed: {mount.error!r}"
    # (ran, ttl) of each exploration a policy upload superseded.  The fake reads a
    # pass's recommendations before its policy, so an upload just before the next
    # exploration reads as ran 0 (the mount installs the policy first); and the
    # trainer paces itself by the wall clock, which the fake's ticks lag a little on
    # a loaded machine, so an upload may take an exploration's last ticks
    cut = [(ran, ttl) for ran, ttl in mount.cut_short if 0 < ran < ttl - 3]
    assert not cut, f"explorations cut short by a policy upload (ticks run, ttl): {cut}"


def test_worker_survives_rmdir_and_the_mount_going_away(fake: FakeMount) -> None:
    seen = Seen()
    logging.getLogger("test.train").addHandler(seen)
    thread, stop, result = start_worker(fake)
    try:
        model_dir = fake.sub / "models" / "lgbm"
        wait_for(lambda: fake.policies >= 1, BROKEN_SECONDS, "a policy upload")
        # rmdir models/lgbm: the proxy is destroyed under the worker
        with fake.lock:  # as the daemon's rmdir does: the directory and the proxy go at once
            shutil.rmtree(model_dir)
            fake.models.pop("lgbm", None)  # else a worker's quick mkdir is served as the old
            # model, whose feedback directory is gone (FileNotFoundError in the fake daemon)
        fake.publish("state", model="lgbm", **{"from": "started", "to": "stopped"})
        wait_for(lambda: "lgbm" in fake.models
                 and fake.models["lgbm"]["state"] == "started", BROKEN_SECONDS, "proxy re-created")
        policies = fake.policies
        wait_for(lambda: fake.policies > policies, BROKEN_SECONDS, "policy re-uploaded")
        # the daemon dies: end of file on events, the mount point a plain directory
        before = len(seen.messages)  # the rmdir above can log "waiting for" too (CI at
        # d3fdff0): only lines after the mount went away say the worker noticed it
        away = fake.go_offline()
        # the worker noticed (it waits for the subsystem to come back) and goes on
        wait_for(lambda: any("waiting for" in m or "lost " in m
                             for m in seen.messages[before:]), BROKEN_SECONDS,
                 "the worker waiting for the mount")
        assert thread.is_alive()
        fake.come_back(away)
        wait_for(lambda: "lgbm" in fake.models
                 and fake.models["lgbm"]["state"] == "started",
                 BROKEN_SECONDS, "restart after remount")
        policies = fake.policies
        wait_for(lambda: fake.policies > policies, BROKEN_SECONDS, "policy after remount")
    finally:
        stop.set()
        thread.join(BROKEN_SECONDS)
        logging.getLogger("test.train").removeHandler(seen)
    assert not thread.is_alive()
    assert result["reconnects"] >= 1 and result["proxy_created"] >= 2


def test_refusals_are_logged_with_the_reason_and_survived(fake: FakeMount, caplog,
                                                          monkeypatch) -> None:
    """EINVAL from recommend and from the policy's close: logged with errors' last line."""
    from mlfs.trainers.knob import worker as worker_module

    real_write = worker_module._Worker.write_attr

    def refusing(self, path, text):
        if path.name == "recommend":
            (path.parent / "errors").write_text(
                "2026-01-01T00:00:00Z recommend value out of range: x\n")
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(self, path, text)

    monkeypatch.setattr(worker_module._Worker, "write_attr", refusing)
    caplog.set_level(logging.INFO, logger="test.train")
    thread, stop, result = start_worker(fake)
    try:
        wait_for(lambda: "value out of range" in caplog.text, BROKEN_SECONDS, "the refusal logged")
    finally:
        stop.set()
        thread.join(BROKEN_SECONDS)
    assert result["rejected"] >= 1 and not thread.is_alive()
