"""Knob models: the proxy of a model that sets a subsystem's knobs.

A knob model's inputs are recommendations (`read_ahead_kb=512 [expect=..] [ttl=N]`)
or an uploaded policy over the tick's features.  On a share of ticks set by its mode
(`Interleaving`) the proxy applies what the model wants, and the default rule runs
on the others; each ML tick is judged against the default ticks around it
(`mlfs.core.models.efficiency`), fed back as a feedback row, and the efficiency
drives the mode machine.  Within collaboration and recommendation the policy may
only choose settings measured safe (`SafeSet`).
"""

from __future__ import annotations

import math
import time
import zlib

import pyarrow as pa

from mlfs.abi import KnobValue, Settling, Subsystem, episode_ticks, knob_column
from mlfs.base.errors import Refused, busy, invalid
from mlfs.base.text import decode_text, parse_recommendations

from ...decision import Decision, Recommendation
from ...efficiency import EfficiencyWindow
from ...episodes import Hold, Interleaving, pair_span
from ...incumbent import Incumbent
from ...model_files import feedback_schema
from ...policy import Policy, PolicyRemoved
from ...proxy import ModelProxy
from ...safe_set import SafeSet, restricted
from ...safe_set_file import SafeSetFile


class KnobProxy(ModelProxy):
    """A knob model's proxy: recommendations and policies in, knob settings out."""

    kind = "knob"

    @classmethod
    def default_controlled(cls, subsystem: Subsystem) -> list[str]:
        return list(subsystem.knobs)

    def _setup(self) -> None:
        subsystem = self.runtime.subsystem
        self._knob_columns = [knob_column(name) for name in subsystem.knobs]
        #: what the policy may choose in collaboration and recommendation, on the pairs
        #: measured before a restart too (safe_set_file.py)
        self.safe_file = SafeSetFile(self.directory, self._knob_columns,
                                     f"{self.runtime.name}/{self.name}")
        saved, damaged = self.safe_file.load()
        if damaged is not None:
            self._state_damaged(self.safe_file.path, damaged)
        self.safe = saved or SafeSet()
        #: the best fixed setting measured at the current level (incumbent.py)
        self.incumbent = Incumbent(self.safe, dict(zip(self._knob_columns,
                                                       subsystem.knobs, strict=True)))
        self.current: Recommendation | None = None
        # knobs with carry-over (Knob.settle_ticks): episodes and settling ticks
        self._settle = {name: knob.settle_ticks for name, knob in subsystem.knobs.items()}
        self.settling = Settling(self._settle)
        self.interleaving = Interleaving(zlib.crc32(self.name.encode()))
        self.policy_hold = Hold()
        self.window.max_span = pair_span(self.carry_over())

    def _feedback_schema(self, runtime) -> pa.Schema:
        return feedback_schema(runtime)

    def _new_window(self) -> EfficiencyWindow:
        return EfficiencyWindow(max(self.config.window_ticks, self.config.evidence_ticks),
                                self.runtime.subsystem.objective.goal,
                                self.config.unstable_baseline_ratio)

    def _on_stop(self) -> None:
        if self.current is not None:
            self._finish(self.current, "ignored", "model stopped")
            self.current = None

    def stop(self) -> None:
        super().stop()  # the window's last pairs are measured there
        if not self.destroyed:
            self.safe_file.save(self.safe)

    def closing(self) -> None:
        """The mount closes: the measured pairs are kept for the next mount."""
        if not self.destroyed:
            self.safe_file.save(self.safe)

    # ---- the knobs it controls ---------------------------------------------
    def set_knobs(self, data: bytes) -> None:
        try:
            names = decode_text(data).split()
            if not names:
                raise invalid("knobs takes one or more knob names")
            for name in names:
                if name not in self.runtime.subsystem.knobs:
                    raise invalid(f"unknown knob {name!r}")
            if len(set(names)) != len(names):
                raise invalid("a knob is named twice")
            if self.active:
                owner = self.runtime.owner_conflict(self, names)
                if owner:
                    raise busy(f"knob {owner[0]!r} is controlled by started model {owner[1]!r}")
        except Refused as exc:
            raise self.refuse("knobs", data, exc) from None
        self.controlled = [k for k in self.runtime.subsystem.knobs if k in names]
        if self.current is not None and set(self.current.knobs) - set(self.controlled):
            self._finish(self.current, "ignored", "knobs changed")
            self.current = None
        self._save()

    # ---- trainer inputs ---------------------------------------------------
    def _finish(self, rec: Recommendation, status: str, reason: str) -> None:
        self._journal(status, rec.id, rec.line, reason, rec.expect, rec.ttl)
        self.bus.publish(self.runtime.name, "recommendation", model=self.name, id=rec.id,
                         status=status, reason=reason)

    def _parse_recommend(self, data: bytes) -> list:
        return parse_recommendations(data, self.runtime.subsystem.knobs, set(self.controlled))

    def _accept(self, parsed, rec_id: int) -> None:
        """A journaled recommendation takes effect: it is the one in force from now on."""
        rec = Recommendation(rec_id, parsed.line, parsed.knobs, parsed.expect, parsed.ttl,
                             self.runtime.next_tick, time.monotonic_ns())
        if self.current is not None and self.current.valid_at(self.runtime.next_tick):
            self._finish(self.current, "superseded", f"superseded by {rec_id}")
        self.current = rec

    def withdraw(self, ids: list[int], reason: str) -> None:
        if self.current is not None and self.current.id in ids:
            self._finish(self.current, "ignored", reason)
            self.current = None

    def _build_policy(self, text: bytes) -> Policy:
        subsystem = self.runtime.subsystem
        return Policy(text, subsystem.knobs, list(self.controlled),
                      list(self.runtime.feature_columns), subsystem.objective.goal)

    # ---- the tick ---------------------------------------------------------
    def share(self) -> float:
        config = self.config
        return {
            "emergency": 0.0,
            "learning": config.learning_share,
            "collaboration": config.collaboration_share,
            "recommendation": 1.0 - config.recommendation_probe,
        }[self.mode]

    def carry_over(self) -> int:
        """The longest carry-over (settle_ticks) of the knobs this model controls."""
        return max((self._settle[k] for k in self.controlled), default=0)

    def episode_ticks(self) -> int:
        """Ticks per episode: 1, or 2k when a controlled knob carries over k ticks."""
        return episode_ticks(self.carry_over())

    def wants_ml(self) -> bool:
        """Deterministic interleaving at the mode's share (`Interleaving`).

        It decides per episode (`episode_ticks`, one tick unless a controlled
        knob carries over: efficiency.py says why).
        """
        settle = self.carry_over()
        self.window.max_span = pair_span(settle)
        return self.interleaving(self.share(), settle)

    def expire(self, tick: int) -> None:
        rec = self.current
        if rec is not None and not rec.valid_at(tick):
            self._finish(rec, "expired", f"ttl {rec.ttl} ticks ran out")
            self.current = None

    def decide(self, tick: int, features: dict | None, current: dict[str, KnobValue]
               ) -> Decision | None:
        """What ML wants on this tick, or None (then the default runs)."""
        rec = self.current
        use_rec = rec is not None and (self.policy is None
                                       or rec.accepted_ns >= self.installed.loaded_ns)
        if use_rec:
            if not rec.applied:
                rec.applied = True
                self._finish(rec, "applied", f"tick {tick}")
            return Decision(dict(rec.knobs), rec.expect, "recommendation", rec.id)
        fixed = self.incumbent.decide(tick, self.mode, self.controlled, self.policy is not None,
                                      promoted=self.modes.switching == "auto")
        if fixed is not None:  # recommendation's unproven policy, or the bandit's probe
            # {}: the default is the incumbent here, and runs as a default tick
            return Decision(fixed, None, "incumbent", None) if fixed else None
        if self.policy is not None and features is not None:
            allowed = None
            if restricted(self.mode, self.modes.switching):
                allowed = self.safe.allowed(self.policy.candidates, self.policy.grid_shape,
                                            self.policy.is_default)
            try:
                # collaboration's pairs resolve within a tick or two: there a tie steps
                # toward what the policy wants (recommendation's runs of ML ticks would
                # try each step for a whole run)
                knobs, expected = self.policy.decide(features, current, allowed,
                                                     toward_wanted=self.mode == "collaboration")
            except PolicyRemoved as exc:
                self._remove_policy(exc.reason)
                return None
            except Exception as exc:  # a policy must never stop the tick loop
                self._remove_policy(f"failed: {type(exc).__name__}: {str(exc)[:200]}")
                return None
            if self.carry_over():
                knobs, expected = self.policy_hold(tick, knobs, expected, self.episode_ticks(),
                                                   current)
            return Decision(dict(knobs), expected, "policy", None)
        return None

    def record(self, tick: int, ts: int, decision: Decision | None, objective: float,
               knobs: dict[str, KnobValue], features: dict | None) -> None:
        """After the tick ran: update the window, write feedback, maybe switch mode.

        An ML tick's feedback row waits for the next default tick, which
        completes its baseline (see efficiency.py); then it is written.
        Ticks a carry-over knob's change still settles are written but not
        counted in the efficiency.
        """
        settling = self.settling(knobs)
        if decision is None:
            self.default_ticks += 1
            if not settling:
                self.safe.default_tick(objective)
            self._write_feedback(self.window.add_default(tick, objective, settling))
            return
        self.ml_ticks += 1
        self.incumbent.ran(decision.source, objective,
                           promoted=self.modes.switching == "auto")
        self.modes.ml_since_transition += 1
        if self.state == "started":
            self._set_state("running")
        expected = decision.expected
        row = {
            "tick": tick, "ts": ts, "model": self.name, "source": decision.source,
            "recommendation_id": decision.recommendation_id,
            "expected": expected, "observed": objective,
            "error": None if expected is None else objective - expected,
        }
        for name, value in knobs.items():
            row[knob_column(name)] = value
        if features:
            row.update(features)
        self.window.add_ml(tick, objective, row, settling)

    def _write_feedback(self, pairs: list) -> None:
        for pair in pairs:
            row = pair.payload
            if row["error"] is not None:
                self.errors_abs_sum += abs(row["error"])
                self.errors_count += 1
            row["baseline"] = pair.baseline if math.isfinite(pair.baseline) else None
            row["efficiency"] = pair.ratio if math.isfinite(pair.ratio) else None
            row["efficiency_vs_incumbent"] = self.incumbent.versus(pair.ratio)
            if pair.stable:
                self.incumbent.measured({c: row.get(c) for c in self._knob_columns},
                                        pair.baseline, pair.ratio, pair.tick, row["source"],
                                        self.mode)
            self.feedback.append(row)
        if pairs and not self.destroyed:
            self.safe_file.save_now_and_then(self.safe)


__all__ = ["KnobProxy"]
