"""The phases of sim.readahead's workload: what each does with read_ahead_kb.

Why a module of its own: this is the calibrated model of a block device and its page
cache (a throughput curve, a cache-hit ratio and a feature profile per phase), measured
on a loop device and checked by tests and benchmarks through `throughput_curve`; the
subsystem in sim_readahead.py (phase sequence, drift, noise, the Subsystem interface)
only reads it.  Changing a number here changes every benchmark's ground truth.

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

import math

import numpy as np

#: every phase the simulator knows; the default workload uses the first four
PHASES: tuple[str, ...] = ("sequential", "random_pread", "random_mmap", "strided", "mixed")

MAX_RA_KB = 4096

#: the oracle's candidate values: 0 and the powers of two 4 .. 4096
RA_GRID: tuple[int, ...] = (0,) + tuple(2**k for k in range(2, 13))

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
PROFILE: dict[str, dict[str, float]] = {
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


CURVES = _build_curves()


def check_phase(phase: str) -> None:
    if phase not in CURVES:
        raise ValueError(f"unknown phase {phase!r}; known: {' '.join(PHASES)}")


def throughput_curve(phase: str, read_ahead_kb: int) -> float:
    """Noise-free throughput (MiB/s) of `phase` at nominal intensity.

    The calibrated response curve itself, for tests, plots and benchmarks that
    want the model rather than one tick of it.
    """
    check_phase(phase)
    return CURVES[phase][min(MAX_RA_KB, max(0, int(read_ahead_kb)))]


def hit_ratio(phase: str, ra: int) -> float:
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
    return 0.5 * (hit_ratio("sequential", ra) + hit_ratio("random_pread", ra))
