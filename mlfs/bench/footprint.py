"""The daemon's CPU and memory with three subsystems at one tick per second."""

from __future__ import annotations

import os
import statistics
import time

from .harness import Session, mount_config, progress
from .plan import Plan
from .stats import Row, summarize


def bench_footprint(session: Session, plan: Plan) -> list[Row]:
    """An idle mount, three subsystems at 1 tick/s: what it costs to keep.

    Sealing every `plan.footprint_seal_seconds`: the default 10 s in a full run.
    """
    state = session.root / "footprint-state"
    mount = session.mount("footprint", mount_config(plan.footprint_seal_seconds), state)
    try:
        progress(f"footprint: warming up {plan.footprint_warmup:g} s")
        time.sleep(plan.footprint_warmup)
        cpu, rss, anon = [], [], []
        for index in range(plan.footprint_windows):
            c0, t0 = mount.cpu_seconds(), time.monotonic()
            end = t0 + plan.footprint_window_seconds
            while time.monotonic() < end:
                memory = mount.memory_kb()
                rss.append(memory["VmRSS"] / 1024)
                anon.append(memory.get("RssAnon", 0) / 1024)
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            cpu.append(100 * (mount.cpu_seconds() - c0) / (time.monotonic() - t0))
            progress(f"footprint: window {index + 1}/{plan.footprint_windows}: "
                     f"CPU {cpu[-1]:.2f}%, RSS {rss[-1]:.0f} MB")
        peak = mount.memory_kb().get("VmHWM", 0) / 1024
    finally:
        mount.stop()
    window = f"{plan.footprint_windows} windows of {plan.footprint_window_seconds:g} s"
    return [
        Row("footprint_cpu", "footprint: daemon CPU, 3 subsystems at 1 tick/s",
            {"% of one core": summarize(cpu)}, None, None, "≤ 1%",
            statistics.median(cpu) <= 1.0,
            f"{window} after {plan.footprint_warmup:g} s of warm-up (past the first seal; "
            f"a seal every {plan.footprint_seal_seconds:g} s), "
            "utime+stime from /proc/<pid>/stat (resolution "
            f"{100 / os.sysconf('SC_CLK_TCK') / plan.footprint_window_seconds:.2f}%)"),
        Row("footprint_rss", "footprint: daemon RSS, 3 subsystems at 1 tick/s",
            {"MB": summarize(rss)}, None, None, "≤ 150 MB", max(rss) <= 150.0,
            f"VmRSS sampled each second over the {window} (MB = MiB); peak VmHWM "
            f"{peak:.0f} MB; anonymous part median {statistics.median(anon):.0f} MB",
            extra={"rss_anon_mb": summarize(anon), "vm_hwm_mb": peak}),
    ]
