"""What a subsystem's runtime and its models need of the mount they serve on.

A runtime and its model proxies publish events, count errors and
recommendations, read the configuration and the clock, and start under the
operator's emergency pin when it holds.  They get exactly that, as one
`MountContext`, and never the exchange itself: the exchange builds runtimes,
runtimes build proxies, and nothing below reaches back up (no import circle,
and a test or benchmark builds a context without a mount).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from mlfs.abi import KnobValue, Subsystem
from mlfs.base.statedir import EMERGENCY_PIN_FILE
from mlfs.core.storage.store import StoreWatch

from .actions import ActionRunner
from .events import EventBus


class MountContext:
    """The mount-wide services a runtime and its models use; owned by the exchange."""

    def __init__(self, config, state_dir: Path, actions: ActionRunner,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.state_dir = Path(state_dir)
        #: seconds, for the models' trainer-silence timer (tests pass a virtual clock)
        self.clock = clock
        self.bus = EventBus()
        #: accepted, applied, rejected, ... recommendations, by status
        self.recommendations: collections.Counter[str] = collections.Counter()
        #: refused writes, by (subsystem, file); "" is the mount's root
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        #: the operator's mount-wide emergency pin (`echo emergency > MOUNT/control`);
        #: read before any model exists, so every model starts under it
        self.emergency_pinned = (self.state_dir / EMERGENCY_PIN_FILE).exists()
        #: who pulled the pin (a pin kept from before a restart counts as root's)
        self.emergency_pinned_by = 0
        #: the action commands root configured, run for predictors' alerts (actions.py):
        #: the mount's one runner, built and reaped on every tick by the exchange (a
        #: mount-wide service: no model pumps it)
        self.actions = actions
        #: how many models the mount holds now (the exchange counts them; max_models)
        self.model_count: Callable[[], int] = lambda: 0
        self._generation = 0

    def new_generation(self) -> int:
        """A number never handed out before: a re-created model is a new object."""
        self._generation += 1
        return self._generation

    def count_recommendation(self, status: str) -> None:
        self.recommendations[status] += 1

    def count_error(self, subsystem: str, file: str) -> None:
        self.errors[(subsystem, file)] += 1


class ModelOwner(Protocol):
    """What a model proxy sees of the subsystem it belongs to (`SubsystemRuntime`)."""

    name: str
    subsystem: Subsystem
    mount: MountContext
    watch: StoreWatch
    next_tick: int
    critical: str | None
    feature_columns: dict[str, str]
    knob_values: dict[str, KnobValue]

    def knob_fields(self) -> list[tuple[str, pa.DataType]]: ...

    def feature_fields(self) -> list[tuple[str, pa.DataType]]: ...

    def models_changed(self) -> None: ...

    def owner_conflict(self, proxy, knobs: list[str]) -> tuple[str, str] | None: ...
