"""What a bench run measures and how often: the plan (full or --quick) and the names it uses."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1_000_000
MiB = 1 << 20
SUBSYSTEMS = ("sim.readahead", "sim.readahead-2", "sim.readahead-3")
BIG = SUBSYSTEMS[0]  # holds the big portion; nothing else touches its dataset
STEER = SUBSYSTEMS[1]  # control writes, events and the concurrency writer go here
PORTION = "0000000001.parquet"
MODEL = "bench"
SENTINEL_MODEL = "bench-end"
RA_VALUES = (0, 16, 64, 128, 256, 512, 1024, 2048, 4096)


# ---- plan ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How much one run does: the full run, or --quick for CI (under a minute)."""

    quick: bool
    file_mib: int
    cold_reps: int
    warm_per_mount: int
    query_reps: int
    control_rounds: int
    control_writes: int
    event_rounds: int
    event_writes: int
    concurrency_seconds: float
    ingest_reps: int
    ingest_ticks: int
    footprint_seal_seconds: float
    footprint_warmup: float
    footprint_windows: int
    footprint_window_seconds: float
    records_rows: int
    records_batch: int
    records_reps: int
    capture_ios: int
    capture_reps: int


#: the footprint mount seals every `footprint_seal_seconds` (the full run: the default
#: 10 s); its warm-up runs past the first seal, whose one-off imports are start-up cost,
#: not the steady state measured.  --quick seals every 4 s: a smoke run's figures include
#: more seals per second than an operator's mount pays
FULL = Plan(quick=False, file_mib=256, cold_reps=5, warm_per_mount=2, query_reps=7,
            control_rounds=5, control_writes=1000, event_rounds=5, event_writes=200,
            concurrency_seconds=30.0, ingest_reps=5, ingest_ticks=20_000,
            footprint_seal_seconds=10.0, footprint_warmup=12.0, footprint_windows=6,
            footprint_window_seconds=10.0, records_rows=3_000_000, records_batch=50_000,
            records_reps=5, capture_ios=200_000, capture_reps=3)
QUICK = Plan(quick=True, file_mib=64, cold_reps=3, warm_per_mount=2, query_reps=3,
             control_rounds=3, control_writes=200, event_rounds=3, event_writes=50,
             concurrency_seconds=5.0, ingest_reps=3, ingest_ticks=4_000,
             footprint_seal_seconds=4.0, footprint_warmup=5.0, footprint_windows=3,
             footprint_window_seconds=2.0, records_rows=300_000, records_batch=50_000,
             records_reps=3, capture_ios=30_000, capture_reps=1)
