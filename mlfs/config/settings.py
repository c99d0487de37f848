"""The settings of a mount: one frozen dataclass per table of the file, and their ranges.

Why a module of its own: these classes are what the rest of mlfs receives (the daemon,
the proxies, the readers' limits) and RANGES is the one table of what each number may be,
read by the parser (parse.py) and by the JSON Schema (forms.py) alike.  A setting is
added here, once: its name, type and default in its dataclass, its range in RANGES.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlfs.base.hostid import host_id_problem
from mlfs.base.portion import StorePolicy
from mlfs.core.mount.readers import FREE_TASKS


@dataclass(frozen=True)
class ModeConfig:
    """Shares of ML ticks per mode and the thresholds of automatic switching.

    Ticks, not seconds, count dwell and cool-down, so a simulated subsystem in
    virtual time behaves exactly as a real one; only trainer silence is wall
    time (a trainer's silence is a fact about the real world).
    """

    learning_share: float = 0.10
    collaboration_share: float = 0.50
    recommendation_probe: float = 0.05
    #: learning's efficiency: the last `window_ticks` (the trainer changes its model
    #: as it learns, so older ticks judge another model)
    window_ticks: int = 300
    #: collaboration's and recommendation's: every tick since the switch into the mode,
    #: up to `evidence_ticks` (a growing sample: the sequential test stays valid)
    evidence_ticks: int = 2000
    unstable_baseline_ratio: float = 2.0
    min_ml_ticks: int = 30
    min_dwell_ticks: int = 50
    to_collaboration: float = 1.0
    to_recommendation: float = 1.05
    recommendation_confidence: float = 2.0
    demote_below: float = 0.97
    demote_confidence: float = 2.0
    collapse_below: float = 0.3
    emergency_cooldown_ticks: int = 200
    silence_seconds: float = 60.0


#: record datasets seal and wait in memory this many times a tick dataset's rows
RECORD_SEAL_FACTOR = 16


@dataclass(frozen=True)
class StoreConfig:
    seal_rows: int = 4096
    seal_seconds: float = 10.0
    feedback_seal_seconds: float = 2.0
    journal_seal_seconds: float = 30.0
    retention_bytes: int = 1 << 30
    retention_count: int = 1000
    # rows one store keeps in memory while the state dir refuses writes; at the
    # bound ticks are held (skipped, counted) and recommend gets ENOSPC
    max_waiting_rows: int = 65536
    # bytes of portions not yet shipped by a fleet pusher that retention keeps
    # beyond retention_bytes (docs/fleet.md); 0: retention never waits for it
    fleet_backlog_bytes: int = 1 << 28

    def dataset(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.seal_seconds, self.retention_bytes,
                           self.retention_count, max_waiting_rows=self.max_waiting_rows,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)

    def records(self) -> StorePolicy:
        """A record dataset's: rows arrive by the thousand per tick, columnar (a few bytes
        each in memory), so it seals at RECORD_SEAL_FACTOR x seal_rows and holds that many
        times max_waiting_rows while the state dir refuses writes."""
        return StorePolicy(self.seal_rows * RECORD_SEAL_FACTOR, self.seal_seconds,
                           self.retention_bytes, self.retention_count,
                           max_waiting_rows=self.max_waiting_rows * RECORD_SEAL_FACTOR,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)

    def feedback(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.feedback_seal_seconds, self.retention_bytes,
                           self.retention_count, max_waiting_rows=self.max_waiting_rows,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)

    def journal(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.journal_seal_seconds, self.retention_bytes,
                           self.retention_count, durable=True,
                           max_waiting_rows=self.max_waiting_rows,
                           fleet_backlog_bytes=self.fleet_backlog_bytes)


@dataclass(frozen=True)
class MountConfig:
    group: str = ""
    allow_other: bool = True
    max_tasks: int = 512
    # events files, for every uid but root (core/mount/readers.py says why and what
    # is refused with which errno): open at once per uid and for all of them,
    # reads waiting for an event per uid and for all of them
    events_streams_per_uid: int = 128
    events_streams: int = 4096
    events_blocked_reads_per_uid: int = 64
    events_blocked_reads: int = 256
    # every other open file of the mount (attributes, portions), for every uid but
    # root: per uid (EMFILE beyond) and for all of them (ENFILE)
    handles_per_uid: int = 1024
    handles: int = 8192
    # Prometheus text at http://<metrics_address>:<metrics_port>/metrics (0 = off)
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    # models of all subsystems together; mkdir beyond it gets ENOSPC
    max_models: int = 4096
    # subsystems served at once, configured ones counted; a load beyond it gets ENOSPC
    max_subsystems: int = 64
    # action commands started per minute over the whole mount (core/mount/actions.py: a
    # token bucket); an alert beyond is counted as `limited`, logged, never queued
    action_spawns_per_minute: int = 60
    # this mount's fleet host id (docs/fleet.md); "" = minted once, kept in the state dir
    host_id: str = ""

    def __post_init__(self) -> None:
        if self.host_id:
            problem = host_id_problem(self.host_id)
            if problem:
                raise ValueError(f"mount.host_id: {problem}")
        problem = number_problem(self.max_tasks, "mount.max_tasks")
        if problem:  # also for a MountConfig made in code, not parsed
            raise Located(f"mount.max_tasks: {problem}", "mount", "max_tasks")
        if not 1 <= self.events_streams_per_uid <= self.events_streams <= 1_000_000:
            raise Located("mount.events_streams_per_uid, events_streams: need 1 <= "
                             f"{self.events_streams_per_uid} <= {self.events_streams} "
                             "<= 1000000", "mount", "events_streams_per_uid")
        if not 1 <= self.handles_per_uid <= self.handles <= 1_000_000:
            raise Located("mount.handles_per_uid, handles: need 1 <= "
                             f"{self.handles_per_uid} <= {self.handles} <= 1000000",
                           "mount", "handles_per_uid")
        if not 0 <= self.events_blocked_reads_per_uid <= self.events_blocked_reads \
                <= self.max_tasks - 2 * FREE_TASKS:
            raise Located("mount.events_blocked_reads_per_uid, events_blocked_reads: "
                             f"need 0 <= {self.events_blocked_reads_per_uid} <= "
                             f"{self.events_blocked_reads} <= max_tasks - {2 * FREE_TASKS} "
                             f"({self.max_tasks - 2 * FREE_TASKS}): the rest is root's",
                           "mount", "events_blocked_reads")


@dataclass(frozen=True)
class Config:
    mount: MountConfig = field(default_factory=MountConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    modes: ModeConfig = field(default_factory=ModeConfig)
    subsystems: tuple[dict, ...] = ()
    source: str = "<embedded default>"


#: the tables of a configuration file and their settings' dataclasses
SECTIONS: dict[str, type] = {"mount": MountConfig, "store": StoreConfig, "modes": ModeConfig}


class Located(ValueError):
    """A mistake in one place of the file: `table` ("mount", "store", "modes", "subsystem"
    or "" for the top level), the subsystem's 1-based `index`, and the `key` (or None)."""

    def __init__(self, message: str, table: str, key: str | None = None,
                 index: int = 0) -> None:
        super().__init__(message)
        self.table, self.key, self.index = table, key, index


#: the range of every number, "section.field" -> (lo, hi), both inclusive.  A
#: number without an entry must be finite and >= 0 (no setting of these
#: sections means anything negative); nan and inf are refused everywhere.
RANGES: dict[str, tuple[float, float]] = {
    # the one range of max_tasks (MountConfig checks it too): 2 * FREE_TASKS tasks no
    # blocked read may take, and as many again for blocked reads at the least
    "mount.max_tasks": (4 * FREE_TASKS, 65536),
    "mount.metrics_port": (0, 65535),
    "mount.max_models": (1, 100_000),
    "mount.max_subsystems": (1, 4096),
    "mount.action_spawns_per_minute": (1, 60_000),
    "store.seal_rows": (1, 10_000_000),
    # a portion at most every 0.1 s per store; at least one a year
    "store.seal_seconds": (0.1, 31_536_000),
    "store.feedback_seal_seconds": (0.1, 31_536_000),
    "store.journal_seal_seconds": (0.1, 31_536_000),
    "store.retention_bytes": (1, 1 << 60),
    "store.retention_count": (1, 1_000_000_000),
    "store.max_waiting_rows": (1, 1 << 24),
    "store.fleet_backlog_bytes": (0, 1 << 60),
    # shares of ticks
    "modes.learning_share": (0.0, 1.0),
    "modes.collaboration_share": (0.0, 1.0),
    "modes.recommendation_probe": (0.0, 1.0),
    # counts of ticks
    "modes.window_ticks": (1, 10_000_000),
    "modes.evidence_ticks": (1, 10_000_000),
    "modes.min_ml_ticks": (1, 10_000_000),
    "modes.min_dwell_ticks": (1, 10_000_000),
    "modes.emergency_cooldown_ticks": (1, 10_000_000),
    # a ratio of two default ticks' objectives, max over min
    "modes.unstable_baseline_ratio": (1.0, 1e6),
    # efficiency thresholds (ML objective / default objective) and z-scores
    "modes.to_collaboration": (0.0, 1e6),
    "modes.to_recommendation": (0.0, 1e6),
    "modes.demote_below": (0.0, 1e6),
    "modes.collapse_below": (0.0, 1e6),
    "modes.recommendation_confidence": (0.0, 1e6),
    "modes.demote_confidence": (0.0, 1e6),
    "modes.silence_seconds": (0.1, 1e9),
}


def number_problem(value: int | float, where: str) -> str | None:
    if not math.isfinite(value):
        return f"{value} is not a finite number"
    lo, hi = RANGES.get(where, (0, math.inf))
    if not lo <= value <= hi:
        return f"{value} is outside {lo}..{hi}" if hi != math.inf \
            else f"{value} is below {lo}"
    return None
