"""example.cache: a simulated cache whose size is the knob (an mlfs backend).

A workload reads from a working set that drifts between small and large;
a larger cache hits more but each KiB of it costs a little (memory taken from
others), so the best size follows the working set.  Deterministic for a seed,
in virtual time: `step` returns at once (`blocking = False`).

The module is what the entry point names; it exports `BACKEND`, one
`mlfs.abi.Backend` (see docs/writing-a-backend.md).
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

DESCRIPTION = "simulated cache under a drifting working set (knob size_kb), in virtual time"


class ExampleCache(Subsystem):
    backend = "example.cache"
    blocking = False  # virtual time: step returns at once

    def __init__(self, name: str = "example.cache", seed: int = 0,
                 tick_seconds: float = 0.05, cost_per_mb: float = 0.05) -> None:
        self.name = name
        self.tick_seconds = tick_seconds
        self.description = DESCRIPTION
        self.objective = Objective("score", "hits-cost", "max")
        self.knobs = {"size_kb": Knob("size_kb", "int", default=256, min=0, max=4096,
                                      unit="KiB")}
        self.features = {"working_set_kb": "float64", "hit_ratio": "float64"}
        self._rng = random.Random(seed)
        self._cost = cost_per_mb
        self._tick = 0

    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        self._tick += 1
        size = int(knobs["size_kb"])
        # the working set drifts slowly between 64 KiB and 2 MiB
        working_set = 1024 + 960 * math.sin(self._tick / 200)
        hit = min(1.0, size / working_set) * (1 - 0.02 * self._rng.random())
        score = hit - self._cost * size / 1024
        return Sample(features={"working_set_kb": working_set, "hit_ratio": hit},
                      objective=score)


SETTINGS: Schema = {
    "name": text(64),
    "seed": number(0, 2**31, integer=True),
    "tick_seconds": tick_seconds(),
    "cost_per_mb": number(0.0, 1.0),
}
defaults_from(SETTINGS, ExampleCache.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked settings and the one subsystem name; SettingError naming the key."""
    kwargs = check_settings(settings, SETTINGS)
    name = kwargs.get("name", "example.cache")
    if not NAME.fullmatch(name):
        raise SettingError("name", f"{name!r} is not a subsystem name")
    return kwargs, [name]


def factory(settings: dict) -> list[ExampleCache]:
    kwargs, _ = check(settings)
    return [ExampleCache(**kwargs)]


BACKEND = Backend(name="example.cache", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, kinds=("knob",))
