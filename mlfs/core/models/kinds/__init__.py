"""The kinds of model, one registry keyed by `kind`: the one place a kind plugs in.

A kind of model (knob models, predictors, ...) is one `ModelKind` entry here and one
folder in this package (`knob/`, `predictor/`) holding its proxy, a `ModelProxy`
subclass (`mlfs.core.models.proxy`).  The entry says everything the mount needs to know of it:

- `serves`: which subsystems it serves, a predicate on the `Subsystem` (a subsystem's
  kinds are the entries that serve it, in registry order; the first is the kind a
  plain `mkdir models/NAME` makes, and `echo KIND > models/NAME/kind` turns a model
  that was never started into another kind the subsystem serves);
- `files`: the files of its model directory beyond the ones every model has
  (control, state, kind, mode, mode_switching, recommend, policy, efficiency,
  errors, recommendations/, feedback/);
- `proxy`: its proxy class;
- `sets_knobs`: whether its models take part in a tick's plan (`wants_ml`,
  `decide`) and learn from the tick's dataset row (`record`);
- `after_tick`: what its models do once a tick ran (`TickDone`), e.g. a predictor
  scores the tick's records;
- `metrics`: the kind's own metric families, beside the ones every model has;
- `conformance`: what tests/mount/test_kind_conformance.py needs to exercise it (a
  subsystem that it serves, a valid and an invalid input), so a kind added here is
  checked by the suite with no edit of the suite.

The trainers (`mlfs.trainers.kinds`), the fleet (`mlfs.fleet.kinds`) and the demos
(`mlfs.demos`) keep their own small tables keyed by the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from mlfs.abi import Subsystem
from mlfs.base.tables import add_entry

from ..proxy import ModelProxy
from .anomaly.proxy import AnomalyProxy, anomaly_metrics
from .knob.proxy import KnobProxy
from .predictor.proxy import PredictorProxy

#: the file of a model directory naming its kind (absent: the subsystem's first kind)
KIND_FILE = "kind"


@dataclass(frozen=True)
class TickDone:
    """What a tick left for the models' `after_tick` (on the trio thread)."""

    tick: int
    #: microseconds since the epoch, when the tick was recorded
    ts: int
    #: the tick's features, named as the dataset's columns
    features: dict
    #: the tick's records (a record source), None or empty when none came
    records: pa.Table | None
    #: why the subsystem is in a critical state, None when it is not
    critical: str | None


@dataclass(frozen=True)
class ModelFile:
    """One file of a kind's model directory: `read(proxy)` gives its text; a write
    goes `write(control, proxy, data)` (through the mount's one door for writes)."""

    name: str
    read: Callable[[Any], str | bytes] | None = None
    write: Callable[[Any, Any, bytes], Any] | None = None


@dataclass(frozen=True)
class Conformance:
    """What the kind conformance suite needs to exercise a kind on a real mount."""

    #: a TOML `[[subsystem]]` table of a subsystem this kind serves (the suite adds
    #: its fast `[mount]` and `[store]` settings)
    subsystem_config: str
    #: that subsystem's name in the mount
    subsystem: str
    #: a write to `recommend` a started model accepts
    valid_input: bytes
    #: a write to `recommend` refused with EINVAL (and a line in `errors`)
    invalid_input: bytes


@dataclass(frozen=True)
class ModelKind:
    """One kind of model, as the mount runs it."""

    name: str
    description: str
    serves: Callable[[Subsystem], bool]
    proxy: type[ModelProxy]
    conformance: Conformance
    files: tuple[ModelFile, ...] = ()
    sets_knobs: bool = False
    after_tick: Callable[[Any, TickDone], None] | None = None
    #: `metrics(proxy, writer, labels)`: writer.metric(name, type, help, value, **labels)
    metrics: Callable[[Any, Any, dict], None] | None = None


def _knob_metrics(proxy: KnobProxy, w, labels: dict) -> None:
    policy = proxy.policy
    if policy:
        w.summary("mlfs_model_policy_inference_seconds",
                  "In-process policy inference per ML tick (rate of _sum / rate of "
                  "_count = the mean over any range).",
                  round(policy.seconds, 6), policy.decisions, **labels)


def _predictor_metrics(proxy: PredictorProxy, w, labels: dict) -> None:
    for source in ("model", "rule"):
        w.metric("mlfs_model_alerts_total", "counter",
                 "Alerts a predictor raised, by whose they were (its mode decides).",
                 proxy.alerts_raised[source], source=source, **labels)


_SIM_READAHEAD = """
[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 1
tick_seconds = 0.02
"""

_SIM_DISKS = """
[[subsystem]]
backend = "sim.disks"
seed = 7
drives = 200
tick_seconds = 0.02
"""

#: every kind the mount knows, in the order a subsystem's kinds are listed
KINDS: dict[str, ModelKind] = {}


def register(kind: ModelKind) -> ModelKind:
    """Add a kind (its name must be new); returns it."""
    return add_entry(KINDS, kind, "kind")


register(ModelKind(
    name="knob",
    description="sets the subsystem's knobs; judged against the default rule's ticks",
    serves=lambda sub: not sub.targets,
    proxy=KnobProxy,
    files=(ModelFile("knobs", read=lambda p: " ".join(p.controlled) + "\n",
                     write=lambda control, p, data: control.set_knobs(p, data)),),
    sets_knobs=True,
    metrics=_knob_metrics,
    conformance=Conformance(_SIM_READAHEAD, "sim.readahead",
                            b"read_ahead_kb=512\n", b"read_ahead_kb=banana\n"),
))

register(ModelKind(
    name="predictor",
    description="forecasts a target's events on the records; judged beside its rule",
    serves=lambda sub: bool(sub.targets),
    proxy=PredictorProxy,
    files=(ModelFile("alerts", read=lambda p: p.alerts_text()),),
    after_tick=lambda p, done: p.observe(done.tick, done.records),
    metrics=_predictor_metrics,
    conformance=Conformance(_SIM_DISKS, "sim.disks",
                            b"drive_id=5 target=failure p=0.9\n",
                            b"drive_id=5 target=failure p=1.5\n"),
))

register(ModelKind(
    name="anomaly",
    description="scores every record row with an isolation forest; judged beside the "
                "target's threshold rule on the target's events",
    serves=lambda sub: bool(sub.targets),
    proxy=AnomalyProxy,
    files=(ModelFile("anomalies", read=lambda p: p.anomalies_text()),),
    after_tick=lambda p, done: p.observe(done.tick, done.records),
    metrics=anomaly_metrics,
    conformance=Conformance(_SIM_DISKS, "sim.disks", b"alert_score=0.7\n",
                            b"alert_score=1.5\n"),
))


def kinds_serving(subsystem: Subsystem) -> list[str]:
    """The kinds a subsystem serves, in registry order (the first: a plain mkdir's)."""
    return [name for name, kind in KINDS.items() if kind.serves(subsystem)]


def kind_of(proxy: ModelProxy) -> ModelKind:
    return KINDS[proxy.kind]


__all__ = ["KINDS", "KIND_FILE", "Conformance", "ModelFile", "ModelKind", "TickDone",
           "kind_of", "kinds_serving", "register"]
