"""What a declared subsystem costs per tick, against the hand-written linux.vm.

Both read the same kernel files (/proc/vmstat, /proc/meminfo, /proc/pressure/*)
and derive the same features (the declaration is docs/examples/
linux-vm-declared.toml); `step` runs with measure_seconds = 0 (no sleep), so
the time is the reading and deriving alone.  Observe-only: nothing is written.

    python -m tests.bench.declared_cost [--ticks N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tomllib
from pathlib import Path

from mlfs.backends import create_subsystems
from mlfs.backends.linux.vm import LinuxVM

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "linux-vm-declared.toml"


def per_tick_us(subsystem, ticks: int) -> float:
    started = time.perf_counter()
    for _ in range(ticks):  # the default algorithm each tick, as the proxy runs it
        subsystem.step(subsystem.default_knobs(None))
    return (time.perf_counter() - started) / ticks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    entry = tomllib.loads(EXAMPLE.read_text())["subsystem"][0]
    declared, = create_subsystems([dict(entry, measure_seconds=0)])
    vm = LinuxVM(measure_seconds=0)
    results: dict[str, list[float]] = {"linux.vm": [], "declared": []}
    for _ in range(args.rounds):  # interleaved, so load on the machine hits both alike
        results["linux.vm"].append(per_tick_us(vm, args.ticks))
        results["declared"].append(per_tick_us(declared, args.ticks))
    declared.close()
    vm.close()
    for name, values in results.items():
        print(f"{name:9s} median {statistics.median(values):7.1f} us/tick "
              f"(min {min(values):.1f}, max {max(values):.1f}; {args.rounds} x {args.ticks} "
              f"ticks, {len(vm.features if name == 'linux.vm' else declared.features)} "
              "features)")
    ratio = statistics.median(results["declared"]) / statistics.median(results["linux.vm"])
    print(f"declared / hand-written: x{ratio:.2f}")


if __name__ == "__main__":
    main()
