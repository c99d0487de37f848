"""The mode machine's decisions from the efficiency: promote, demote, collapse.

Pure and FUSE-free: `transition` takes the mode and the efficiency window's
statistics and returns the switch to make (or None); the proxy calls it on
every tick past the dwell and applies the switch.  Every decision rests on
the anytime-valid interval of `mlfs.base.sequential`, so it stays valid
however often the proxy looks:

- unknown (nan, fewer than `sequential.MIN_EPISODES` episodes, no
  measurable spread, or more clean ticks in episodes that straddled a phase
  change than counted ones: phases shorter than an episode, where the few
  pairs that look clean are coincidences): no promotion, no demotion, no
  collapse; the model stays where it is (a new one in learning, at the
  learning share);
- collapse to emergency: only when the whole interval lies below
  `collapse_below` (a confident collapse; the subsystem's critical state is
  the proxy's other safety net);
- learning -> collaboration: the estimate reaches `to_collaboration` and the
  interval's lower end is at least `demote_below` (confidently not harmful);
- collaboration -> recommendation: the estimate reaches `to_recommendation`
  and the interval lies above 1 (a win the data supports), and the policy is
  proven against the incumbent at the current level, the best fixed setting
  measured there (`mlfs.core.models.incumbent`: its interval's lower end within
  `incumbent.TOLERANCE` of the incumbent's estimate; the incumbent wins ties);
- collaboration / recommendation -> learning: the estimate is below
  `demote_below` and the interval lies below 1 (a loss the data supports).

The `recommendation_confidence` and `demote_confidence` settings of the older
fixed-z rule are not used by it (docs/ABI.md, "Mode switching").
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from mlfs.base.clock import rfc3339
from mlfs.base.sequential import Interval, interval
from mlfs.core.mount.events import EventBus

from .efficiency import EfficiencyStats
from .incumbent import Standing  # or predictor.RuleStanding: the same surface

log = logging.getLogger("mlfs.proxy")

#: the `why` of mode and emergency events of the operator's mount-wide switch
OPERATOR_PIN = "pinned by the operator via MOUNT/control"
OPERATOR_RELEASE = "released by the operator via MOUNT/control"


@dataclass(frozen=True)
class Switch:
    mode: str
    why: str
    cause: str | None = None


def efficiency_interval(stats: EfficiencyStats) -> Interval:
    """The window's efficiency as the mode machine sees it (known or unknown)."""
    if stats.straddled > stats.ml_ticks + stats.reverse_ticks:  # phases shorter than
        return Interval(stats.efficiency, -math.inf, math.inf, stats.episodes, False)
    return interval(stats.efficiency, stats.confidence, stats.episodes)


def transition(mode: str, stats: EfficiencyStats, config,
               standing: Callable[[], Standing] | None = None) -> Switch | None:
    """The switch the efficiency supports from `mode` (learning, collaboration or
    recommendation), or None.  `config`: the `[modes]` settings; `standing`: the
    incumbent's (None: no incumbent, the default is the only bar)."""
    iv = efficiency_interval(stats)
    if not iv.known:
        return None
    eff = iv.estimate
    said = (f"(interval {iv.text} over {iv.episodes} episodes, "
            f"z={stats.confidence:.1f})")
    if iv.upper < config.collapse_below:
        return Switch("emergency", f"efficiency collapsed to {eff:.3f} {said}", "collapse")
    if mode == "learning":
        if eff >= config.to_collaboration and iv.lower >= config.demote_below:
            return Switch("collaboration",
                          f"efficiency {eff:.3f} >= {config.to_collaboration} {said}")
        return None
    if mode == "collaboration" and eff >= config.to_recommendation and iv.lower > 1.0:
        bar = standing() if standing is not None else None
        if bar is not None and not bar.policy_proven:
            return None  # above the default, not (yet) the best fixed setting here
        versus = "" if bar is None else bar.why
        return Switch("recommendation",
                      f"efficiency {eff:.3f} >= {config.to_recommendation} {said}{versus}")
    if eff < config.demote_below and iv.upper < 1.0:
        return Switch("learning", f"efficiency {eff:.3f} < {config.demote_below} {said}")
    return None


class ModeMachine:
    """One model's mode: automatic switching on its efficiency, pins and emergencies.

    `cause` says why a model is in emergency: "operator" (the mount-wide pin,
    only the operator releases it), "critical" (the subsystem's critical state,
    released after `emergency_cooldown_ticks` calm ticks), "collapse" (the same
    cool-down, then learning), "silent" (the trainer went quiet; its next input
    ends it) or None (pinned by a write to `mode`).  Every switch is an event.
    """

    def __init__(self, config, bus: EventBus, subsystem: str, model: str,
                 next_tick: Callable[[], int]) -> None:
        self.config = config
        self._bus, self._subsystem, self._model = bus, subsystem, model
        self._next_tick = next_tick
        self.mode = "learning"
        self.pinned: str | None = None
        self.cause: str | None = None
        #: the last switches: (time, mode, why)
        self.history: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=50)
        self.last_transition_tick = next_tick()
        self.ml_since_transition = 0
        self.calm_ticks = 0
        #: called with the last tick of the old mode at every switch: the efficiency's
        #: evidence starts again (the proxy's `EfficiencyWindow.restart`)
        self.on_switch: Callable[[int], None] | None = None

    def evidence_since(self) -> int:
        """The tick after which the efficiency counts for a decision in this mode:
        learning reads the last `window_ticks` (its trainer keeps changing the model),
        collaboration and recommendation every tick since the switch into them
        (`on_switch` starts the evidence there) up to `evidence_ticks`: a growing
        sample, the one the confidence sequence is valid for however often it is read."""
        span = (self.config.window_ticks if self.mode in ("learning", "emergency")
                else self.config.evidence_ticks)
        return self._next_tick() - 1 - span

    @property
    def switching(self) -> str:
        return "pinned" if self.pinned or self.cause == "operator" else "auto"

    def switch(self, new: str, why: str, cause: str | None = None) -> None:
        old = self.mode
        self.cause = cause if new == "emergency" else None
        if old == new:
            return
        self.mode = new
        self.last_transition_tick = self._next_tick()
        self.ml_since_transition = 0
        self.calm_ticks = 0
        if self.on_switch is not None:
            self.on_switch(self.last_transition_tick - 1)
        self.history.append((rfc3339(), new, why))
        log.info("%s/%s: mode %s -> %s (%s)", self._subsystem, self._model, old, new, why)
        self._bus.publish(self._subsystem, "mode", model=self._model, why=why,
                          **{"from": old, "to": new})
        if new == "emergency":
            self._bus.publish(self._subsystem, "emergency", model=self._model, why=why)

    def pin(self, word: str) -> None:
        """A write to `mode`: pin `word`, or `auto` (automatic switching again)."""
        if word == "auto":
            self.pinned = None
            if self.mode == "emergency" and self.cause is None:
                self.switch("learning", "automatic switching resumed")
            return
        self.pinned = word
        if self.cause not in ("critical", "operator"):  # kept for the release
            self.switch(word, "pinned by a write to mode")

    def operator_pin(self, quietly: bool = False) -> None:
        """The operator's mount-wide pin; `quietly`: a model made under it (no event)."""
        if quietly:
            self.mode, self.cause = "emergency", "operator"
            self.history.append((rfc3339(), "emergency", OPERATOR_PIN))
            return
        self.switch("emergency", OPERATOR_PIN, cause="operator")

    def operator_release(self, critical: str | None) -> None:
        """Back to the model's own pin or to automatic switching (critical: stays)."""
        if self.cause != "operator":
            return
        if critical:
            self.cause, self.calm_ticks = "critical", 0
            return
        self.switch(self.pinned or "learning", OPERATOR_RELEASE)

    def trainer_back(self, what: str) -> None:
        if self.mode == "emergency" and self.cause == "silent":
            self.switch(self.pinned or "learning", f"trainer is back ({what})")

    def update(self, critical: str | None, silent_seconds: float,
               stats: Callable[[], EfficiencyStats],
               standing: Callable[[], Standing] | None = None) -> None:
        """One tick's decision, in order of precedence: the operator, the critical
        state, the model's own pin, a cool-down, trainer silence, the efficiency."""
        config = self.config
        if self.cause == "operator":  # only the operator releases it
            return
        if critical:
            self.calm_ticks = 0
            if self.mode != "emergency" or self.cause != "critical":
                self.switch("emergency", f"critical state: {critical}", cause="critical")
            return
        if self.mode == "emergency" and self.cause == "critical":
            self.calm_ticks += 1
            if self.calm_ticks >= config.emergency_cooldown_ticks:
                self.switch(self.pinned or "learning", "critical state over")
            return
        if self.pinned:
            return
        if self.mode == "emergency":
            if self.cause == "collapse":
                self.calm_ticks += 1
                if self.calm_ticks >= config.emergency_cooldown_ticks:
                    self.switch("learning", "cool-down after efficiency collapse")
            return
        if silent_seconds > config.silence_seconds:
            self.switch("emergency", f"trainer silent for over {config.silence_seconds:g} s",
                        cause="silent")
            return
        dwell = self._next_tick() - self.last_transition_tick
        if dwell < config.min_dwell_ticks or self.ml_since_transition < config.min_ml_ticks:
            return
        found = transition(self.mode, stats(), config, standing)
        if found is not None:
            self.switch(found.mode, found.why, cause=found.cause)
