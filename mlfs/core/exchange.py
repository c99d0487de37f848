"""The exchange: every subsystem's tick loop, its dataset and its models.

`SubsystemRuntime.tick()` is the proxy's whole decision for one tick and is
synchronous and FUSE-free, so tests and benchmarks drive thousands of ticks in
virtual time.  `Exchange.run()` is the trio side: one task per subsystem that
ticks on a wall-clock schedule and seals due portions in worker threads.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import trio

from mlfs.abi import (
    ABI_VERSION,
    EXTRA_APPLIED,
    EXTRA_FOREIGN,
    EXTRA_REFUSED,
    EXTRA_REPORTS,
    NAME,
    KnobValue,
    Sample,
    Subsystem,
    column_name,
    knob_column,
)

from .clock import now_us, rfc3339
from .durable import fsync_dir, set_aside, write_durably
from .errors import Refused, error_line, invalid
from .events import EventBus
from .loading import Load, Remembered, parse_command, read_remembered, write_remembered
from .predictor_proxy import PredictorProxy
from .proxy import ERRORS_KEPT, OPERATOR_PIN, OPERATOR_RELEASE, Decision, ModelProxy
from .readers import ReaderAccounts
from .records import RecordStore, keep_records
from .statedir import EMERGENCY_PIN_FILE, read_word, subsystem_dir, subsystem_name_problem
from .store import Portion, PortionStore, StoreWatch, errno_name
from .text import decode_text, escape_input, one_word, parse_float

log = logging.getLogger("mlfs.exchange")

_ARROW_TYPES = {"float64": pa.float64(), "int64": pa.int64(), "string": pa.string()}
TICK_RESERVE = 1000
#: a model directory under construction (mkdir): never loaded, removed at start-up
_NEW_PREFIX = ".new-"
MODEL_SETTINGS = "model.json"
#: in the state directory while the operator's mount-wide emergency pin holds
ROOT_COMMANDS = "load, unload, emergency, auto"
#: how long unload waits for a blocking step in flight (seconds, or two ticks)
UNLOAD_STEP_WAIT = 10.0
#: seconds a load's backend check and constructor may take before the writer gets
#: ETIMEDOUT (the kill switch on the same file must answer within LOAD_SECONDS + 1)
LOAD_SECONDS = 2.0
#: abandoned loads still stuck in their backends before further loads get EAGAIN
MAX_ABANDONED_BUILDS = 8
#: `report` events one tick may send (a backend announcing more is cut here)
MAX_REPORT_EVENTS = 32
#: where a subsystem came from: the configuration file or a run-time `load`
CONFIG, LOADED = "config", "load"


@dataclass
class TickPlan:
    tick: int
    knobs: dict[str, KnobValue]
    active: list[ModelProxy]
    decisions: list[tuple[ModelProxy, Decision]]
    features: dict | None
    started: float


class SubsystemRuntime:
    """One subsystem as the proxy runs it."""

    def __init__(self, exchange: Exchange, subsystem: Subsystem, source: str = CONFIG) -> None:
        self.exchange = exchange
        self.subsystem = subsystem
        self.name = subsystem.name
        #: `config` or `load` (shown in `info` and by `mlfs status`)
        self.source = source
        #: set while unloading: no new model, no seal from the seal loop
        self.unloading = False
        #: the tick loop's scope (cancelled by unload) and its end
        self.loop_scope = trio.CancelScope()
        self.loop_done = trio.Event()
        self.directory = subsystem_dir(exchange.state_dir, subsystem.name)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.feature_columns = {column_name(n): t for n, t in subsystem.features.items()}
        self._column_names = {n: column_name(n) for n in subsystem.features}
        self._knob_columns = {n: knob_column(n) for n in subsystem.knobs}
        #: stores with work for the seal loop, and which of them fail (critical state)
        self.watch = StoreWatch()
        self.dataset = PortionStore(self.directory / "dataset", self.dataset_schema(), "tick",
                                    exchange.config.store.dataset(), self.watch, "dataset")
        #: the record dataset (a record source only) and the records it could not keep
        self.records: RecordStore | None = None
        if subsystem.records:
            self.records = RecordStore(self.directory / "records", subsystem.records,
                                       exchange.config.store.records(), self.watch, "records")
        self.records_lost = 0
        self.records_refused = 0
        #: `report` events sent, by kind (a backend keeping reports: `publishes_reports`)
        self.reports_by_kind: collections.Counter[str] = collections.Counter()
        self._tick_path = self.directory / "tick_reserved"
        last = self.dataset.last_key if self.dataset.last_key is not None else -1
        text, why = read_word(self._tick_path)
        if text is None and not why:
            reserved = 0
        elif text is not None and text.isdigit() and int(text) < 1 << 62:
            reserved = int(text)
        else:  # a damaged mark: never reuse a tick, so skip a whole reserve
            set_aside(self._tick_path, why or f"not a tick number: {text[:40]!r}")
            reserved = last + 1 + TICK_RESERVE
        self.next_tick = max(reserved, last + 1)
        self._reserved = self.next_tick
        self.models: dict[str, ModelProxy] = {}
        self._active: list[ModelProxy] | None = None  # started models, in `models` order
        self.last_sample: Sample | None = None
        self.last_features: dict | None = None
        self.knob_values: dict[str, KnobValue] = subsystem.default_knobs(None)
        self.last_objective = math.nan
        self._objective_override: float | None = None
        self.critical: str | None = None
        #: why ticks are held (nothing can be recorded), None while they run
        self.held: str | None = None
        self.skipped_ticks = 0
        self.ticks = 0
        self.tick_seconds_total = 0.0
        self.errors = 0
        models_dir = self.directory / "models"
        models_dir.mkdir(exist_ok=True)
        for entry in sorted(models_dir.iterdir()):
            if entry.name.startswith(_NEW_PREFIX):  # a mkdir that never returned
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir() and NAME.fullmatch(entry.name):
                if not (entry / MODEL_SETTINGS).exists():
                    log.warning("%s: %s has no %s (not a complete model); ignored",
                                self.name, entry, MODEL_SETTINGS)
                    continue
                self.models[entry.name] = self.proxy_class(self, entry.name, entry,
                                                           exchange.new_generation())
        for proxy in self.models.values():  # drop ownership conflicts left by a crash
            if proxy.active and self.owner_conflict(proxy, proxy.controlled):
                proxy.state = "stopped"

    @property
    def proxy_class(self) -> type[ModelProxy]:
        """A subsystem with targets has predictor models; any other, knob models."""
        return PredictorProxy if self.subsystem.targets else ModelProxy

    # ---- schema -------------------------------------------------------------
    def knob_fields(self) -> list[tuple[str, pa.DataType]]:
        return [
            (knob_column(n), pa.string() if k.type == "choice" else pa.int64())
            for n, k in self.subsystem.knobs.items()
        ]

    def feature_fields(self) -> list[tuple[str, pa.DataType]]:
        return [(n, _ARROW_TYPES[t]) for n, t in self.feature_columns.items()]

    def dataset_schema(self) -> pa.Schema:
        return pa.schema(
            [("ts", pa.timestamp("us", tz="UTC")), ("tick", pa.int64()),
             ("controller", pa.string()), ("model", pa.string()), ("mode", pa.string())]
            + self.knob_fields() + self.feature_fields() + [("objective", pa.float64())]
        )

    def info(self) -> dict:
        sub = self.subsystem
        return {
            "backend": sub.backend,
            "source": self.source,
            "abi": ABI_VERSION,
            "description": sub.description,
            "tick_seconds": sub.tick_seconds,
            "objective": {"name": sub.objective.name, "unit": sub.objective.unit,
                          "goal": sub.objective.goal},
            "knobs": {n: k.describe() for n, k in sub.knobs.items()},
            "features": dict(self.feature_columns),
            **({"private": True} if sub.private else {}),
            **({"targets": {n: t.describe() for n, t in sub.targets.items()}}
               if sub.targets else {}),
            **({"records": dict(sub.records), "records_lost": self.records_lost,
                "records_refused": self.records_refused} if self.records is not None else {}),
        }

    # ---- models -------------------------------------------------------------
    def models_changed(self) -> None:
        """A model was added, removed, started or stopped."""
        self._active = None

    def active_models(self) -> list[ModelProxy]:
        if self._active is None:
            self._active = [p for p in self.models.values() if p.active]
        return self._active

    def owner_conflict(self, proxy: ModelProxy, knobs: list[str]) -> tuple[str, str] | None:
        for other in self.models.values():
            if other is proxy or not other.active:
                continue
            for knob in knobs:
                if knob in other.controlled:
                    return knob, other.name
        return None

    def create_model(self, name: str) -> ModelProxy:
        """mkdir: a complete model directory appears by one rename, or nothing does.

        The directory is built under a temporary name (its settings file
        last) and renamed into place, so a crash or an error half-way (EMFILE,
        ENOSPC) never leaves something that comes back as a model.
        """
        if not NAME.fullmatch(name):
            raise invalid(f"model name {name!r} is not [a-z0-9][a-z0-9._-]{{0,63}}")
        if self.unloading:
            raise Refused(errno.ENODEV, f"subsystem {self.name!r} is being unloaded")
        if name in self.models:
            raise Refused(errno.EEXIST, f"model {name!r} exists")
        limit = self.exchange.config.mount.max_models
        if self.exchange.model_count() >= limit:
            raise Refused(errno.ENOSPC, f"the mount has {limit} models (mount.max_models)")
        models_dir = self.directory / "models"
        directory = models_dir / name
        staging = models_dir / (_NEW_PREFIX + name)
        try:
            if directory.exists():  # left by an rmdir that crashed half-way
                shutil.rmtree(directory)
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            ModelProxy.prepare_directory(staging, self)
            os.rename(staging, directory)
            fsync_dir(models_dir)
            proxy = self.proxy_class(self, name, directory, self.exchange.new_generation())
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(directory, ignore_errors=True)
            log.warning("%s: mkdir %s failed: %s", self.name, name, exc)
            raise Refused(exc.errno or errno.EIO, f"model {name!r} not created: "
                          f"{errno_name(exc)} in the state directory") from None
        self.models[name] = proxy
        self.models_changed()
        self.exchange.bus.publish(self.name, "state", model=name,
                                  **{"from": None, "to": "initialized"})
        return proxy

    def destroy_model(self, name: str) -> ModelProxy:
        """rmdir: stop, seal what it has, forget it (its state files go too)."""
        proxy = self.models.pop(name, None)
        if proxy is None:
            raise Refused(errno.ENOENT, f"no model {name!r}")
        self.models_changed()
        proxy.destroy()
        shutil.rmtree(proxy.directory, ignore_errors=True)
        self.exchange.bus.publish(self.name, "state", model=name,
                                  **{"from": proxy.state, "to": None})
        return proxy

    # ---- attributes -----------------------------------------------------------
    def write_objective(self, data: bytes) -> None:
        try:
            value = parse_float(one_word(data, "objective"), "objective")
        except Refused as exc:
            self.exchange.count_error(self.name, "objective")
            log.warning("%s: objective refused (%s): %s", self.name, exc.reason,
                        escape_input(data))
            raise
        self._objective_override = value

    def objective_text(self) -> str:
        value = self.last_objective
        return "nan\n" if math.isnan(value) else f"{value:.6g}\n"

    def stores(self) -> list[PortionStore]:
        out = [self.dataset] + ([self.records] if self.records is not None else [])
        for proxy in self.models.values():
            out += [proxy.journal, proxy.feedback]
        return out

    # ---- the tick -------------------------------------------------------------
    def tick(self) -> Sample:
        """Decide, apply, run, sample and record one tick; never waits on anyone."""
        plan = self.plan()
        return self.finish(plan, self.subsystem.step(plan.knobs))

    def plan(self) -> TickPlan:
        """The decision half of a tick: who controls which knob, and the values.

        Runs on the trio thread (it touches proxies); a blocking backend's
        `step` may then run in a worker thread, and `finish` records on the
        trio thread again, so no proxy or store is ever touched by two threads.
        """
        started = time.perf_counter()
        tick = self.next_tick
        if tick + 1 > self._reserved:  # before the number is used: OSError consumes none
            self._reserve(tick + 1 + TICK_RESERVE)
        self.next_tick += 1
        knobs = self.subsystem.default_knobs(self.last_sample)
        active = list(self.active_models())
        decisions = []
        for proxy in active:
            proxy.expire(tick)
            if proxy.wants_ml():
                decision = proxy.decide(tick, self.last_features, knobs)
                if decision is not None:
                    knobs.update({k: v for k, v in decision.knobs.items()
                                  if k in proxy.controlled})
                    decisions.append((proxy, decision))
        return TickPlan(tick, knobs, active, decisions, self.last_features, started)

    def finish(self, plan: TickPlan, sample: Sample) -> Sample:
        """The recording half: dataset row, feedback, modes, reports."""
        ts = now_us()
        knobs = dict(plan.knobs)
        knobs.update(sample.extra.get(EXTRA_APPLIED) or {})  # what the kernel really has
        objective = sample.objective
        if self._objective_override is not None:
            objective, self._objective_override = self._objective_override, None
        # a model stopped or removed while a blocking step ran is not recorded
        active = [p for p in plan.active if p.active and self.models.get(p.name) is p]
        decisions = [(p, d) for p, d in plan.decisions if p in active]
        row = {"ts": ts, "tick": plan.tick, "controller": "ml" if decisions else "default"}
        lead = decisions[0][0] if decisions else (active[0] if active else None)
        row["model"] = lead.name if lead else None
        row["mode"] = lead.mode if lead else "default"
        for name, value in knobs.items():
            row[self._knob_columns[name]] = value
        names = self._column_names
        sample_features = {names.get(k) or names.setdefault(k, column_name(k)): v
                           for k, v in sample.features.items()}
        row.update(sample_features)
        row["objective"] = objective
        self.dataset.append(row)
        records = keep_records(self, plan.tick, sample)
        critical = sample.critical or self.watch.reason()
        by_proxy = {p.name: d for p, d in decisions}
        for proxy in active:
            if isinstance(proxy, PredictorProxy):
                proxy.observe(plan.tick, records)
            else:
                proxy.record(plan.tick, ts, by_proxy.get(proxy.name), objective, knobs,
                             plan.features)
            proxy.update_mode(critical)
        self._publish_reports(sample)
        for status in (EXTRA_REFUSED, EXTRA_FOREIGN):
            for knob, reason in (sample.extra.get(status) or {}).items():
                self.exchange.count_error(self.name, f"knobs/{knob}")
                log.warning("%s: knob %s %s: %s", self.name, knob, status, reason)
                self.exchange.bus.publish(self.name, "knob", knob=knob, status=status,
                                          reason=str(reason))
        self._set_critical(critical)
        if self.held is not None:
            log.warning("%s: ticks resume after %d held", self.name, self.skipped_ticks)
            self.held = None
        self.last_sample = sample
        self.last_features = sample_features
        self.knob_values = knobs
        self.last_objective = objective
        self.ticks += 1
        self.tick_seconds_total += time.perf_counter() - plan.started
        return sample

    def _publish_reports(self, sample: Sample) -> None:
        """`report` events for the backend's new and repeating reports (bounded)."""
        reports = sample.extra.get(EXTRA_REPORTS) if isinstance(sample.extra, dict) else None
        if not isinstance(reports, list):
            return
        for item in reports[:MAX_REPORT_EVENTS]:
            if not isinstance(item, dict):
                continue
            kind = str(item.get("kind", "other"))[:32]
            self.reports_by_kind[kind] += 1
            extra = {}
            if isinstance(item.get("similarity"), float):
                extra = {"similarity": item["similarity"],
                         "nearest": str(item.get("nearest"))[:80]}
            self.exchange.bus.publish(self.name, "report", report=str(item.get("report"))[:80],
                                      kind=kind, title=str(item.get("title", ""))[:300],
                                      status=str(item.get("status", "new"))[:16],
                                      count=int(item.get("count") or 0), **extra)

    def _set_critical(self, critical: str | None) -> None:
        if critical != self.critical:
            if critical:
                log.warning("%s: critical state: %s", self.name, critical)
            self.critical = critical

    def hold(self, reason: str) -> None:
        """Skip a tick that could not be recorded; started models go to emergency.

        While the state dir refuses writes, rows wait in memory up to
        `store.max_waiting_rows`; at that bound (or when a tick number cannot
        be reserved) ticking stops instead of dropping rows: the backend keeps
        its default, nothing is recorded, and each skipped tick is counted.
        """
        if self.held is None:
            log.error("%s: ticks held, nothing can be recorded: %s", self.name, reason)
        self.held = reason
        self.skipped_ticks += 1
        critical = f"storage: {reason}"
        for proxy in self.active_models():
            proxy.update_mode(critical)
        self._set_critical(critical)

    def _reserve(self, upto: int) -> None:
        """Persist a tick high-water mark so a crash never reuses a tick number."""
        tmp = self._tick_path.with_suffix(".tmp")
        tmp.write_text(f"{upto}\n")
        os.replace(tmp, self._tick_path)
        self._reserved = upto

    def keep_info(self) -> None:
        """STATE/<subsystem>/info.json: what `info` says, for `mlfs report STATE` after umount.

        The objective's name, unit and goal and the knobs' types are not in the
        Parquet portions; without them a report of an unmounted run could not
        tell better from worse.  Best effort: a failure is logged, never fatal.
        """
        try:
            write_durably(self.directory / "info.json",
                          (json.dumps(self.info(), indent=2) + "\n").encode())
        except OSError as exc:
            log.warning("%s: cannot keep info.json: %s", self.name, exc.strerror or exc)

    def close(self) -> None:
        for proxy in self.models.values():
            proxy.journal.close()
            proxy.feedback.close()
        if self.records is not None:
            self.records.close()
        self.dataset.close()
        self.subsystem.close()


def _remove_durably(path: Path) -> None:
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


class Exchange:
    """All subsystems of one mount, the event bus and the counters."""

    def __init__(self, config, state_dir: Path, subsystems: list[Subsystem],
                 backends=None, sources: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        #: seconds, for the models' trainer-silence timer (tests pass a virtual clock)
        self.clock = clock
        #: the backend registry (`mlfs.backends`: check_entry, create_subsystems,
        #: root_only, entry_for_name); None serves no run-time load
        self.backends = backends
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.bus = EventBus()
        self.readers = ReaderAccounts(config.mount)
        self.started = time.time()
        self._generation = 0
        self.recommendations: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        #: the root `errors` file: the last refused root `control` commands
        self.root_errors: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        #: the operator's mount-wide emergency pin (`echo emergency > MOUNT/control`);
        #: read before any model exists, so every model starts under it
        self.emergency_pinned = (self.state_dir / EMERGENCY_PIN_FILE).exists()
        #: who pulled the pin (a pin kept from before a restart counts as root's)
        self.emergency_pinned_by = 0
        self._control_lock = trio.Lock()
        #: one load/unload at a time; apart from `_control_lock`, so a backend's
        #: slow (or hung) constructor never delays the emergency switch
        self._load_lock = trio.Lock()
        #: loads whose backend did not answer within LOAD_SECONDS: still stuck, and ever
        self.builds_running = 0
        self.builds_abandoned = 0
        #: loads waiting for their backend right now (each for at most LOAD_SECONDS)
        self.loads_waiting = 0
        if self.emergency_pinned:
            log.warning("the operator's emergency pin holds (%s): every model stays in "
                        "emergency until `echo auto > MOUNT/control`", EMERGENCY_PIN_FILE)
        self.runtimes: dict[str, SubsystemRuntime] = {}
        for sub in subsystems:
            source = (sources or {}).get(sub.name, CONFIG)
            self.runtimes[sub.name] = SubsystemRuntime(self, sub, source)
        self._stopping = False
        #: the exchange's nursery once run() started: loaded tick loops start in it
        self._nursery: trio.Nursery | None = None

    def new_generation(self) -> int:
        self._generation += 1
        return self._generation

    def count_recommendation(self, status: str) -> None:
        self.recommendations[status] += 1

    def count_error(self, subsystem: str, file: str) -> None:
        self.errors[(subsystem, file)] += 1

    def model_count(self) -> int:
        return sum(len(runtime.models) for runtime in self.runtimes.values())

    # ---- sealing --------------------------------------------------------------
    def _store_owner(self, store: PortionStore
                     ) -> tuple[SubsystemRuntime, ModelProxy | None] | None:
        """Who owns a store now (None: its model was removed meanwhile)."""
        for runtime in self.runtimes.values():
            if store is runtime.dataset or store is runtime.records:
                return runtime, None
            for proxy in runtime.models.values():
                if store is proxy.journal or store is proxy.feedback:
                    return runtime, proxy
        return None

    def _announce(self, store: PortionStore, portion: Portion) -> None:
        owner = self._store_owner(store)
        if owner is None:  # rmdir raced with the seal: nothing left to announce
            return
        runtime, proxy = owner
        if proxy is None:
            where = "records" if store is runtime.records else "dataset"
            path = f"{runtime.name}/{where}/{portion.name}"
            self.bus.publish(runtime.name, "portion", path=path, rows=portion.rows)
        elif store is proxy.feedback:
            path = f"{proxy.path}/feedback/{portion.name}"
            self.bus.publish(runtime.name, "feedback", model=proxy.name, path=path,
                             rows=portion.rows)

    async def seal(self, store: PortionStore) -> Portion | None:
        """Seal pending rows of one store into a portion (encoding off-thread)."""
        batch = store.take_batch()
        if batch is None:
            return None
        try:
            portion = await trio.to_thread.run_sync(store.write_batch, batch)
            if store.closed:
                # its model was removed (rmdir) meanwhile, perhaps re-created under
                # the same name: the file must not turn up in the new model's dir
                if portion is not None:
                    portion.path.unlink(missing_ok=True)
                store.sealing -= 1
                return None
        except Exception as exc:
            if store.closed:
                store.sealing -= 1
                return None  # its model was removed (rmdir) while it was written
            if not isinstance(exc, OSError):
                log.exception("sealing %s failed; the batch is kept and retried",
                              store.directory)
            store.abort(batch, exc)  # kept in memory and in its WAL, retried first
            return None
        store.commit(portion, batch)
        if portion is not None:
            self._announce(store, portion)
        return portion

    async def prepare_dataset(self, runtime: SubsystemRuntime) -> None:
        """Seal now; with nothing pending, wait for the next tick's row first."""
        store = runtime.dataset
        if store.pending == 0:
            with trio.move_on_after(max(5.0, 20 * runtime.subsystem.tick_seconds)):
                while store.pending == 0 and not self._stopping:
                    await trio.sleep(min(0.01, runtime.subsystem.tick_seconds / 4))
        while store.sealing:  # a concurrent seal: let it land first
            await trio.sleep(0.005)
        # failed batches first (retried now, in order), then one seal of what is pending
        while not store.closed:
            retrying = store.retrying
            await self.seal(store)
            if store.error is not None or not retrying:
                break
        if store.error is not None:
            code, name = store.error
            raise Refused(code, f"dataset not sealed: {name} in the state directory")
        records = runtime.records
        if records is not None:  # a record source: its records are sealed with it
            while records.sealing:
                await trio.sleep(0.005)
            while not records.closed and (records.pending or records.retrying):
                retrying = records.retrying
                await self.seal(records)
                if records.error is not None or not retrying:
                    break
            if records.error is not None:
                code, name = records.error
                raise Refused(code, f"records not sealed: {name} in the state directory")

    def discard_dataset(self, runtime: SubsystemRuntime) -> list[Portion]:
        return runtime.dataset.discard()

    async def control(self, runtime: SubsystemRuntime, data: bytes) -> None:
        command = one_word(data, "control")
        if command == "prepare_dataset":
            await self.prepare_dataset(runtime)
        elif command == "discard_dataset":
            self.discard_dataset(runtime)
        else:
            raise invalid(f"unknown command {command!r} (prepare_dataset, discard_dataset)")

    async def model_control(self, proxy: ModelProxy, data: bytes) -> None:
        """A model's control file: its lifecycle plus the dataset commands."""
        try:
            command = one_word(data, "control")
            if command == "start":
                proxy.start()
            elif command == "stop":
                proxy.stop()
            elif command == "prepare_dataset":
                await self.prepare_dataset(proxy.runtime)
            elif command == "discard_dataset":
                self.discard_dataset(proxy.runtime)
            else:
                raise invalid(f"unknown command {command!r} "
                              "(start, stop, prepare_dataset, discard_dataset)")
        except Refused as exc:
            raise proxy.refuse("control", data, exc) from None

    # ---- the root control file: the operator's switches -------------------------
    async def root_control(self, data: bytes, uid: int = 0) -> None:
        """`MOUNT/control`: load/unload subsystems; `emergency`/`auto` for every model.

        A refused command changes nothing and leaves a line in the root
        `errors`, a counter and a log line, as a model's refusals do.  One
        command at a time: the record on disk follows the order of the writes.
        `uid` is the writer's (taken when it opened the file).
        """
        try:
            words = decode_text(data).split()
            if words and words[0] in ("load", "unload"):
                command = parse_command(words)
                async with self._load_lock:
                    if isinstance(command, Load):
                        await self.load(command.entry, uid)
                    else:
                        await self.unload(command.name)
                return
            if len(words) != 1 or words[0] not in ("emergency", "auto"):
                shown = " ".join(words) or "(nothing)"
                raise invalid(f"unknown command {shown[:64]!r} ({ROOT_COMMANDS})")
            async with self._control_lock:
                if words[0] == "emergency":
                    await self.pin_emergency(uid)
                else:
                    await self.release_emergency(uid)
        except Refused as exc:
            self.refuse_root("control", exc, escape_input(data))
            raise

    def refuse_root(self, file: str, exc: Refused, shown: str) -> None:
        """A refused root command: a line in MOUNT/errors, a counter, a log line."""
        self.root_errors.append(error_line(file, exc.reason, shown))
        self.count_error("", file)
        log.warning("%s refused (%s): %s", file, exc.reason, shown)

    # ---- run-time loading (the modprobe model) ---------------------------------
    async def load(self, entry: dict, uid: int) -> SubsystemRuntime:
        """Check a [[subsystem]] table whole, build it off-thread, serve it.

        Nothing changes until every check passed: backend known (and root's
        alone for a ROOT_ONLY backend), settings known and well typed, exactly
        one subsystem with a valid, free name.  The backend's constructor may
        touch the kernel (the ledger of originals, reading sysfs), so it runs
        in a worker thread.  The load is remembered durably before it is
        served; if it cannot be, the subsystem is closed again (its knobs
        restored) and the writer gets the errno.
        """
        backends = self.backends
        if backends is None or self._nursery is None:
            raise Refused(errno.EAGAIN, "run-time loading is not available on this mount")
        if self.builds_running >= MAX_ABANDONED_BUILDS:
            raise Refused(errno.EAGAIN, f"{self.builds_running} abandoned loads are still "
                          "stuck in their backends; no more until they end")
        backend = entry["backend"]
        try:
            if await self._bounded(backends.root_only, backend) and uid != 0:
                raise Refused(errno.EPERM, f"backend {backend!r} writes the files its "
                              "settings name: only root may load it")
            if uid != 0 and backends.writes_kernel(entry):
                raise Refused(errno.EPERM, "these settings let the subsystem write kernel "
                              "settings (apply, knobs): only root may load them")
            names = await self._bounded(backends.check_entry, entry)
        except backends.SettingError as exc:
            raise invalid(str(exc)) from None
        if len(names) != 1:
            raise invalid(f"load makes one subsystem at a time; these settings make "
                          f"{len(names)} ({', '.join(names[:8]) or 'none'})")
        name = names[0]
        self._check_free(name)
        try:
            built = await self._bounded(backends.create_subsystems, [entry], self.state_dir,
                                        close=lambda subs: [s.close() for s in subs])
        except backends.SettingError as exc:
            raise invalid(str(exc)) from None
        except Refused:
            raise  # ETIMEDOUT from _bounded: said as it is
        except OSError as exc:
            raise Refused(exc.errno or errno.EIO,
                          f"{name}: not built: {exc.strerror or exc}") from None
        except Exception as exc:  # a plugin's constructor: anything may happen
            log.exception("%s: backend %s failed to build it", name, backend)
            raise invalid(f"{name}: backend {backend!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
        subsystem = built[0]
        try:
            if subsystem.name != name:
                raise invalid(f"backend {backend!r} built {subsystem.name!r}, not {name!r}")
            remembered = read_remembered(self.state_dir)
            remembered = [r for r in remembered if r.name != name]
            remembered.append(Remembered(name, dict(entry)))
            try:
                await trio.to_thread.run_sync(write_remembered, self.state_dir, remembered)
            except OSError as exc:
                raise Refused(exc.errno or errno.EIO, f"{name}: not loaded: it cannot be "
                              f"remembered ({exc.strerror or exc} in the state directory)"
                              ) from None
            runtime = self.serve(subsystem, LOADED)
            await trio.to_thread.run_sync(runtime.keep_info)
        except BaseException:
            await trio.to_thread.run_sync(subsystem.close)  # its knobs restored
            raise
        log.warning("%s: loaded (backend %s, %s)", name, backend,
                    " ".join(f"{k}={v!r}" for k, v in entry.items() if k != "backend"))
        return runtime

    async def _bounded(self, function, *args, close=None):
        """`function(*args)` in a worker thread, answered within LOAD_SECONDS whatever it does.

        A backend's check or constructor may block for good (a declared file that
        never answers, /proc/kmsg): the kernel serialises writes to one file, so a load
        stuck in MOUNT/control would also hold `echo emergency > MOUNT/control`.  Past
        the deadline the writer gets ETIMEDOUT, nothing is served, and the thread is
        abandoned and counted (`builds_running`); when it ends after all, `close`
        undoes what it built (its knobs restored).
        """
        state = {"done": False, "abandoned": False, "result": None}
        lock = threading.Lock()

        def run():
            result = function(*args)
            with lock:
                state["done"], state["result"] = True, result
                if not state["abandoned"]:
                    return result
            self.builds_running -= 1  # it ended after all: undo what it built
            if close is not None and result:
                close(result)
            return None

        self.loads_waiting += 1
        try:
            with trio.move_on_after(LOAD_SECONDS) as scope:
                return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        finally:
            self.loads_waiting -= 1
        with lock:
            state["abandoned"] = True
            finished = state["done"]
        if finished and close is not None and state["result"]:  # just in time: undo it
            await trio.to_thread.run_sync(close, state["result"])
        elif not finished:
            self.builds_running += 1
            self.builds_abandoned += 1
        assert scope.cancelled_caught
        raise Refused(errno.ETIMEDOUT, f"the backend did not answer within {LOAD_SECONDS:g} s "
                      "(a declared file that blocks?); nothing was loaded")

    def _check_free(self, name: str) -> None:
        problem = subsystem_name_problem(name)
        if problem:
            raise invalid(problem)
        if name in self.runtimes:
            raise Refused(errno.EEXIST, f"subsystem {name!r} is served already "
                          f"({self.runtimes[name].source})")
        limit = self.config.mount.max_subsystems
        if len(self.runtimes) >= limit:
            raise Refused(errno.ENOSPC, f"the mount serves {len(self.runtimes)} subsystems "
                          f"(mount.max_subsystems = {limit})")

    def serve(self, subsystem: Subsystem, source: str) -> SubsystemRuntime:
        """A built subsystem joins the mount: its runtime, its tick loop, its event."""
        self._check_free(subsystem.name)
        runtime = SubsystemRuntime(self, subsystem, source)
        self.runtimes[runtime.name] = runtime
        self._nursery.start_soon(self._tick_loop, runtime)
        self.bus.publish(runtime.name, "subsystem", action="loaded", source=source)
        return runtime

    async def unload(self, name: str) -> None:
        """Stop its ticks, its models, seal, restore its knobs, then let it go.

        Its tick loop ends first (a blocking step in flight finishes; one that
        does not return within UNLOAD_STEP_WAIT refuses the unload with EBUSY
        and ticks resume once it returns), then the remembered load is
        forgotten: if that cannot be written, ticks resume and the unload is
        refused with its errno.  From there on nothing can fail.  A configured
        subsystem is only gone until the next mount.  Its directory stays
        visible until its knobs are restored; its portions stay.
        """
        runtime = self.runtimes.get(name)
        if runtime is None:
            raise Refused(errno.ENOENT, f"no subsystem {name!r}")
        if runtime.unloading:
            raise Refused(errno.EBUSY, f"{name}: its backend's step has not returned yet")
        runtime.unloading = True
        runtime.loop_scope.cancel()
        wait = max(UNLOAD_STEP_WAIT, 2 * runtime.subsystem.tick_seconds)
        with trio.move_on_after(wait):
            await runtime.loop_done.wait()
        if not runtime.loop_done.is_set():
            self._nursery.start_soon(self._resume_ticks, runtime)
            raise Refused(errno.EBUSY, f"{name}: not unloaded: its backend's step has not "
                          f"returned for {wait:g} s (ticks resume once it does)")
        remembered = read_remembered(self.state_dir)
        if any(r.name == name for r in remembered):
            try:
                await trio.to_thread.run_sync(
                    write_remembered, self.state_dir, [r for r in remembered if r.name != name])
            except OSError as exc:
                self._nursery.start_soon(self._resume_ticks, runtime)
                raise Refused(exc.errno or errno.EIO, f"{name}: not unloaded: the record "
                              f"cannot be updated ({exc.strerror or exc})") from None
        for proxy in list(runtime.models.values()):
            try:
                proxy.stop()
            except Exception:
                log.exception("%s/%s: stop at unload failed", name, proxy.name)
        await self._seal_runtime(runtime)
        for proxy in runtime.models.values():
            proxy.journal.close()
            proxy.feedback.close()
        runtime.dataset.close()
        try:
            await trio.to_thread.run_sync(runtime.subsystem.close)  # restores its knobs
        except Exception:
            log.exception("%s: close at unload failed", name)
        del self.runtimes[name]
        log.warning("%s: unloaded (it came from %s)", name, runtime.source)
        self.bus.publish(name, "subsystem", action="unloaded", source=runtime.source)
        self.bus.close_subsystem(name)

    async def mkdir_subsystem(self, name: str, uid: int) -> None:
        """`mkdir MOUNT/<name>`: load the backend that derives everything from the name."""
        try:
            if self.backends is None:
                raise Refused(errno.EPERM, "run-time loading is not available on this mount")
            problem = subsystem_name_problem(name)
            if problem:
                raise invalid(problem)
            try:
                entry = await trio.to_thread.run_sync(self.backends.entry_for_name, name)
            except self.backends.SettingError as exc:
                raise invalid(str(exc)) from None
            if entry is None:
                raise Refused(errno.EPERM, f"no backend serves {name!r} from its name "
                              "alone (`load <backend> key=value ...` on MOUNT/control)")
            async with self._load_lock:
                await self.load(entry, uid)
        except Refused as exc:
            self.refuse_root("mkdir", exc, escape_input(name.encode()))
            raise

    async def rmdir_subsystem(self, name: str) -> None:
        """`rmdir MOUNT/<name>`: unload it (as `unload <name>`)."""
        try:
            async with self._load_lock:
                await self.unload(name)
        except Refused as exc:
            self.refuse_root("rmdir", exc, escape_input(name.encode()))
            raise

    async def _resume_ticks(self, runtime: SubsystemRuntime) -> None:
        """A refused unload: once its old tick loop ended, the subsystem ticks again."""
        await runtime.loop_done.wait()
        runtime.loop_scope = trio.CancelScope()
        runtime.loop_done = trio.Event()
        runtime.unloading = False
        log.warning("%s: ticks resume (the unload was refused)", runtime.name)
        await self._tick_loop(runtime)

    async def _seal_runtime(self, runtime: SubsystemRuntime) -> None:
        for store in runtime.stores():
            while store.sealing:
                await trio.sleep(0.005)
            try:
                store.flush_wal()
            except Exception:
                log.exception("%s: WAL flush at unload", store.directory)
            while store.due(math.inf) and store.error is None:
                before = store.waiting
                await self.seal(store)
                if store.waiting >= before:
                    break

    async def pin_emergency(self, uid: int = 0) -> None:
        """Every model of every subsystem to emergency, now and until released.

        The models switch first, then the pin is recorded durably (in a worker
        thread: a slow disk delays this writer only): an operator who pulled
        the switch does not expect a crash or a restart to release it.  If it
        cannot be recorded (disk full, I/O error) the pin still holds in
        memory, safety first, and the writer gets the errno and a reason.
        """
        if self.emergency_pinned:
            return
        self.emergency_pinned = True
        self.emergency_pinned_by = uid
        log.warning("every model pinned to emergency by the operator (MOUNT/control)")
        self.bus.publish(None, "emergency", model=None, pinned=True, why=OPERATOR_PIN)
        for proxy in self.all_models():
            proxy.pin_by_operator()
        record = f"pinned by the operator (uid {uid}) at {rfc3339()}\n".encode()
        try:
            await trio.to_thread.run_sync(write_durably, self.state_dir / EMERGENCY_PIN_FILE,
                                          record)
        except OSError as exc:
            log.error("emergency pin not recorded on disk: %s", exc)
            raise Refused(exc.errno or errno.EIO,
                          f"pinned, but not recorded on disk ({exc.strerror}): "
                          "a restart would release it") from None

    async def release_emergency(self, uid: int = 0) -> None:
        """Every model back to its own pin or to automatic switching.

        Anyone who may write MOUNT/control pulls the switch; releasing a pin root
        pulled is root's.  The record goes first: if it cannot be removed, nothing is
        released (a restart would pin again) and the writer gets the errno.
        """
        if not self.emergency_pinned:
            return
        if uid != 0 and self.emergency_pinned_by == 0:
            raise Refused(errno.EPERM, "the emergency pin was pulled by root: only root "
                          "releases it")
        try:
            await trio.to_thread.run_sync(_remove_durably, self.state_dir / EMERGENCY_PIN_FILE)
        except OSError as exc:
            raise Refused(exc.errno or errno.EIO,
                          f"still pinned: its record could not be removed ({exc.strerror})"
                          ) from None
        self.emergency_pinned = False
        log.warning("the operator released the emergency pin (MOUNT/control)")
        self.bus.publish(None, "emergency", model=None, pinned=False, why=OPERATOR_RELEASE)
        for proxy in self.all_models():
            proxy.release_by_operator()

    def all_models(self) -> list[ModelProxy]:
        return [proxy for runtime in self.runtimes.values() for proxy in runtime.models.values()]

    def root_errors_text(self) -> str:
        return "".join(line + "\n" for line in self.root_errors)

    # ---- the loops --------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for runtime in self.runtimes.values():
                nursery.start_soon(self._tick_loop, runtime)
            nursery.start_soon(self._seal_loop)
            task_status.started()

    async def _tick_loop(self, runtime: SubsystemRuntime) -> None:
        try:
            with runtime.loop_scope:
                await self._ticks(runtime)
        finally:
            runtime.loop_done.set()

    async def _ticks(self, runtime: SubsystemRuntime) -> None:
        period = runtime.subsystem.tick_seconds
        deadline = trio.current_time()
        while not self._stopping:
            try:
                await self._one_tick(runtime)
            except Exception:
                runtime.errors += 1
                log.exception("%s: tick failed", runtime.name)
            deadline += period
            now = trio.current_time()
            if deadline < now - period:  # fell behind (suspended?): do not burst
                deadline = now
            await trio.sleep_until(deadline)

    async def _one_tick(self, runtime: SubsystemRuntime) -> None:
        if runtime.watch.full():
            runtime.hold("rows waiting in memory reached store.max_waiting_rows"
                         + (f" ({runtime.watch.reason()})" if runtime.watch.failing else ""))
            return
        try:
            plan = runtime.plan()
        except OSError as exc:  # the tick number could not be reserved: none consumed
            runtime.hold(f"{errno_name(exc)} reserving tick numbers")
            return
        if runtime.subsystem.blocking:
            sample = await trio.to_thread.run_sync(runtime.subsystem.step, plan.knobs)
        else:
            sample = runtime.subsystem.step(plan.knobs)
        runtime.finish(plan, sample)

    async def _seal_loop(self) -> None:
        """Every 50 ms: write queued WAL lines and seal due stores.

        Only stores in a `StoreWatch.dirty` set are visited, so idle models
        cost nothing here.  Nothing in it may end the loop: a store error is
        recorded on the store (critical state, retried), anything else is
        logged and the loop goes on.
        """
        while True:
            now = time.monotonic()
            for runtime in list(self.runtimes.values()):
                if runtime.unloading:  # unload seals it itself
                    continue
                for store in list(runtime.watch.dirty):
                    try:
                        store.flush_wal()
                        if store.sealing == 0 and store.due(now):
                            await self.seal(store)
                        store.settle()
                    except Exception:
                        log.exception("%s: seal loop", store.directory)
            await trio.sleep(0.05)

    async def seal_all(self) -> None:
        self._stopping = True
        for runtime in self.runtimes.values():
            for store in list(runtime.watch.dirty):
                while store.sealing:
                    await trio.sleep(0.005)
                while store.due(math.inf) and store.error is None:
                    before = store.waiting
                    await self.seal(store)
                    if store.waiting >= before:
                        break

    def close(self) -> None:
        self.bus.close()
        for runtime in self.runtimes.values():
            try:
                runtime.close()
            except Exception:
                log.exception("%s: close failed", runtime.name)
