"""`mlfs report`'s data: a subsystem's rows, its model's feedback, and the figures drawn from them.

Everything is read from the mount (or its state directory) as a client
would: the subsystem's `info`, its dataset portions, the model's feedback
portions.  `collect` turns them into a `Run`: the rows shown, the model's
mode changes and bands, and the window efficiency replayed through
`mlfs.core.models.efficiency` (the one definition, so the line ends on the
model's `efficiency` file).  Rendering (`html`, `png`) only draws a `Run`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from mlfs.core.models.efficiency import replay

from ..abi import knob_column
from ..client import list_portions, read_portion
from ..config import ModeConfig

WINDOW_TICKS = ModeConfig.window_ticks  # [modes] of the default configuration
UNSTABLE_RATIO = ModeConfig.unstable_baseline_ratio
EVIDENCE_TICKS = ModeConfig.evidence_ticks
CONTEXT_ROWS = 500  # rows shown before the model's first row


def read_dir(directory: Path, columns: list[str] | None = None) -> list[dict]:
    """Every row of a portion directory, in portion order (vanished portions skipped)."""
    import pyarrow as pa

    try:
        names = list_portions(directory)
    except OSError:
        return []
    rows: list[dict] = []
    for name in names:
        try:
            table = read_portion(directory / name)
        except (OSError, pa.ArrowException):
            continue
        if columns:
            table = table.select([c for c in columns if c in table.column_names])
        rows += table.to_pylist()
    return rows


def pick_model(rows: list[dict], sub: Path) -> str | None:
    """The model that controlled most ML ticks, else the one named most, else any."""
    counts: dict[str, int] = {}
    for row in rows:
        if row.get("model"):
            counts[row["model"]] = counts.get(row["model"], 0) + (
                1000 if row.get("controller") == "ml" else 1)
    if counts:
        return max(counts, key=counts.get)
    try:
        return sorted(os.listdir(sub / "models"))[0]
    except (OSError, IndexError):
        return None


def mode_changes(rows: list[dict], model: str | None) -> list[dict]:
    """[{tick, ts, from, to}] for every change of `model`'s mode between its rows."""
    changes: list[dict] = []
    last = None
    for row in rows:
        if model is None or row.get("model") != model or not row.get("mode"):
            continue
        if last is not None and row["mode"] != last:
            changes.append({"tick": row["tick"], "ts": row["ts"], "from": last,
                            "to": row["mode"]})
        last = row["mode"]
    return changes


def mode_bands(rows: list[dict], model: str | None) -> list[tuple[int, int, str]]:
    """[(first tick, last tick, mode)] runs of `model`'s mode."""
    bands: list[list] = []
    for row in rows:
        if model is None or row.get("model") != model or not row.get("mode"):
            continue
        if bands and bands[-1][2] == row["mode"]:
            bands[-1][1] = row["tick"]
        else:
            bands.append([row["tick"], row["tick"], row["mode"]])
    return [tuple(b) for b in bands]


def window_efficiency(rows: list[dict], model: str | None, goal: str,
                      window: int = WINDOW_TICKS, unstable_ratio: float = UNSTABLE_RATIO,
                      knobs: dict | None = None) -> list[tuple[int, float]]:
    """(tick, efficiency) at each of `model`'s default rows: the `efficiency` file's value.

    The rows are replayed through `mlfs.core.models.efficiency`, the one definition
    the daemon uses, so the line ends where the model's `efficiency` file
    reads (see `replay` for what a dataset cannot show: a daemon restart, a
    collapse cool-down).  `knobs` is `info`'s: their `settle_ticks` leave
    the same settling ticks out as the daemon.
    """
    if model is None:
        return []
    settle = {knob_column(name): int(spec.get("settle_ticks", 0))
              for name, spec in (knobs or {}).items()}
    return [(tick, stats.efficiency) for tick, stats in
            replay(rows, model, goal, window, unstable_ratio, settle, evidence=EVIDENCE_TICKS)
            if math.isfinite(stats.efficiency)]


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and isinstance(v, int | float)
            and math.isfinite(v)]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


#: what a state directory keeps of a subsystem's `info` (written by the daemon at start)
INFO_FILE = "info.json"


def load_info(sub: Path) -> dict:
    """The subsystem's `info`: the mount's file, else the state directory's copy.

    A state directory from before the daemon kept `info.json` has neither:
    then the knobs are read off the dataset's `knob_*` columns and the
    objective is assumed to be maximised (said on the page).
    """
    for name in ("info", INFO_FILE):
        try:
            return json.loads((sub / name).read_text())
        except FileNotFoundError:
            continue
    knobs = {}
    portions = sorted((sub / "dataset").glob("*.parquet"))
    if portions:
        import pyarrow.parquet as pq

        for field in pq.read_schema(portions[-1]):
            if field.name.startswith("knob_"):
                kind = "int" if str(field.type).startswith("int") else "float"
                knobs[field.name.removeprefix("knob_")] = {"type": kind}
    return {"objective": {"name": "objective (goal unknown: assumed max)", "goal": "max"},
            "knobs": knobs}


def is_state_dir(path: Path, subsystem: str) -> bool:
    """A state directory (not a mount): no `version` file, the subsystem's dataset there."""
    return not (path / "version").exists() and (path / subsystem / "dataset").is_dir()


@dataclass
class Run:
    """What a report shows: the rows of a model's run and the figures derived from them."""

    mountpoint: Path
    subsystem: str
    info: dict
    model: str | None
    rows: list[dict]  # the rows shown, in tick order
    total: int  # rows in the dataset
    scope: str  # which rows are shown, in words
    feedback: list[dict]  # the model's feedback rows (tick, efficiency) in the shown range
    changes: list[dict] = field(default_factory=list)
    bands: list[tuple[int, int, str]] = field(default_factory=list)
    window: list[tuple[int, float]] = field(default_factory=list)

    @property
    def objective(self) -> dict:
        return self.info.get("objective", {})

    @property
    def goal(self) -> str:
        return self.objective.get("goal", "max")

    @property
    def first_tick(self) -> int:
        return self.rows[0]["tick"]

    @property
    def last_tick(self) -> int:
        return self.rows[-1]["tick"]

    def ml_values(self) -> list[float]:
        return _finite(r["objective"] for r in self.rows if r.get("controller") == "ml")

    def default_values(self) -> list[float]:
        return _finite(r["objective"] for r in self.rows if r.get("controller") != "ml")

    def other_ml(self) -> bool:
        """Did another model control some of the rows shown?"""
        return any(r.get("controller") == "ml" and r.get("model") != self.model
                   for r in self.rows)

    def ticks_by_mode(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows:
            if self.model and r.get("model") == self.model:
                counts[r["mode"]] = counts.get(r["mode"], 0) + 1
        return counts

    def summary(self) -> dict:
        """The run's figures, without what drawing adds (points, strides)."""
        ml, default = self.ml_values(), self.default_values()
        return {
            "mountpoint": str(self.mountpoint), "subsystem": self.subsystem,
            "model": self.model, "rows": len(self.rows), "dataset_rows": self.total,
            "first_tick": self.first_tick, "last_tick": self.last_tick, "ml_rows": len(ml),
            "default_rows": len(default), "ml_mean": _mean(ml), "default_mean": _mean(default),
            "efficiency_last": self.window[-1][1] if self.window else None,
            "mode_changes": len(self.changes), "ticks_by_mode": self.ticks_by_mode(),
            "feedback_rows": len(self.feedback),
        }


def collect(mountpoint: Path, subsystem: str, model: str | None = None, last: int = 0,
            whole: bool = False) -> Run:
    """The `Run` of one subsystem of a mount (or of its state directory).

    `mountpoint` may also be the mount's state directory, mounted or not: its
    sealed portions, models and feedback sit in the same layout
    (STATE/<subsystem>/dataset/*.parquet, .../models/<model>/feedback/).
    The rows shown are the model's run: from CONTEXT_ROWS rows before its
    first row to the end (`whole`: every row of the dataset); `last` then
    keeps only the newest `last` of them.  LookupError when there are no rows.
    """
    sub = mountpoint / subsystem
    info = load_info(sub)
    goal = info.get("objective", {}).get("goal", "max")
    rows = read_dir(sub / "dataset")
    total = len(rows)
    if not rows:
        raise LookupError(f"{sub}/dataset has no rows yet; `echo prepare_dataset > "
                          f"{sub}/control` seals the pending ones")
    model = model or pick_model(rows, sub)
    # replayed over every row, then clipped: a shown slice still ends on the file's value
    window = window_efficiency(rows, model, goal, knobs=info.get("knobs"))
    scope = "every row of the dataset"
    if model and not whole:
        first = next((i for i, r in enumerate(rows) if r.get("model") == model), None)
        if first is not None and first > CONTEXT_ROWS:
            rows = rows[first - CONTEXT_ROWS:]
            scope = f"from {CONTEXT_ROWS} rows before {model}'s first (--all: every row)"
    if last > 0 and len(rows) > last:
        rows = rows[-last:]
        scope = f"the newest {last} rows (--last)"
    feedback = read_dir(sub / "models" / model / "feedback", ["tick", "efficiency"]) \
        if model else []
    first_tick, last_tick = rows[0]["tick"], rows[-1]["tick"]
    return Run(
        mountpoint, subsystem, info, model, rows, total, scope,
        feedback=[r for r in feedback if first_tick <= r["tick"] <= last_tick],
        changes=mode_changes(rows, model), bands=mode_bands(rows, model),
        window=[(t, v) for t, v in window if first_tick <= t <= last_tick])
