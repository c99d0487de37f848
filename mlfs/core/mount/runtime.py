"""One subsystem as the proxy runs it: plan, step, finish, and its model directories.

`SubsystemRuntime.tick()` is the proxy's whole decision for one tick: `plan`
(which model controls which knob, and the values), the backend's `step`, and
`finish` (the dataset row, records, feedback, modes, reports).  It is
synchronous and FUSE-free, so tests and benchmarks drive thousands of ticks in
virtual time; the exchange's trio loop calls the same three halves on a
wall-clock schedule, running a blocking backend's step in a worker thread.

The runtime owns STATE/<subsystem>/: the dataset (and record) store, the tick
reservation (`tick_reserved`: a tick number is never reused, even after a
crash), and models/ (`model_dirs.py`), each model one of the kinds the subsystem
serves (`mlfs.core.models.kinds`): the tick asks a kind's entry, never the model's
class, whether its models set knobs and what they do after the tick.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pyarrow as pa
import trio

from mlfs.abi import (
    ABI_VERSION,
    APPLICATION,
    EXTRA_APPLIED,
    EXTRA_FOREIGN,
    EXTRA_REFUSED,
    EXTRA_REPORTS,
    KnobValue,
    Sample,
    Subsystem,
    column_name,
    knob_column,
)
from mlfs.base.application import ApplicationObjective, HeldTick, parse_figure
from mlfs.base.clock import now_us
from mlfs.base.durable import set_aside, write_durably
from mlfs.base.errors import Refused, invalid
from mlfs.base.portion import Portion, StoreOwner, StoreWatch
from mlfs.base.statedir import read_word, subsystem_dir
from mlfs.base.text import escape_input, format_value, one_word, parse_float
from mlfs.core.models.decision import Decision
from mlfs.core.models.kinds import KINDS, TickDone, kinds_serving
from mlfs.core.models.proxy import ModelProxy
from mlfs.core.storage.records import RecordStore, keep_records
from mlfs.core.storage.store import PortionStore

from . import model_dirs
from .context import MountContext
from .histogram import Histogram

log = logging.getLogger("mlfs.runtime")

_ARROW_TYPES = {"float64": pa.float64(), "int64": pa.int64(), "string": pa.string()}
#: tick numbers reserved on disk at a time (one write per TICK_RESERVE ticks)
TICK_RESERVE = 1000
#: `report` events one tick may send (a backend announcing more is cut here)
MAX_REPORT_EVENTS = 32
#: where a subsystem came from: the configuration file or a run-time `load`
CONFIG, LOADED = "config", "load"


def _finite_or_none(value: object) -> float | None:
    """A feature's value as JSON can carry it: a finite number, else null."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # a plugin's int past a float's range
        return None
    return number if math.isfinite(number) else None


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

    def __init__(self, mount: MountContext, subsystem: Subsystem, source: str = CONFIG) -> None:
        #: what the runtime and its models use of the mount (events, counters, config)
        self.mount = mount
        self.subsystem = subsystem
        self.name = subsystem.name
        #: `config` or `load` (shown in `info` and by `mlfs status`)
        self.source = source
        #: set while unloading: no new model, no seal from the seal loop
        self.unloading = False
        #: the tick loop's scope (cancelled by unload) and its end
        self.loop_scope = trio.CancelScope()
        self.loop_done = trio.Event()
        #: set (and replaced) each time a dataset row is recorded
        self._row_recorded = trio.Event()
        self.directory = subsystem_dir(mount.state_dir, subsystem.name)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.feature_columns = {column_name(n): t for n, t in subsystem.features.items()}
        self._column_names = {n: column_name(n) for n in subsystem.features}
        self._knob_columns = {n: knob_column(n) for n in subsystem.knobs}
        #: stores with work for the seal loop, and which of them fail (critical state)
        self.watch = StoreWatch()
        self.dataset = PortionStore(self.directory / "dataset", self.dataset_schema(), "tick",
                                    mount.config.store.dataset(), self.watch, "dataset")
        self.dataset.owner = StoreOwner(self.name, "portion", f"{self.name}/dataset")
        #: the record dataset (a record source only) and the records it could not keep
        self.records: RecordStore | None = None
        if subsystem.records:
            self.records = RecordStore(self.directory / "records", subsystem.records,
                                       mount.config.store.records(), self.watch, "records")
            self.records.owner = StoreOwner(self.name, "portion", f"{self.name}/records")
        #: records lost, from the source's own count, a full store, or the write-ahead
        #: files' damage found at start-up
        self.records_lost = self.records.replay_lost if self.records is not None else 0
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
        #: the tick `last_features` were sampled on (None before the first)
        self.last_features_tick: int | None = None
        self.knob_values: dict[str, KnobValue] = subsystem.default_knobs(None)
        self.last_objective = math.nan
        self._objective_override: float | None = None
        #: an application's objective: its figures and the ticks held for them
        self.application: ApplicationObjective | None = None
        if subsystem.objective.name == APPLICATION:
            wait = subsystem.objective.wait_seconds
            self.application = ApplicationObjective(
                wait if wait is not None else max(2.0, 2 * subsystem.tick_seconds),
                subsystem.tick_seconds)
        self.critical: str | None = None
        #: why ticks are held (nothing can be recorded), None while they run
        self.held: str | None = None
        self.skipped_ticks = 0
        #: when the tick loop last did a tick (recorded or held): the daemon's watchdog
        self.last_tick_at = time.monotonic()
        self.ticks = 0
        self.tick_seconds_total = 0.0
        self.tick_durations = Histogram()
        self.errors = 0
        #: the kinds of model it serves, in registry order (a plain mkdir makes the first)
        self.kinds = kinds_serving(subsystem)
        models_dir = self.directory / "models"
        models_dir.mkdir(exist_ok=True)
        self.models.update(model_dirs.load_models(self, models_dir))
        for proxy in self.models.values():  # drop ownership conflicts left by a crash
            if proxy.active and self.owner_conflict(proxy, proxy.controlled):
                proxy.state = "stopped"

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
                          "goal": sub.objective.goal,
                          **({"wait_seconds": self.application.wait_seconds}
                             if self.application is not None else {})},
            "knobs": {n: k.describe() for n, k in sub.knobs.items()},
            "features": dict(self.feature_columns),
            "kinds": list(self.kinds),
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

    def create_model(self, name: str, kind: str | None = None) -> ModelProxy:
        """mkdir: a model of `kind` (default: the first the subsystem serves)."""
        return model_dirs.create_model(self, name, kind)

    def change_kind(self, proxy: ModelProxy, data: bytes) -> ModelProxy:
        """A write to a model's `kind` (`model_dirs.change_kind`)."""
        return model_dirs.change_kind(self, proxy, data)

    def destroy_model(self, name: str) -> ModelProxy:
        """rmdir: stop, seal what it has, forget it (its state files go too)."""
        return model_dirs.destroy_model(self, name)

    async def next_row(self) -> None:
        """Wait until the next tick's dataset row is recorded (or the mount stops)."""
        await self._row_recorded.wait()

    def release_row_waiters(self) -> None:
        """Shutdown: no row is coming; whoever waits for one goes on now."""
        self._row_recorded.set()

    # ---- attributes -----------------------------------------------------------
    def write_objective(self, data: bytes) -> None:
        """The application's figure (`mlfs.base.application`), or, for a subsystem
        whose objective is the backend's, the next tick's objective instead of it."""
        try:
            if self.application is not None:
                figure = parse_figure(data, self.mount.clock())
            else:
                value = parse_float(one_word(data, "objective"), "objective")
        except Refused as exc:
            refused = exc
            if self.application is None and len(data.split()) == 2:
                refused = invalid(f"objective takes one number here: window= is for a "
                                  f"subsystem with objective = {APPLICATION!r}")
            self.mount.count_error(self.name, "objective")
            log.warning("%s: objective refused (%s): %s", self.name, refused.reason,
                        escape_input(data))
            raise refused from None
        if self.application is None:
            self._objective_override = value
            return
        self.application.write(figure)
        self._record_released(self.application.release(self.mount.clock()))

    def objective_text(self) -> str:
        return format_value(self.last_objective)

    def features_text(self) -> str:
        """What `features` shows: the last tick's features as the dataset's columns
        name them, with the tick they were sampled on (JSON, one line; a value that is
        missing or not finite is null).  The proxy decides a policy's ML tick on these;
        a trainer choosing a recommendation reads them so that it decides on the same
        state, not on its newest sealed row, which is up to a seal interval old (a
        workload phase may have changed since)."""
        features = {name: _finite_or_none(value)
                    for name, value in (self.last_features or {}).items()}
        return json.dumps({"tick": self.last_features_tick, "features": features}) + "\n"

    def knob_text(self, name: str) -> str:
        """What `knobs/<name>` shows: the value in effect on the last tick."""
        return format_value(self.knob_values[name])

    def portion_views(self) -> dict[str, Mapping[int, Portion]]:
        """dataset/ (and records/): each store's sealed portions, live and read-only."""
        views = {"dataset": MappingProxyType(self.dataset.portions)}
        if self.records is not None:
            views["records"] = MappingProxyType(self.records.portions)
        return views

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
            if not KINDS[proxy.kind].sets_knobs:
                continue
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
        by_proxy = {p.name: d for p, d in decisions}
        knob_models = [p for p in active if KINDS[p.kind].sets_knobs]
        if self.application is None:
            self._record_row(row, objective, knob_models, by_proxy, knobs, plan.features)
        else:  # held until the application's figure covers it (or it waits too long)
            ended = self.mount.clock()
            self.application.hold(plan.tick, ended,
                                  (row, knob_models, by_proxy, knobs, plan.features))
            self._record_released(self.application.release(ended))
        records = keep_records(self, plan.tick, sample)
        critical = sample.critical or self.watch.reason()
        done = TickDone(plan.tick, ts, sample_features, records, critical)
        for proxy in active:
            after = KINDS[proxy.kind].after_tick
            if after is not None:
                after(proxy, done)
            proxy.update_mode(critical)
        self._publish_reports(sample)
        for status in (EXTRA_REFUSED, EXTRA_FOREIGN):
            for knob, reason in (sample.extra.get(status) or {}).items():
                self.mount.count_error(self.name, f"knobs/{knob}")
                log.warning("%s: knob %s %s: %s", self.name, knob, status, reason)
                self.mount.bus.publish(self.name, "knob", knob=knob, status=status,
                                          reason=str(reason))
        self._set_critical(critical)
        if self.held is not None:
            log.warning("%s: ticks resume after %d held", self.name, self.skipped_ticks)
            self.held = None
        self.last_sample = sample
        self.last_features = sample_features
        self.last_features_tick = plan.tick
        self.knob_values = knobs
        if self.application is None:
            self.last_objective = objective
        self.ticks += 1
        self.last_tick_at = time.monotonic()
        took = time.perf_counter() - plan.started
        self.tick_seconds_total += took
        self.tick_durations.observe(took)
        return sample

    def _record_row(self, row: dict, objective: float, models: list, by_proxy: dict,
                    knobs: dict, features: dict | None) -> None:
        """A tick's dataset row and its knob models' window and feedback, with its
        objective (a held tick's: when it is released)."""
        row["objective"] = objective
        self.dataset.append(row)
        self._row_recorded.set()  # wakes `prepare_dataset` waiting for a row
        self._row_recorded = trio.Event()
        for proxy in models:
            if proxy.active and self.models.get(proxy.name) is proxy:  # not removed since
                proxy.record(row["tick"], row["ts"], by_proxy.get(proxy.name), objective,
                             knobs, features)

    def _record_released(self, released: list[HeldTick]) -> None:
        for held in released:
            self._record_row(*held.payload[:1], held.objective, *held.payload[1:])
            self.last_objective = held.objective

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
            self.mount.bus.publish(self.name, "report", private=self.subsystem.private,
                                      report=str(item.get("report"))[:80],
                                      kind=kind, title=str(item.get("title", ""))[:300],
                                      status=str(item.get("status", "new"))[:16],
                                      count=int(item.get("count") or 0), **extra)

    def _set_critical(self, critical: str | None) -> None:
        if critical != self.critical:
            if critical:
                log.warning("%s: critical state: %s", self.name, critical)
            self.critical = critical

    def hold_ticks(self, reason: str) -> None:
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
        self.last_tick_at = time.monotonic()
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
        if self.application is not None:  # held rows are recorded, none lost
            self._record_released(self.application.release(self.mount.clock(),
                                                            everything=True))
        for proxy in self.models.values():
            proxy.closing()
            proxy.journal.close()
            proxy.feedback.close()
        if self.records is not None:
            self.records.close()
        self.dataset.close()
        self.subsystem.close()
