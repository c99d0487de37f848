"""One TOML file configures a mount; with none, the embedded default serves."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from .core.readers import FREE_TASKS
from .core.store import StorePolicy


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
    window_ticks: int = 400
    unstable_baseline_ratio: float = 2.0
    min_ml_ticks: int = 30
    min_dwell_ticks: int = 100
    to_collaboration: float = 1.0
    to_recommendation: float = 1.05
    recommendation_confidence: float = 2.0
    demote_below: float = 0.97
    demote_confidence: float = 2.0
    collapse_below: float = 0.3
    emergency_cooldown_ticks: int = 200
    silence_seconds: float = 60.0


@dataclass(frozen=True)
class StoreConfig:
    seal_rows: int = 4096
    seal_seconds: float = 10.0
    feedback_seal_seconds: float = 2.0
    journal_seal_seconds: float = 30.0
    retention_bytes: int = 1 << 30
    retention_count: int = 1000

    def dataset(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.seal_seconds, self.retention_bytes,
                           self.retention_count)

    def feedback(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.feedback_seal_seconds, self.retention_bytes,
                           self.retention_count)

    def journal(self) -> StorePolicy:
        return StorePolicy(self.seal_rows, self.journal_seal_seconds, self.retention_bytes,
                           self.retention_count, durable=True)


@dataclass(frozen=True)
class MountConfig:
    group: str = ""
    allow_other: bool = True
    max_tasks: int = 512
    # events files, for every uid but root (core/readers.py says why and what
    # is refused with which errno): open at once per uid and for all of them,
    # reads waiting for an event per uid and for all of them
    events_streams_per_uid: int = 128
    events_streams: int = 4096
    events_blocked_reads_per_uid: int = 64
    events_blocked_reads: int = 256
    # Prometheus text at http://<metrics_address>:<metrics_port>/metrics (0 = off)
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"mount.metrics_port: {self.metrics_port} is not 0..65535")
        if not self.metrics_address:
            raise ValueError("mount.metrics_address: empty (127.0.0.1 serves loopback only)")
        if not 4 * FREE_TASKS <= self.max_tasks <= 100_000:
            raise ValueError(f"mount.max_tasks: {self.max_tasks} is not {4 * FREE_TASKS}..100000")
        if not 1 <= self.events_streams_per_uid <= self.events_streams <= 1_000_000:
            raise ValueError("mount.events_streams_per_uid, events_streams: need 1 <= "
                             f"{self.events_streams_per_uid} <= {self.events_streams} "
                             "<= 1000000")
        if not 0 <= self.events_blocked_reads_per_uid <= self.events_blocked_reads \
                <= self.max_tasks - 2 * FREE_TASKS:
            raise ValueError("mount.events_blocked_reads_per_uid, events_blocked_reads: "
                             f"need 0 <= {self.events_blocked_reads_per_uid} <= "
                             f"{self.events_blocked_reads} <= max_tasks - {2 * FREE_TASKS} "
                             f"({self.max_tasks - 2 * FREE_TASKS}): the rest is root's")


@dataclass(frozen=True)
class Config:
    mount: MountConfig = field(default_factory=MountConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    modes: ModeConfig = field(default_factory=ModeConfig)
    subsystems: tuple[dict, ...] = ()
    source: str = "<embedded default>"


def _section(cls: type, data: dict, where: str):
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
    values = {}
    for name, value in data.items():
        default = known[name].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{where}.{name}: expected true or false")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(default, bool) and type(default) is not type(value):
            raise ValueError(f"{where}.{name}: expected {type(default).__name__}")
        values[name] = value
    return cls(**values)


def parse_config(text: str, source: str) -> Config:
    data = tomllib.loads(text)
    subsystems = data.pop("subsystem", [])
    config = Config(
        mount=_section(MountConfig, data.pop("mount", {}), "mount"),
        store=_section(StoreConfig, data.pop("store", {}), "store"),
        modes=_section(ModeConfig, data.pop("modes", {}), "modes"),
        subsystems=tuple(subsystems),
        source=source,
    )
    if data:
        raise ValueError(f"unknown section(s) {', '.join(sorted(data))}")
    for i, sub in enumerate(subsystems):
        if "backend" not in sub:
            raise ValueError(f"subsystem #{i + 1}: 'backend' is required")
    return config


def default_text() -> str:
    return resources.files("mlfs").joinpath("default.toml").read_text()


def load_config(path: str | Path | None) -> Config:
    """The configuration in `path`, or the embedded default when None."""
    if path is None:
        return parse_config(default_text(), "<embedded default>")
    return parse_config(Path(path).read_text(), str(path))
