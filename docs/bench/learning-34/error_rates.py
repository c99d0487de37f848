"""False-decision rates under continuous monitoring: a model with no effect (gain 1.0),
pinned in a mode, the window read on every tick; how many runs ever cross
the old fixed rule (|z| >= 2) and the new anytime-valid interval (clear of 1).

    PYTHONPATH=. python docs/bench/learning-34/error_rates.py 100 3000 0.05 [WINDOW_TICKS [MODE]]

WINDOW_TICKS (default, or 0: the configuration's default) is `[modes] window_ticks`:
the most ticks of evidence the test reads (beyond it the sample slides).  MODE is
the mode pinned (collaboration by default; recommendation: 5 % default probes).
"""

import sys
import tempfile
from pathlib import Path

from mlfs.config import parse_config
from mlfs.core.exchange import Exchange
from mlfs.core.modes import efficiency_interval
from tests.unit.test_proxy_modes import Scripted, VirtualClock


def one_run(seed: int, ticks: int, noise: float, window: int | None = None,
            mode: str = "collaboration") -> tuple[bool, bool, bool, bool]:
    with tempfile.TemporaryDirectory() as d:
        sub = Scripted(seed=seed)
        sub.gain, sub.noise = 1.0, noise
        config = parse_config("[modes]\nsilence_seconds = 1e9\n"
                              + (f"window_ticks = {window}\n" if window else ""), "test")
        rt = Exchange(config, Path(d), [sub], clock=VirtualClock()).runtimes["test.modes"]
        proxy = rt.create_model("m")
        proxy.start()
        proxy.set_mode(mode.encode() + b"\n")
        proxy.recommend(b"x=1\n")
        old_up = old_down = new_up = new_down = False
        for t in range(ticks):
            rt.tick()
            if t < 100:
                continue
            stats = proxy.window.stats()
            interval = efficiency_interval(stats)
            old_up |= stats.confidence >= 2
            old_down |= stats.confidence <= -2
            new_up |= interval.known and interval.lower > 1
            new_down |= interval.known and interval.upper < 1
        rt.close()
    return old_up, old_down, new_up, new_down


def main() -> None:
    runs, ticks, noise = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    window = int(sys.argv[4]) if len(sys.argv) > 4 and int(sys.argv[4]) else None
    mode = sys.argv[5] if len(sys.argv) > 5 else "collaboration"
    totals = [sum(x) for x in zip(*(one_run(s, ticks, noise, window, mode)
                                    for s in range(runs)), strict=True)]
    print(f"{runs} runs x {ticks} ticks, {mode}, window {window or 'default'}, gain 1.0, "
          f"noise {noise}: fixed |z| >= 2 ever "
          f"crossed: up {totals[0]}, down {totals[1]}; anytime-valid interval ever clear "
          f"of 1: above {totals[2]}, below {totals[3]}")


if __name__ == "__main__":
    main()
