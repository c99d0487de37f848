"""The shared skeleton of a real Linux subsystem: apply knobs, then measure a window.

A backend subclasses `LinuxSubsystem`, calls `_setup` with its knob specs and
rules, and provides `snapshot` (read the counters) and `derive` (features of
a window); the `KnobController` does the safe writing
(`mlfs.backends.linux`).
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Mapping
from pathlib import Path

from mlfs.abi import Knob, KnobValue, Objective, Sample, Subsystem

from .controller import KnobController
from .knobs import KnobSpec, Rule, describe_rules


class LinuxSubsystem(Subsystem):
    """A real subsystem: knobs through a `KnobController`, features from counters.

    `step(knobs)` applies the knobs first and then measures a window of
    `measure_seconds` *after* applying them, so a dataset row's features and
    objective describe the knob values written in the same row (measuring the
    period since the previous call would credit each row with the previous
    tick's knobs).  With `measure_seconds = 0` it measures the period since the
    previous call instead (for tests and callers that pace themselves).  The
    step sleeps through its window, so `blocking = True`: the proxy runs it in
    a worker thread.
    """

    blocking = True
    #: feature -> unit, for the objective's unit
    UNITS: dict[str, str] = {}

    def _setup(self, *, name: str, specs: Mapping[str, KnobSpec], rules: Mapping[str, Rule],
               state_dir: str | Path | None, tick_seconds: float,
               measure_seconds: float | None, objective: str, goal: str,
               features: dict[str, str], choices: Mapping[str, tuple[str, ...]]) -> None:
        if not tick_seconds > 0:
            raise ValueError(f"{name}: tick_seconds must be > 0")
        if measure_seconds is None:
            measure_seconds = 0.8 * tick_seconds  # room for the proxy's own work
        if not 0 <= measure_seconds <= tick_seconds:
            raise ValueError(f"{name}: measure_seconds must be in [0, tick_seconds]")
        if objective not in features:
            raise ValueError(f"{name}: objective {objective!r} is not a feature "
                             f"({', '.join(features)})")
        if goal not in ("max", "min"):
            raise ValueError(f"{name}: goal must be 'max' or 'min'")
        self.name = name
        self.tick_seconds = float(tick_seconds)
        self.measure_seconds = float(measure_seconds)
        self.features = dict(features)
        self.objective = Objective(objective, self.UNITS.get(objective, ""), goal)  # type: ignore[arg-type]
        self.objective_feature = objective
        self._choices = dict(choices)
        self.controller = KnobController(name, specs, rules, state_dir)
        self.knobs = {n: self._knob(n) for n in specs}
        self.safety = describe_rules(rules)
        self._last = self.snapshot()
        self._last_time = time.monotonic()

    # ---- what a backend provides ---------------------------------------------------
    @abc.abstractmethod
    def snapshot(self) -> dict | None:
        """Read the counters (None if they cannot be read right now)."""

    @abc.abstractmethod
    def derive(self, before: dict, after: dict, seconds: float) -> dict[str, float]:
        """Features of the window between two snapshots."""

    def critical_state(self, features: dict[str, float]) -> str | None:
        return None

    def _knob(self, name: str) -> Knob:
        """The knob as `info` shows it now (its range is what may be written)."""
        return self.controller.knob(name, self._choices.get(name, ()))

    # ---- the Subsystem interface -----------------------------------------------------
    def default_knobs(self, last: Sample | None) -> dict[str, KnobValue]:
        """The default algorithm: the original values (mlfs follows others' changes)."""
        return self.controller.default_values()

    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        extra = self.controller.apply(knobs)
        for name in self.knobs:  # an observed knob's one allowed value follows the kernel
            knob = self._knob(name)
            if knob != self.knobs[name]:
                self.knobs[name] = knob
        if self.measure_seconds > 0:
            before, started = self.snapshot(), time.monotonic()
            time.sleep(self.measure_seconds)
        else:
            before, started = self._last, self._last_time
        after, ended = self.snapshot(), time.monotonic()
        self._last, self._last_time = after, ended
        seconds = ended - started
        if before is None or after is None or seconds <= 0:
            features = {n: 0.0 for n in self.features}
            extra["unavailable"] = "counters could not be read"
            return Sample(features=features, objective=math.nan, extra=extra)
        features = self.derive(before, after, seconds)
        return Sample(features=features, objective=float(features[self.objective_feature]),
                      critical=self.critical_state(features), extra=extra)

    def release(self, knobs: list[str]) -> None:
        self.controller.release(knobs)

    def close(self) -> None:
        self.controller.close()


def rate(before: Mapping[str, float], after: Mapping[str, float], key: str,
         seconds: float) -> float:
    """Per-second increase of a counter (0 when missing or when it went backwards)."""
    delta = after.get(key, 0) - before.get(key, 0)
    return float(delta) / seconds if delta > 0 else 0.0
