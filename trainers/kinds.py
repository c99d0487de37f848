"""The trainer of each kind of model, keyed as `mlfs.core.models.kinds.KINDS` is.

`mlfs train` runs `run_trainer`: it finds the model's kind from the mount (the
model directory's `kind` file, or, for a model not made yet, the first of the kinds
the subsystem's `info` lists), makes the model of that kind when asked for one that
is not the subsystem's first, and runs that kind's worker.  A kind's trainer is one
`TrainerKind` entry here and one folder beside this module (`knob/`, `predictor/`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlfs import client
from mlfs.base.tables import add_entry, load_target

#: the kind of a subsystem whose `info` cannot be read yet (its worker waits for it)
FALLBACK_KIND = "knob"


@dataclass(frozen=True)
class TrainerKind:
    """One kind's trainer worker.

    `worker` is "module:function", imported when it runs (a trainer's imports take
    seconds); the function is called as
    `function(mountpoint, subsystem, model, *, stop, max_seconds, log, seed,
    initial_policy, **options)` and returns its final statistics.  `options` names
    the kind's own options it takes (the others `mlfs train` has are left out)."""

    name: str
    worker: str
    options: frozenset[str] = frozenset()

    def load(self) -> Callable[..., dict[str, Any]]:
        return load_target(self.worker)


#: every kind's trainer (a kind with none here cannot be trained by `mlfs train`)
TRAINERS: dict[str, TrainerKind] = {}


def register(trainer: TrainerKind) -> TrainerKind:
    return add_entry(TRAINERS, trainer, "trainer kind")


register(TrainerKind("knob", "mlfs.trainers.knob.worker:run_worker",
                     frozenset({"prepare_seconds", "learning_ttl", "relative", "features"})))
register(TrainerKind("predictor", "mlfs.trainers.predictor.worker:run_predictor",
                     frozenset({"refit_seconds", "keepalive_seconds"})))
register(TrainerKind("anomaly", "mlfs.trainers.anomaly.worker:run_anomaly",
                     frozenset({"refit_seconds", "keepalive_seconds"})))


class UnknownKind(ValueError):
    """A kind no trainer serves, or one the subsystem does not serve."""


def subsystem_kinds(mountpoint: str, subsystem: str) -> list[str] | None:
    """The kinds the subsystem serves (its `info`), None when it cannot be read yet."""
    try:
        info = json.loads(client.read_attr(Path(mountpoint) / subsystem / "info"))
    except (OSError, ValueError):
        return None
    kinds = info.get("kinds") if isinstance(info, dict) else None
    return [str(k) for k in kinds] if isinstance(kinds, list) and kinds else None


def model_kind(mountpoint: str, subsystem: str, model: str) -> str | None:
    """The kind of an existing model (its `kind` file), None when there is no model."""
    try:
        return client.read_attr(Path(mountpoint) / subsystem / "models" / model
                                / "kind").strip() or None
    except OSError:
        return None


def find_kind(mountpoint: str, subsystem: str, model: str, wanted: str | None = None) -> str:
    """The kind to train: the model's own, else `wanted`, else the subsystem's first.

    UnknownKind when `wanted` has no trainer, is not served by the subsystem, or
    differs from the kind of the existing model."""
    if wanted is not None and wanted not in TRAINERS:
        raise UnknownKind(f"kind {wanted!r} has no trainer (one of {', '.join(TRAINERS)})")
    existing = model_kind(mountpoint, subsystem, model)
    if existing is not None:
        if wanted is not None and wanted != existing:
            raise UnknownKind(f"model {model!r} is a {existing}, not a {wanted}")
        return existing
    served = subsystem_kinds(mountpoint, subsystem)
    if wanted is not None:
        if served is not None and wanted not in served:
            raise UnknownKind(f"{subsystem} serves {', '.join(served)}, not {wanted}")
        return wanted
    return served[0] if served else FALLBACK_KIND


def make_model(mountpoint: str, subsystem: str, model: str, kind: str) -> None:
    """Make the model as `kind` when it does not exist and `kind` is not the one a plain
    mkdir makes (`echo KIND > kind` while it was never started)."""
    served = subsystem_kinds(mountpoint, subsystem)
    directory = Path(mountpoint) / subsystem / "models" / model
    if served is None or served[0] == kind or directory.exists():
        return
    directory.mkdir()
    client.write_line(directory / "kind", kind)


def run_trainer(mountpoint: str, subsystem: str, model: str = "lgbm", *,
                kind: str | None = None, stop: threading.Event | None = None,
                max_seconds: float | None = None,
                log: logging.Logger = logging.getLogger("mlfs.train"),  # noqa: B008
                seed: int = 0, initial_policy: str | None = None,
                **options: Any) -> dict[str, Any]:
    """Run the trainer of the model's kind (`find_kind`) until `stop` or `max_seconds`.

    `options` are kind-specific (`TrainerKind.options`); those the kind does not take
    are left out (logged).  UnknownKind as `find_kind`; what the worker raises."""
    chosen = find_kind(mountpoint, subsystem, model, kind)
    trainer = TRAINERS.get(chosen)
    if trainer is None:
        raise UnknownKind(f"model {model!r} is a {chosen}, which no trainer serves")
    make_model(mountpoint, subsystem, model, chosen)
    taken = {k: v for k, v in options.items() if k in trainer.options}
    ignored = sorted(k for k, v in options.items() if k not in trainer.options and v)
    if ignored:
        log.info("a %s trainer takes no %s; left out", chosen, ", ".join(ignored))
    return trainer.load()(mountpoint, subsystem, model, stop=stop, max_seconds=max_seconds,
                          log=log, seed=seed, initial_policy=initial_policy, **taken)


__all__ = ["TRAINERS", "TrainerKind", "UnknownKind", "find_kind", "register", "run_trainer"]
