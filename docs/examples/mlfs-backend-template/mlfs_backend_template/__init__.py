"""template.queue: a simulated queue whose batch size is the knob (an mlfs backend to copy).

Requests arrive at a rate that drifts; a larger batch costs less per request
but makes each wait longer, so the best batch size follows the arrival rate.
Deterministic for a seed, in virtual time: `step` returns at once.

What a backend is, in four parts (docs/writing-a-backend.md):

1. a `Subsystem` subclass: its name, knobs, features, objective and `step`;
2. `SETTINGS`, the table of checks its `[[subsystem]]` table must pass;
3. `check` (everything checked, nothing built) and `factory` (build what
   `check` accepted);
4. `BACKEND`, the one object the entry point's module exports.

Import only from `mlfs.abi`.  A real-knob backend keeps its originals in a
ledger under the mount's state directory (`uses_state_dir=True`) and puts them
back in `release` and `close`; see mlfs's own `mlfs.backends.linux`.
"""

from __future__ import annotations

import math
import random

from mlfs.abi import (
    NAME,
    Backend,
    Knob,
    KnobValue,
    Objective,
    Sample,
    Schema,
    SettingError,
    Subsystem,
    check_settings,
    defaults_from,
    number,
    text,
    tick_seconds,
)

DESCRIPTION = "simulated queue under a drifting arrival rate (knob batch), in virtual time"


class TemplateQueue(Subsystem):
    """One simulated queue; everything the core reads is set in `__init__`."""

    backend = "template.queue"
    blocking = False  # virtual time: step returns at once

    def __init__(self, name: str = "template.queue", seed: int = 0,
                 tick_seconds: float = 0.05) -> None:
        self.name = name
        self.tick_seconds = tick_seconds
        self.description = DESCRIPTION
        self.objective = Objective("latency_ms", "ms", "min")
        self.knobs = {"batch": Knob("batch", "int", default=8, min=1, max=256)}
        self.features = {"arrivals_per_s": "float64", "queued": "float64"}
        self._rng = random.Random(seed)
        self._tick = 0

    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        self._tick += 1
        batch = int(knobs["batch"])
        rate = 500 + 450 * math.sin(self._tick / 150)  # requests per second
        service_ms = 0.2 + 2.0 / batch  # per request: a batch shares a fixed cost
        wait_ms = 1000 * batch / (2 * rate)  # the mean wait for the batch to fill
        latency = (wait_ms + service_ms) * (1 + 0.05 * self._rng.random())
        return Sample(features={"arrivals_per_s": rate, "queued": rate * wait_ms / 1000},
                      objective=latency)


SETTINGS: Schema = {
    "name": text(64),
    "seed": number(0, 2**31, integer=True),
    "tick_seconds": tick_seconds(),
}
defaults_from(SETTINGS, TemplateQueue.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked settings and the one subsystem name; SettingError naming the key."""
    kwargs = check_settings(settings, SETTINGS)
    name = kwargs.get("name", "template.queue")
    if not NAME.fullmatch(name):
        raise SettingError("name", f"{name!r} is not a subsystem name")
    return kwargs, [name]


def factory(settings: dict) -> list[TemplateQueue]:
    """Build what `check` accepts (it runs again: check and factory never disagree)."""
    kwargs, _ = check(settings)
    return [TemplateQueue(**kwargs)]


BACKEND = Backend(
    name="template.queue",  # the entry point's name, in pyproject.toml
    description=DESCRIPTION,
    settings=SETTINGS,
    check=check,
    factory=factory,
    kinds=("knob",),  # its subsystems have knobs: knob models serve them
    # the conformance suite builds one instance from these settings
    example=lambda env: {"tick_seconds": 0.01},
)
