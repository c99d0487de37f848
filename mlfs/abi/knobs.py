"""Knobs: what a subsystem lets a model set, and the grid both sides search.

The candidate grid and the tie-break (`candidate_values`, `distance_from_default`)
are defined here once: the proxy running an uploaded policy and the trainer
choosing a recommendation must pick the same setting from the same predictions,
or a policy would not do what its trainer measured.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

KnobValue = int | str
_DECIMAL = re.compile(r"-?[0-9]{1,18}")

#: at most this many candidate values per int knob
MAX_VALUES_PER_KNOB = 64
#: the longest carry-over a knob may declare (`Knob.settle_ticks`), in ticks
MAX_SETTLE = 1000
#: an int knob without a maximum is searched up to this value
_UNBOUNDED_MAX = 1 << 20


class KnobValueError(ValueError):
    """A knob value is malformed or outside its range; str(err) is the reason."""


@dataclass(frozen=True)
class Knob:
    """One tunable setting: an integer range or a choice among words.

    `settle_ticks` declares the knob's carry-over: for how many ticks after a
    change the objective still shows the previous value (dirty pages written
    back during the next ticks, a readahead size that reaches only files
    opened afterwards).  0, the default, means a change acts within its tick.
    The proxy then interleaves ML and the default in episodes and leaves the
    settling ticks out of its efficiency (mlfs/core/models/efficiency.py).
    """

    name: str
    type: Literal["int", "choice"]
    default: KnobValue
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""
    settle_ticks: int = 0

    def parse(self, text: str) -> KnobValue:
        """Turn the text of `knob=value` into a value, or raise KnobValueError."""
        if self.type == "choice":
            if text not in self.choices:
                raise KnobValueError(
                    f"{self.name}: {text!r} is not one of {' '.join(self.choices)}"
                )
            return text
        if not _DECIMAL.fullmatch(text):
            raise KnobValueError(f"{self.name}: {text!r} is not an integer (plain decimal digits)")
        value = int(text, 10)
        if self.min is not None and value < self.min:
            raise KnobValueError(f"{self.name}: {value} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise KnobValueError(f"{self.name}: {value} is above the maximum {self.max}")
        return value

    def describe(self) -> dict:
        """The knob as `info` shows it."""
        out: dict = {"type": self.type, "default": self.default}
        if self.type == "choice":
            out["choices"] = list(self.choices)
        else:
            out["min"] = self.min
            out["max"] = self.max
        if self.unit:
            out["unit"] = self.unit
        if self.settle_ticks:
            out["settle_ticks"] = self.settle_ticks
        return out

    @classmethod
    def from_info(cls, name: str, spec: Mapping[str, Any]) -> Knob:
        """The knob a subsystem's `info` describes (`describe()`'s inverse).

        A trainer only sees `info`; building the same `Knob` lets it use the
        same grid and tie-break as the proxy.  A missing default is the
        minimum (int) or the first choice.
        """
        settle = int(spec.get("settle_ticks", 0))
        if spec["type"] == "choice":
            choices = tuple(str(c) for c in spec["choices"])
            return cls(name, "choice", str(spec.get("default", choices[0] if choices else "")),
                       choices=choices, unit=str(spec.get("unit", "")), settle_ticks=settle)
        lo = spec.get("min")
        hi = spec.get("max")
        default = spec.get("default", lo or 0)
        return cls(name, "int", int(default), None if lo is None else int(lo),
                   None if hi is None else int(hi), unit=str(spec.get("unit", "")),
                   settle_ticks=settle)


def episode_ticks(settle: int) -> int:
    """Ticks one ML or default episode lasts for a carry-over of `settle` ticks (1:
    none): the first `settle` settle, the rest are measured.  The proxy interleaves in
    episodes this long (mlfs/core/models/episodes.py), and a trainer's exploration lasts
    at least one (trainers/schedule.py): a shorter one leaves no settled row."""
    return max(1, 2 * settle)


class Settling:
    """Tells settling ticks: a carry-over knob changed within its `settle_ticks`.

    `settle` maps a knob (or dataset column) to its settle ticks; knobs with
    0 are ignored.  Until k values of a knob were seen, its ticks count as
    settling (its value before is unknown).  The one rule for what
    `Knob.settle_ticks` means tick by tick: the proxy leaves these ticks out
    of its efficiency (mlfs/core/models/efficiency.py) and the trainer out of its fit
    (trainers/knob/learner.py), since both would otherwise credit a setting with
    what the previous one left behind.
    """

    def __init__(self, settle: Mapping[str, int]) -> None:
        self._recent = {name: collections.deque(maxlen=k)
                        for name, k in settle.items() if k > 0}

    def __bool__(self) -> bool:
        return bool(self._recent)

    def __call__(self, knobs: Mapping[str, object]) -> bool:
        """Is the tick run with `knobs` settling?  (Call once per tick, in order.)"""
        settling = False
        for name, recent in self._recent.items():
            value = knobs.get(name)
            if len(recent) < recent.maxlen or any(v != value for v in recent):
                settling = True
            recent.append(value)
        return settling


def _as_knob(knob: Knob | Mapping[str, Any]) -> Knob:
    return knob if isinstance(knob, Knob) else Knob.from_info("", knob)


def candidate_values(knob: Knob | Mapping[str, Any]) -> list[KnobValue]:
    """The values a policy (or a trainer) evaluates for one knob, ascending.

    int knobs: min, max, default and the powers of two in range, thinned evenly
    to at most `MAX_VALUES_PER_KNOB` (the default always kept); choice knobs:
    every choice, in `info` order.  `knob` is a Knob or its `info` entry.
    """
    knob = _as_knob(knob)
    if knob.type == "choice":
        return list(knob.choices)
    lo = int(knob.min or 0)
    hi = int(knob.max) if knob.max is not None else _UNBOUNDED_MAX
    default = int(knob.default)
    values = {lo, hi, default}
    power = 1
    while power <= hi:
        if power >= lo:
            values.add(power)
        power *= 2
    ordered = sorted(values)
    if len(ordered) > MAX_VALUES_PER_KNOB:
        import numpy as np  # only for huge ranges; keeps this module's import cheap

        picks = np.linspace(0, len(ordered) - 1, MAX_VALUES_PER_KNOB).round().astype(int)
        ordered = sorted({ordered[i] for i in picks} | {default})
    return ordered


def distance_from_default(knob: Knob | Mapping[str, Any], value: KnobValue) -> float:
    """How far a candidate moves a knob from its default: log2 steps, or 1 for another choice.

    Among candidates with exactly the best prediction, the one with the least
    total distance wins: a tree model predicts the same for every value beyond
    the last split it learnt, so "first in the grid wins" would pick the
    grid's extreme (read_ahead_kb 0) for values it never saw.
    """
    knob = _as_knob(knob)
    if knob.type == "choice":
        return 0.0 if value == knob.default else 1.0
    return abs(math.log2(1 + abs(int(value))) - math.log2(1 + abs(int(knob.default))))
