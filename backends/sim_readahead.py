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

Throughput model and calibration
--------------------------------
Measurements on this machine's loop device (ext4 on loop, direct-io, 4 KiB
buffered reads, cold cache), in MiB/s; the objective is reported in these
numbers under the unit "MB/s":

=================  =========  =========  ===========  ===========  ==================
phase              ra=0       ra=128     ra=512       ra=4096      best (model)
=================  =========  =========  ===========  ===========  ==================
sequential  meas.  44-47      815-1113   -            416-1471
sequential  model  45.5       960        1120         940          1024 KiB: 1150
random_pread meas. 48-53      50-57      -            43-49
random_pread model 50.5       53.5       50.5         46           64 KiB: 55.5
random_mmap meas.  37-49      115-152    -            246-258 (*)
random_mmap model  43         133        200          140          512 KiB: 200
strided     model  45.5       240        70           58.8         32 KiB: 325
=================  =========  =========  ===========  ===========  ==================

(*) the measured mmap file (32 MiB asked; device read 32 / 125 / 128 MiB at
ra 0 / 128 / 4096) was small enough to end up fully cached; with a file larger
than memory the extra reads of a 4 MiB window are waste that evicts useful
pages, so the model keeps the measured ordering 0 < 128 < 4096 but puts the
best at 512 KiB and 4096 clearly (30%) below it.

Each curve is a smooth function of ``x = log2(1 + read_ahead_kb)``: a
shape-preserving (Fritsch-Carlson PCHIP) interpolation of log-throughput through
anchor points, so it passes exactly through the calibration values, never
overshoots, and has its maximum at an anchor.  The anchors between the
measured points have a mechanistic reading:

- sequential: a request of s KiB costs ``L + s/B`` with L = 85 us and
  B = 2.7 GiB/s (the two constants that reproduce 45.5 MiB/s at 4 KiB requests
  and 960 MiB/s at 128 KiB); that gives the anchors at 16/32/64 KiB (180 / 325 /
  580).  Beyond 128 KiB fewer, larger requests still help a little (best
  1150 at 1 MiB, "slightly above" 128's level) until queueing and the
  application stalling on the tail of huge windows cost (940 at 4 MiB, the
  middle of the measured 416-1471).
- random_pread: readahead pages are almost never used; a small window sometimes
  catches a neighbour (best 55.5 at 64 KiB), larger windows cost device time
  for nothing (46 at 4 MiB, measured 43-49).
- random_mmap: fault-around/read-around brings neighbouring pages that the
  locality of the access pattern then hits (the curve rises to 200 at
  512 KiB); larger windows under memory pressure evict the hot pages before
  they are used again (178 / 155 / 140 at 1 / 2 / 4 MiB).
- strided: derived from the sequential curve, not anchored: the device reads
  requests of ``s = max(4, ra)`` KiB at the sequential rate, of which the
  application uses ``min(1, 32/s)`` (one record per window), and at least
  32/512 once the window spans whole strides.  Best exactly when the window
  matches the record (32 KiB: 325); 128 KiB reads 4x the bytes (240, 26% worse);
  512 KiB and more stream the whole file for 1/16 of it (~70).
- mixed: the time-shared mean of sequential and random_pread.

Measurement noise is multiplicative lognormal, ``exp(noise*z - noise**2/2)``,
so its mean is 1 and `expected_objective` is the true mean of the next sample.
Over 5,000 ticks (seeds 0-29, noise-free expectations), the oracle
(`best_knob_for_phase` each tick) beats the stock 128 KiB by 23-27% (mean 25%)
and the best single static value (1024 KiB) by 13-26% (mean 19%).
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

__all__ = [
    "BACKEND",
    "FEATURES",
    "MAX_RA_KB",
    "PHASES",
    "RA_GRID",
    "SimReadahead",
    "throughput_curve",
]

#: every phase the simulator knows; the default workload uses the first four
PHASES: tuple[str, ...] = ("sequential", "random_pread", "random_mmap", "strided", "mixed")

MAX_RA_KB = 4096

#: the oracle's candidate values: 0 and the powers of two 4 .. 4096
RA_GRID: tuple[int, ...] = (0,) + tuple(2**k for k in range(2, 13))

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

# Anchor points (read_ahead_kb, MiB/s) of the curves; see the module docstring.
_ANCHORS: dict[str, tuple[tuple[int, float], ...]] = {
    "sequential": (
        (0, 45.5), (4, 47.0), (16, 180.0), (32, 325.0), (64, 580.0), (128, 960.0),
        (256, 1060.0), (512, 1120.0), (1024, 1150.0), (2048, 1080.0), (4096, 940.0),
    ),
    "random_pread": (
        (0, 50.5), (8, 52.5), (32, 54.5), (64, 55.5), (128, 53.5), (512, 50.5),
        (4096, 46.0),
    ),
    "random_mmap": (
        (0, 43.0), (16, 68.0), (64, 105.0), (128, 133.0), (256, 170.0), (512, 200.0),
        (1024, 178.0), (2048, 155.0), (4096, 140.0),
    ),
}

_STRIDED_RECORD_KB = 32
_STRIDED_STRIDE_KB = 512
_PAGE_KB = 4
_FILE_PAGES = 16 * 1024 * 1024 // _PAGE_KB  # the 16 GiB file of the random phases

# Per-phase workload profile behind the features (what a tracer like KML sees):
# application request size (KiB), mean |delta| of successive request offsets
# (pages), log10(1 + variance of the deltas), share of requests that follow
# the previous one, base memory pressure, background major faults per second.
_PROFILE: dict[str, dict[str, float]] = {
    "sequential": {"req_kb": 4, "delta": 1.0, "logvar": 1.5, "seq": 0.97,
                   "pressure": 0.30, "faults": 20},
    "random_pread": {"req_kb": 4, "delta": _FILE_PAGES / 3, "logvar": 12.4, "seq": 0.003,
                     "pressure": 0.22, "faults": 20},
    "random_mmap": {"req_kb": 4, "delta": 5.0e5, "logvar": 11.7, "seq": 0.08,
                    "pressure": 0.82, "faults": 0},
    "strided": {"req_kb": _STRIDED_RECORD_KB, "delta": _STRIDED_STRIDE_KB / _PAGE_KB,
                "logvar": 0.3, "seq": 0.01, "pressure": 0.35, "faults": 20},
    "mixed": {"req_kb": 4, "delta": 7.0e5, "logvar": 12.1, "seq": 0.5,
              "pressure": 0.38, "faults": 20},
}

_NOISE_BLOCK = 1024  # ticks of measurement noise drawn at once (speed)
_NOISE_WIDTH = 8  # standard normals per tick, whatever the knob


def _pchip(xk: np.ndarray, yk: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Shape-preserving piecewise cubic Hermite interpolation (Fritsch-Carlson).

    The same interpolant as scipy's PchipInterpolator, written out because
    scipy is not a dependency.  Shape-preserving matters here: the curve
    never overshoots the anchors, so each phase's best value is an anchor.
    """
    h = np.diff(xk)
    delta = np.diff(yk) / h
    n = len(xk)
    d = np.zeros(n)
    for k in range(1, n - 1):
        if delta[k - 1] * delta[k] > 0:
            w1 = 2 * h[k] + h[k - 1]
            w2 = h[k] + 2 * h[k - 1]
            d[k] = (w1 + w2) / (w1 / delta[k - 1] + w2 / delta[k])

    def end(h0: float, h1: float, m0: float, m1: float) -> float:
        slope = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
        if np.sign(slope) != np.sign(m0):
            return 0.0
        if np.sign(m0) != np.sign(m1) and abs(slope) > abs(3 * m0):
            return 3 * m0
        return slope

    if n > 2:
        d[0] = end(h[0], h[1], delta[0], delta[1])
        d[-1] = end(h[-1], h[-2], delta[-1], delta[-2])
    else:
        d[:] = delta[0]
    i = np.clip(np.searchsorted(xk, x, side="right") - 1, 0, n - 2)
    t = (x - xk[i]) / h[i]
    t2, t3 = t * t, t * t * t
    return ((2 * t3 - 3 * t2 + 1) * yk[i] + (t3 - 2 * t2 + t) * h[i] * d[i]
            + (-2 * t3 + 3 * t2) * yk[i + 1] + (t3 - t2) * h[i] * d[i + 1])


def _build_curves() -> dict[str, list[float]]:
    """Noise-free MiB/s for every phase and every integer read_ahead_kb 0..4096.

    Tabulated once so a tick is a list lookup, not an interpolation.
    """
    ra = np.arange(MAX_RA_KB + 1, dtype=float)
    x = np.log2(1.0 + ra)
    out: dict[str, np.ndarray] = {}
    for phase, anchors in _ANCHORS.items():
        kb = np.array([a for a, _ in anchors], dtype=float)
        mib = np.array([b for _, b in anchors], dtype=float)
        out[phase] = np.exp(_pchip(np.log2(1.0 + kb), np.log(mib), x))
    window = np.maximum(float(_PAGE_KB), ra)
    useful = np.maximum(_STRIDED_RECORD_KB / _STRIDED_STRIDE_KB,
                        np.minimum(1.0, _STRIDED_RECORD_KB / window))
    out["strided"] = out["sequential"] * useful
    out["mixed"] = 0.5 * (out["sequential"] + out["random_pread"])
    return {phase: curve.tolist() for phase, curve in out.items()}


_CURVES = _build_curves()


def _check_phase(phase: str) -> None:
    if phase not in _CURVES:
        raise ValueError(f"unknown phase {phase!r}; known: {' '.join(PHASES)}")


def throughput_curve(phase: str, read_ahead_kb: int) -> float:
    """Noise-free throughput (MiB/s) of `phase` at nominal intensity.

    The calibrated response curve itself, for tests, plots and benchmarks that
    want the model rather than one tick of it.
    """
    _check_phase(phase)
    return _CURVES[phase][min(MAX_RA_KB, max(0, int(read_ahead_kb)))]


def _hit_ratio(phase: str, ra: int) -> float:
    """Share of application page reads served from the page cache (noise-free).

    Mechanistic per phase: a sequential reader hits every page of a window
    but the first; random preads almost never hit; mmap faults hit through
    read-around locality until big windows evict the hot pages; a strided
    reader hits the pages of its record that the window covered.
    """
    window = max(_PAGE_KB, ra)
    if phase == "sequential":
        return 1.0 - _PAGE_KB / window
    if phase == "random_pread":
        return 0.02 + 0.04 * (1.0 - math.exp(-ra / 64.0))
    if phase == "random_mmap":
        return 0.15 + 0.75 * (1.0 - math.exp(-ra / 256.0)) * math.exp(-ra / 16384.0)
    if phase == "strided":
        return 1.0 - _PAGE_KB / min(window, _STRIDED_RECORD_KB)
    return 0.5 * (_hit_ratio("sequential", ra) + _hit_ratio("random_pread", ra))


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
            _check_phase(phase)
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
        return _CURVES[self._phase][ra] * self._intensity()

    @staticmethod
    def best_knob_for_phase(phase: str) -> int:
        """The oracle's read_ahead_kb for `phase`: argmax of its curve over RA_GRID."""
        _check_phase(phase)
        curve = _CURVES[phase]
        return max(RA_GRID, key=lambda ra: (curve[ra], -ra))

    # ---- the Subsystem interface ---------------------------------------------------
    def step(self, knobs: dict[str, KnobValue]) -> Sample:
        """Run one virtual second of the current phase with `knobs` and sample it."""
        ra, refused = self._knob(knobs)
        self._ra = ra
        self._applied.append(ra)
        applied, ra = ra, self._applied[0]  # what the workload feels (carry_over_ticks)
        phase = self._phase
        prof = _PROFILE[phase]
        z = self._noise()
        intensity = self._intensity()
        expected = _CURVES[phase][ra] * intensity
        sigma = self.noise
        objective = expected * math.exp(sigma * z[0] - 0.5 * sigma * sigma)

        x = math.log2(1.0 + ra) / 12.0  # 0..1 over the knob's range
        requests_mean = objective * 1024.0 / prof["req_kb"]
        requests = max(0, round(requests_mean + math.sqrt(requests_mean) * z[1]))
        hit = min(1.0, max(0.0, _hit_ratio(phase, ra) + 0.01 * z[2]))
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
