"""What a model asks for: the recommendation in force, and a tick's decision.

A trainer's recommendation (`recommend`, journaled when accepted) controls the
model's knobs from the next tick until its ttl runs out or a newer one
supersedes it.  On each ML tick the model's `Decision` is either that
recommendation or its policy's choice; the runtime applies it and the
feedback row names which it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlfs.abi import KnobValue


@dataclass
class Recommendation:
    id: int
    line: str
    knobs: dict[str, KnobValue]
    expect: float | None
    ttl: int | None
    first_tick: int  # the first tick it may control
    accepted_ns: int
    applied: bool = False

    def valid_at(self, tick: int) -> bool:
        return self.ttl is None or tick < self.first_tick + self.ttl


@dataclass
class Decision:
    knobs: dict[str, KnobValue]
    expected: float | None
    source: str  # "recommendation" | "policy"
    recommendation_id: int | None
