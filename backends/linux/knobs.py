"""Knob specs and the `apply` rules: which kernel file backs a knob, what may be written.

The bounds here are promise 1 of `mlfs.backends.linux` (observe-only
unless configured, never outside mlfs's hard bounds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlfs.abi import SettingError

from .files import parse_bracketed, read_text

#: an applied knob's rule: [lo, hi] for an integer knob, the writable names for a choice
Rule = tuple[int, int] | frozenset[str]


@dataclass(frozen=True)
class KnobSpec:
    """A kernel file behind a knob, with mlfs's hard bounds for it.

    `lo`/`hi` are never wider than what the kernel accepts (they may be
    narrower where the kernel's range includes nonsense, e.g. dirty_ratio 0).
    `alt_path` is a kernel-coupled twin (dirty_bytes for dirty_ratio) whose
    original is recorded too.  `priority` orders restores (lower first).
    `coupled` names knobs of the same subsystem whose value a write of this
    one changes (the scheduler resets nr_requests).  `settle_ticks`: for how
    many ticks a change still shows in the objective (mlfs/core/models/efficiency.py).
    """

    name: str
    path: Path
    type: Literal["int", "choice"] = "int"
    lo: int | None = None
    hi: int | None = None
    unit: str = ""
    alt_path: Path | None = None
    priority: int = 1
    coupled: tuple[str, ...] = ()
    #: the knob's carry-over in ticks (`mlfs.abi.Knob.settle_ticks`)
    settle_ticks: int = 0

    @property
    def format(self) -> str:
        return "bracketed" if self.type == "choice" else "plain"

    def read(self) -> str:
        return read_value(self.path, self.format)

    def kernel_choices(self) -> tuple[str, ...]:
        """For a choice knob: what the kernel offers now (bracketed listing)."""
        return parse_bracketed(read_text(self.path))[1]


def read_value(path: str | Path, fmt: str) -> str:
    text = read_text(path)
    return parse_bracketed(text)[0] if fmt == "bracketed" else text


def parse_apply(apply: object, specs: Mapping[str, KnobSpec], where: str,
                choices: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, Rule]:
    """Check an `apply` table against the knobs' hard bounds; ValueError if wrong.

    Integer knob: `[lo, hi]` with spec.lo <= lo <= hi <= spec.hi.  Choice knob:
    a non-empty list of names, each offered by the kernel (`choices`).
    """
    if apply is None:
        return {}
    if not isinstance(apply, Mapping):
        raise ValueError(f"{where}: apply must be a table like "
                         "{read_ahead_kb = [16, 4096]}")
    rules: dict[str, Rule] = {}
    for name, value in apply.items():
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"{where}: apply: unknown knob {name!r} "
                             f"(known: {', '.join(specs)})")
        if spec.type == "int":
            if (not isinstance(value, list | tuple) or len(value) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
                raise ValueError(f"{where}: apply.{name} must be [lo, hi] (integers)")
            lo, hi = int(value[0]), int(value[1])
            hard_lo = spec.lo if spec.lo is not None else lo
            hard_hi = spec.hi if spec.hi is not None else hi
            if not hard_lo <= lo <= hi <= hard_hi:
                raise ValueError(f"{where}: apply.{name} = [{lo}, {hi}] must satisfy "
                                 f"{hard_lo} <= lo <= hi <= {hard_hi}")
            rules[name] = (lo, hi)
        else:
            if (not isinstance(value, list | tuple) or not value
                    or not all(isinstance(v, str) for v in value)):
                raise ValueError(f"{where}: apply.{name} must be a list of names")
            offered = (choices or {}).get(name, ())
            unknown = [v for v in value if v not in offered]
            if unknown:
                raise ValueError(f"{where}: apply.{name}: {', '.join(unknown)} not offered by "
                                 f"the kernel ({' '.join(offered) or 'nothing'})")
            rules[name] = frozenset(value)
    return rules


def describe_rules(rules: Mapping[str, Rule]) -> str:
    """`read_ahead_kb in [16, 4096]; scheduler in {none, mq-deadline}` or observe-only."""
    if not rules:
        return "observe-only (no knob is ever written)"
    parts = []
    for name, rule in rules.items():
        if isinstance(rule, tuple):
            parts.append(f"{name} in [{rule[0]}, {rule[1]}]")
        else:
            parts.append(f"{name} in {{{', '.join(sorted(rule))}}}")
    return "applies " + "; ".join(parts) + " (others observe-only)"


def check_measure(kwargs: Mapping[str, object], default_tick: float = 1.0) -> None:
    """`measure_seconds` fits inside the tick (both already range-checked)."""
    tick = kwargs.get("tick_seconds", default_tick)
    measure = kwargs.get("measure_seconds")
    if measure is not None and measure > tick:  # type: ignore[operator]
        raise SettingError("measure_seconds", f"{measure:g} is longer than the tick "
                           f"(tick_seconds {tick:g})")

