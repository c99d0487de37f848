"""The fleet training of each kind of model, keyed as `mlfs.core.models.kinds.KINDS`.

`mlfs fleet train` reads the subsystem's `info` as its hosts pushed it, takes the
first of the kinds it lists (`kind_of`) and runs that kind's fleet trainer on the
Dask cluster; every kind publishes the same way (`train.publish`: the policy, then
its card).  A kind's fleet training is one `FleetKind` entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlfs.base.tables import add_entry, load_target


@dataclass(frozen=True)
class FleetKind:
    """One kind's fleet training.

    `trainer` is "module:function", imported when it runs; it is called as
    `function(store, subsystem, info, pairs, scheduler, *, folds, n_workers,
    num_boost_round, since, until, fit_timeout, key, say, dashboard, started)` and
    returns the published card (`train.publish`), or raises `train.TrainError`."""

    name: str
    trainer: str
    #: the portions it reads from the store: `dataset` (one row a tick) or `records`
    reads: str = "dataset"
    #: "module:function" refusing (Refused) a policy text of this kind the daemon would
    #: refuse: applied before a policy is published and after it is pulled
    verifier: str = "mlfs.base.verifier:verify"

    def load(self) -> Callable[..., dict[str, Any]]:
        return load_target(self.trainer)


FLEET_KINDS: dict[str, FleetKind] = {}


def register(kind: FleetKind) -> FleetKind:
    return add_entry(FLEET_KINDS, kind, "fleet kind")


register(FleetKind("knob", "mlfs.fleet.knob_train:train_knob_policy", "dataset"))
register(FleetKind("predictor", "mlfs.fleet.predictors:train_predictor_policy", "records"))
register(FleetKind("anomaly", "mlfs.fleet.anomaly:train_anomaly_policy", "records",
                   "mlfs.core.models.kinds.anomaly.forest:verify_forest"))


def verify_policy(kind: str | None, data: bytes | str) -> None:
    """Refuse (Refused) a policy text its card's `kind` would not run (a card without
    one is a LightGBM policy's)."""
    entry = FLEET_KINDS.get(kind or "knob", FLEET_KINDS["knob"])
    load_target(entry.verifier)(data.encode() if isinstance(data, str) else data)


def kind_of(info: dict, wanted: str | None = None) -> str:
    """The kind a fleet round trains: `wanted` if the subsystem serves it, else the first
    its `info` lists.  An `info` pushed before kinds were listed names none: a
    subsystem with targets had predictors, any other knob models."""
    kinds = info.get("kinds")
    if not isinstance(kinds, list) or not kinds:
        kinds = ["predictor"] if info.get("targets") else ["knob"]
    if wanted is not None:
        if wanted not in kinds:
            raise ValueError(f"the subsystem serves {', '.join(map(str, kinds))}, not {wanted}")
        return wanted
    return str(kinds[0])


__all__ = ["FLEET_KINDS", "FleetKind", "kind_of", "register", "verify_policy"]
