"""Time helpers shared by rows, events and the errors file."""

from __future__ import annotations

import datetime as _dt
import time


def now_us() -> int:
    """Wall-clock microseconds since the epoch (the dataset's `ts` unit)."""
    return time.time_ns() // 1000


def rfc3339(us: int | None = None) -> str:
    """RFC 3339 UTC with microseconds, e.g. 2026-11-29T17:00:00.123456Z."""
    if us is None:
        us = now_us()
    stamp = _dt.datetime.fromtimestamp(us / 1e6, tz=_dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
