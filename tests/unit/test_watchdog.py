"""The daemon's watchdog rule: which subsystem's ticks count as stuck (mlfs/daemon.py)."""

from __future__ import annotations

import time
from pathlib import Path

from mlfs.backends.sim_readahead import SimReadahead

from mlfs.config import load_config
from mlfs.core.mount.exchange import Exchange
from mlfs.daemon import watchdog_interval, wedged


def test_a_subsystem_late_by_three_ticks_is_wedged_an_hourly_one_is_not(tmp_path: Path):
    fast = SimReadahead(name="fast", tick_seconds=0.5)
    hourly = SimReadahead(name="hourly", tick_seconds=3600.0)
    exchange = Exchange(load_config(None), tmp_path, [fast, hourly])
    try:
        assert wedged(exchange, interval=1.0) is None
        exchange.runtimes["hourly"].last_tick_at = time.monotonic() - 600  # 10 min: fine
        assert wedged(exchange, interval=1.0) is None
        exchange.runtimes["fast"].last_tick_at = time.monotonic() - 5  # > 3 ticks, 2 pings
        assert wedged(exchange, interval=1.0).startswith("fast: no tick for")
        exchange.runtimes["fast"].unloading = True  # an unload ends its ticks on purpose
        assert wedged(exchange, interval=1.0) is None
    finally:
        exchange.close()


def test_the_watchdog_interval_is_half_of_what_systemd_asks_and_only_for_this_pid():
    import os

    assert watchdog_interval("60000000", None) == 30.0
    assert watchdog_interval("60000000", str(os.getpid())) == 30.0
    assert watchdog_interval("60000000", "1") is None  # meant for another process
    assert watchdog_interval(None, None) is None
    assert watchdog_interval("bogus", None) is None
