"""Latency histograms: observations counted into fixed buckets, cheap enough for every request.

Prometheus histograms (`_bucket{le=...}` cumulative, `_sum`, `_count`), so
`histogram_quantile()` gives a p99 over any range.  An observation is one bisect and
two additions; nothing is allocated.  Used for each FUSE operation and each tick.
"""

from __future__ import annotations

import bisect

#: seconds: 50 µs to 10 s, roughly ×2.5 apart (a FUSE read answers in tens of µs, a
#: tick with a blocking backend step may take seconds)
BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
           0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Histogram:
    """Counts of observations per bucket (not cumulative here), their sum and count."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last: over the largest bucket
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, observations at or below it) per bucket, `+Inf` last."""
        out, running = [], 0
        for bound, n in zip((*BUCKETS, None), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound is None else repr(bound), running))
        return out
