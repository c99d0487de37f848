"""The subsystem interface every backend implements.

A subsystem is what the ml-lib proposal calls a kernel subsystem: a state that
can be sampled (features), knobs that can be set, a default algorithm (the
human-made policy) and an objective measured per tick.  The proxy drives it
one tick at a time and never learns anything about its internals; everything
here is synchronous and FUSE-free so it runs in tests and benchmarks as fast
as the backend allows (the simulated one runs in virtual time).
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Literal

KnobValue = int | str
_DECIMAL = re.compile(r"-?[0-9]{1,18}")


class KnobValueError(ValueError):
    """A knob value is malformed or outside its range; str(err) is the reason."""


@dataclass(frozen=True)
class Knob:
    """One tunable setting: an integer range or a choice among words."""

    name: str
    type: Literal["int", "choice"]
    default: KnobValue
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""

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
        return out


@dataclass(frozen=True)
class Objective:
    name: str
    unit: str
    goal: Literal["max", "min"] = "max"


@dataclass
class Sample:
    """What one tick produced.

    `features` must have exactly the keys of `Subsystem.features`; values are
    numbers (float or int).  `critical` is a reason string when the subsystem
    is in a critical state (e.g. memory pressure above threshold): the proxy
    then puts every model into emergency and runs the default algorithm.
    `extra` may carry `refused` ({knob: reason}: a write the kernel refused)
    and `foreign` ({knob: reason}: a value changed behind mlfs's back, which
    the backend no longer touches); the proxy reports both as `knob` events.
    """

    features: dict[str, float]
    objective: float
    critical: str | None = None
    extra: dict = field(default_factory=dict)


class Subsystem(abc.ABC):
    """One subsystem served under MOUNT/<name>/."""

    #: file-name safe, e.g. "sim.readahead", "linux.vm", "linux.block.sda"
    name: str
    backend: str
    description: str
    #: wall-clock seconds between ticks when served by a mount
    tick_seconds: float
    objective: Objective
    #: knob name -> Knob, in a stable order (the dataset's column order)
    knobs: dict[str, Knob]
    #: feature name -> "float64" | "int64", in a stable order
    features: dict[str, str]

    def default_knobs(self, last: Sample | None) -> dict[str, KnobValue]:
        """The default (human-made) algorithm: knob values for the next tick.

        The stock values unless a backend has a smarter heuristic; `last` is the
        previous tick's sample (None on the first tick).
        """
        return {name: knob.default for name, knob in self.knobs.items()}

    @abc.abstractmethod
    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        """Apply `knobs`, let the subsystem run one tick, and sample it.

        Simulated backends advance virtual time by one tick and return at once;
        real backends apply the knobs, then measure the period since the last
        call.  Must not raise for ordinary conditions; a knob the kernel refused
        is reported in `Sample.extra["refused"]`.
        """

    def release(self, knobs: list[str]) -> None:
        """No model controls `knobs` any more: real backends restore them now.

        The next tick would apply the default algorithm anyway; this makes
        `stop`/`rmdir` of a model put the original values back at once.
        """
        return None

    def close(self) -> None:
        """Stop: real backends restore every original knob value here."""
        return None  # simulated backends have nothing to restore
