"""sim.readahead: a simulated block device + page cache under a phase-changing workload.

Why it exists: tests, the demo and benchmarks need a subsystem whose best knob
value *changes over time* in a way a model can learn from the features, that
is deterministic for a seed, and that runs in virtual time (one `step()` is one
virtual second of workload, tens of thousands of ticks per wall second).  It
also lets a benchmark ask the counterfactual question "what would the default,
a static value or an oracle have got on this very same tick"
(`expected_objective`), which a real device cannot answer.

Workload
--------
Phases follow each other in a seeded random order: the phases are shuffled into
rounds (every phase once per round, never the same phase twice in a row, also
across round boundaries), each phase lasting a seeded random number of ticks in
`phase_ticks`.  Rounds rather than independent draws keep the phase shares of a
5,000-tick run close to even, so benchmark ratios do not hinge on one seed
happening to draw few strided phases.  Within a phase the workload's intensity
(application demand: reader threads, CPU share) drifts slowly, a sinusoid of
amplitude 4-10% and period 80-400 ticks, and memory pressure drifts by 2-6%.
All of this comes from the *workload* random stream, which nothing else
touches: the phase sequence and the drift do not depend on the knob values
chosen.  Measurement noise (objective and features) comes from a second stream
that is consumed in fixed-size blocks, so the noise of tick *t* is the same
whatever the knob (common random numbers: counterfactual comparisons are fair).

`carry_over_ticks` (default 0) makes the workload feel read_ahead_kb that
many ticks late, as a reader keeps the value its files were opened with:
the knob declares it as `settle_ticks`, so benchmarks can check that the
proxy's efficiency stays honest for a knob with carry-over
(docs/results/efficiency-carryover.md).  `expected_objective` ignores it.

Phases (`PHASES`):

- ``sequential`` - 4 KiB buffered reads streaming through large files.
- ``random_pread`` - 4 KiB ``pread`` at uniformly random offsets of a 16 GiB file.
- ``random_mmap`` - random page faults on a mmap of a file larger than memory,
  with locality (hot neighbourhoods), under memory pressure.
- ``strided`` - 32 KiB records every 512 KiB (reading one column chunk per
  row group of a columnar file).
- ``mixed`` (optional, not in the default tuple) - a sequential and a random
  reader time-sharing the device.

The throughput, cache-hit and feature model of each phase, and its calibration
against a loop device, is in sim_readahead_phases.py.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import numpy as np

from mlfs.abi import (
    EXTRA_REFUSED,
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
    list_of,
    number,
    text,
    tick_seconds,
    word,
)

from .sim_readahead_phases import (
    CURVES,
    MAX_RA_KB,
    PHASES,
    PROFILE,
    RA_GRID,
    check_phase,
    hit_ratio,
    throughput_curve,
)

__all__ = [
    "BACKEND",
    "FEATURES",
    "MAX_RA_KB",
    "PHASES",
    "RA_GRID",
    "SimReadahead",
    "throughput_curve",
]

#: feature name -> dtype, in dataset column order
FEATURES: dict[str, str] = {
    "requests": "int64",
    "offset_mean_abs_delta": "float64",
    "offset_log_variance": "float64",
    "sequential_ratio": "float64",
    "major_faults": "int64",
    "cache_hit_ratio": "float64",
    "mem_pressure": "float64",
    "current_ra_kb": "int64",
}

_NOISE_BLOCK = 1024  # ticks of measurement noise drawn at once (speed)
_NOISE_WIDTH = 8  # standard normals per tick, whatever the knob


class SimReadahead(Subsystem):
    """Simulated block device + page cache; knob read_ahead_kb, objective MB/s.

    Beyond the Subsystem interface, benchmarks and demos use `phase`,
    `expected_objective`, `best_knob_for_phase` and `critical_pressure`.
    """

    backend = "sim.readahead"
    objective = Objective("throughput", "MB/s", "max")

    def __init__(
        self,
        name: str = "sim.readahead",
        seed: int = 0,
        tick_seconds: float = 0.05,
        phases: tuple[str, ...] = ("sequential", "random_pread", "random_mmap", "strided"),
        phase_ticks: tuple[int, int] = (150, 400),
        noise: float = 0.08,
        critical_pressure: float | None = None,
        carry_over_ticks: int = 0,
    ) -> None:
        phases = tuple(phases)
        if not phases:
            raise ValueError("phases: at least one phase is needed")
        for phase in phases:
            check_phase(phase)
        lo, hi = (int(v) for v in phase_ticks)
        if not 1 <= lo <= hi:
            raise ValueError(f"phase_ticks: need 1 <= min <= max, got {phase_ticks!r}")
        if noise < 0:
            raise ValueError(f"noise: must be >= 0, got {noise!r}")
        self.name = name
        self.seed = seed
        self.tick_seconds = float(tick_seconds)
        self.phases = phases
        self.phase_ticks = (lo, hi)
        self.noise = float(noise)
        self.critical_pressure = critical_pressure
        self.description = (
            "simulated block device + page cache (loop-device calibrated) under a workload "
            f"changing phase ({', '.join(phases)}); each tick is one virtual second"
        )
        # carry_over_ticks: the workload feels read_ahead_kb that many ticks late (files
        # opened before a change keep the old value); declared, so the proxy can settle
        self.carry_over_ticks = int(carry_over_ticks)
        self._applied: collections.deque[int] = collections.deque(
            [128] * self.carry_over_ticks, maxlen=self.carry_over_ticks + 1)
        self.knobs = {
            "read_ahead_kb": Knob("read_ahead_kb", "int", default=128, min=0,
                                  max=MAX_RA_KB, unit="KiB",
                                  settle_ticks=self.carry_over_ticks),
        }
        self.features = dict(FEATURES)
        self.ticks = 0
        self._ra = 128
        workload, measurement = np.random.default_rng(seed).spawn(2)
        self._workload = workload
        self._measurement = measurement
        self._noise_rows: list[list[float]] = []
        self._noise_pos = 0
        self._round: list[str] = []
        self._phase = ""
        self._start_phase()

    # ---- workload (its own random stream; never sees the knobs) ------------------
    def _start_phase(self) -> None:
        """Pick the next phase and draw its length and drift."""
        rng = self._workload
        if not self._round:
            order = [self.phases[i] for i in rng.permutation(len(self.phases))]
            if len(order) > 1 and order[0] == self._phase:
                order[0], order[-1] = order[-1], order[0]
            self._round = order
        self._phase = self._round.pop(0)
        lo, hi = self.phase_ticks
        self._phase_left = int(rng.integers(lo, hi + 1))
        self._phase_t = 0
        amp, period, offset, p_amp, p_period, p_offset = rng.random(6).tolist()
        self._amp = 0.04 + 0.06 * amp
        self._omega = 2 * math.pi / (80.0 + 320.0 * period)
        self._offset = 2 * math.pi * offset
        self._p_amp = 0.02 + 0.04 * p_amp
        self._p_omega = 2 * math.pi / (80.0 + 320.0 * p_period)
        self._p_offset = 2 * math.pi * p_offset

    def _intensity(self) -> float:
        """Application demand of the next tick relative to the phase's nominal."""
        return 1.0 + self._amp * math.sin(self._omega * self._phase_t + self._offset)

    def _noise(self) -> list[float]:
        """The next tick's standard normals: a fixed count, whatever the knob."""
        if self._noise_pos >= len(self._noise_rows):
            block = self._measurement.standard_normal((_NOISE_BLOCK, _NOISE_WIDTH))
            self._noise_rows = block.tolist()
            self._noise_pos = 0
        row = self._noise_rows[self._noise_pos]
        self._noise_pos += 1
        return row

    # ---- public extras for benchmarks and demos ----------------------------------
    @property
    def phase(self) -> str:
        """The phase the next `step` runs in."""
        return self._phase

    def _knob(self, knobs: Mapping[str, KnobValue]) -> tuple[int, str | None]:
        """The read_ahead_kb to apply: clamped to range; a bad value keeps the last."""
        value = knobs.get("read_ahead_kb", self._ra)
        try:
            ra = int(value)
        except (TypeError, ValueError):
            return self._ra, f"read_ahead_kb: {value!r} is not an integer"
        return min(MAX_RA_KB, max(0, ra)), None

    def expected_objective(self, knobs: Mapping[str, KnobValue]) -> float:
        """Noise-free expected objective of the *next* tick under `knobs`.

        The counterfactual: lets a benchmark score the default, a static value
        or the oracle on exactly the workload the real run sees.
        """
        ra, _ = self._knob(knobs)
        return CURVES[self._phase][ra] * self._intensity()

    @staticmethod
    def best_knob_for_phase(phase: str) -> int:
        """The oracle's read_ahead_kb for `phase`: argmax of its curve over RA_GRID."""
        check_phase(phase)
        curve = CURVES[phase]
        return max(RA_GRID, key=lambda ra: (curve[ra], -ra))

    # ---- the Subsystem interface ---------------------------------------------------
    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        """Run one virtual second of the current phase with `knobs` and sample it."""
        ra, refused = self._knob(knobs)
        self._ra = ra
        self._applied.append(ra)
        applied, ra = ra, self._applied[0]  # what the workload feels (carry_over_ticks)
        phase = self._phase
        prof = PROFILE[phase]
        z = self._noise()
        intensity = self._intensity()
        expected = CURVES[phase][ra] * intensity
        sigma = self.noise
        objective = expected * math.exp(sigma * z[0] - 0.5 * sigma * sigma)

        x = math.log2(1.0 + ra) / 12.0  # 0..1 over the knob's range
        requests_mean = objective * 1024.0 / prof["req_kb"]
        requests = max(0, round(requests_mean + math.sqrt(requests_mean) * z[1]))
        hit = min(1.0, max(0.0, hit_ratio(phase, ra) + 0.01 * z[2]))
        if phase == "random_mmap":
            faults_mean = requests * (1.0 - hit)
        else:
            faults_mean = prof["faults"] * intensity
        major_faults = max(0, round(faults_mean + math.sqrt(faults_mean) * z[3]))
        pressure = (prof["pressure"]
                    + self._p_amp * math.sin(self._p_omega * self._phase_t + self._p_offset)
                    + (0.05 if phase == "random_mmap" else 0.02) * x
                    + 0.015 * z[4])
        pressure = min(1.0, max(0.0, pressure))
        features: dict[str, float] = {
            "requests": int(requests),
            "offset_mean_abs_delta": prof["delta"] * math.exp(0.05 * z[5]),
            "offset_log_variance": prof["logvar"] + 0.15 * z[6],
            "sequential_ratio": min(1.0, max(0.0, prof["seq"] + 0.02 * z[7])),
            "major_faults": int(major_faults),
            "cache_hit_ratio": hit,
            "mem_pressure": pressure,
            "current_ra_kb": applied,
        }
        critical = None
        if self.critical_pressure is not None and pressure > self.critical_pressure:
            critical = f"mem_pressure {pressure:.2f} > {self.critical_pressure:.2f}"
        extra: dict = {"phase": phase, "expected": expected, "intensity": intensity}
        if refused:
            extra[EXTRA_REFUSED] = {"read_ahead_kb": refused}

        self.ticks += 1
        self._phase_t += 1
        self._phase_left -= 1
        if self._phase_left <= 0:
            self._start_phase()
        return Sample(features=features, objective=objective, critical=critical, extra=extra)



#: `[[subsystem]] backend = "sim.readahead"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "seed": number(0, 2**63 - 1, integer=True),  # numpy seeds are non-negative
    "tick_seconds": tick_seconds(),
    "phase_ticks": list_of(number(1, 10**9, integer=True), 2, 2),
    # lognormal sigma: 1.0 already spreads one tick's throughput over 10x
    "noise": number(0.0, 1.0),
    # mem_pressure is a share in [0, 1]
    "critical_pressure": number(0.0, 1.0),
    "phases": list_of(word(*PHASES), 1, 64),
    "carry_over_ticks": number(0, 1000, integer=True),
}


DESCRIPTION = ("simulated block device + page cache under a phase-changing workload, "
               "in virtual time (knob read_ahead_kb)")
defaults_from(SETTINGS, SimReadahead.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked constructor arguments and the one subsystem name; SettingError."""
    kwargs = check_settings(settings, SETTINGS)
    kwargs.pop("state_dir", None)  # nothing to restore: no ledger
    if "phase_ticks" in kwargs:
        lo, hi = kwargs["phase_ticks"]
        if lo > hi:
            raise SettingError("phase_ticks", f"[{lo}, {hi}] is not [min, max]")
        kwargs["phase_ticks"] = (lo, hi)
    if "phases" in kwargs:
        kwargs["phases"] = tuple(kwargs["phases"])
    return kwargs, [kwargs.get("name", "sim.readahead")]


def factory(settings: dict) -> list[SimReadahead]:
    """`[[subsystem]] backend = "sim.readahead"`: one subsystem."""
    kwargs, _ = check(settings)
    return [SimReadahead(**kwargs)]


BACKEND = Backend(name="sim.readahead", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, kinds=("knob",),
                  example=lambda env: {"tick_seconds": 0.01})
