"""What `mlfs status` shows, read from the mount: the client's status plus gauges,
error tails, efficiency trends and mode history."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
from pathlib import Path

from ..client import collect_status, read_attr_or, tail_rows

#: sparkline width in characters; each is the mean of up to TREND_BIN ML ticks
TREND_WIDTH = 40
TREND_BIN = 10
#: dataset rows read (newest first) to find each model's recent mode changes
HISTORY_ROWS = 4000
HISTORY_PORTIONS = 32
#: portions read at most for a model's feedback trend
MAX_PORTIONS = 64
ERRORS_SHOWN = 3

_METRIC = re.compile(r'^(mlfs_tick|mlfs_critical)\{subsystem="((?:[^"\\]|\\.)*)"\} (\S+)$')
#: unlabelled gauges of the whole mount, filed under subsystem ""
_MOUNT_METRIC = re.compile(r"^(mlfs_mount_emergency_pinned) (\S+)$")


# ---- reading the mount -----------------------------------------------------------------------
def _read(path: Path, default: str = "") -> str:
    return read_attr_or(path, default)


def bin_means(values: list[float], bins: int) -> list[float]:
    """`values` in order, averaged into at most `bins` consecutive groups."""
    if len(values) <= bins:
        return list(values)
    out = []
    for i in range(bins):
        group = values[i * len(values) // bins:(i + 1) * len(values) // bins]
        out.append(sum(group) / len(group))
    return out


def efficiency_trend(model_dir: Path) -> tuple[list[float], int]:
    """(binned per-tick efficiency of the newest ML ticks, how many ticks that covers)."""
    rows, _ = tail_rows(model_dir / "feedback", ["tick", "efficiency"],
                        TREND_WIDTH * TREND_BIN, MAX_PORTIONS)
    values = [r["efficiency"] for r in rows
              if r["efficiency"] is not None and math.isfinite(r["efficiency"])]
    return [round(v, 4) for v in bin_means(values, TREND_WIDTH)], len(values)


def mode_runs(rows: list[dict], model: str, cut: bool = False) -> list[dict]:
    """Consecutive runs of one model's `mode` in dataset rows: [{tick, ts, mode}].

    With `cut` (older rows were not read) a run starting at the first row read
    may have begun earlier: it is marked `"partial": true`.
    """
    runs: list[dict] = []
    for index, row in enumerate(rows):
        if row.get("model") != model or not row.get("mode"):
            continue
        if not runs or runs[-1]["mode"] != row["mode"]:
            ts = row["ts"]
            runs.append({"tick": row["tick"], "mode": row["mode"],
                         "ts": ts.isoformat() if hasattr(ts, "isoformat") else ts,
                         "partial": cut and index == 0})
    return runs


def _metrics(mountpoint: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in _read(mountpoint / "metrics").splitlines():
        match = _METRIC.match(line)
        if match:
            with contextlib.suppress(ValueError):
                out.setdefault(match.group(2), {})[match.group(1)] = float(match.group(3))
        match = _MOUNT_METRIC.match(line)
        if match:
            with contextlib.suppress(ValueError):
                out.setdefault("", {})[match.group(1)] = float(match.group(2))
    return out


def collect(mountpoint: Path) -> dict:
    """`collect_status` (same keys) plus what the view shows; reads only the mount.

    NotMounted when `mountpoint` is not an mlfs mount.
    """
    status = collect_status(mountpoint)
    status["time"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    gauges = _metrics(mountpoint)
    status["emergency_pinned"] = bool(gauges.get("", {}).get("mlfs_mount_emergency_pinned"))
    errors = [line for line in _read(mountpoint / "errors").splitlines() if line]
    status["control_errors_tail"] = errors[-ERRORS_SHOWN:]
    for name, entry in status["subsystems"].items():
        sub = mountpoint / name
        try:
            info = json.loads(_read(sub / "info", "{}"))
        except ValueError:
            info = {}
        entry["objective_info"] = info.get("objective", {})
        entry["knob_defaults"] = {k: v.get("default") for k, v in info.get("knobs", {}).items()}
        entry["tick"] = int(gauges.get(name, {}).get("mlfs_tick", -1))
        entry["critical"] = bool(gauges.get(name, {}).get("mlfs_critical", 0))
        history, cut = (tail_rows(sub / "dataset", ["tick", "ts", "model", "mode"],
                                  HISTORY_ROWS, HISTORY_PORTIONS)
                        if entry["models"] else ([], False))
        for model, m in entry["models"].items():
            model_dir = sub / "models" / model
            errors = [line for line in _read(model_dir / "errors").splitlines() if line]
            m["errors_tail"] = errors[-ERRORS_SHOWN:]
            m["errors_count"] = len(errors)
            m["efficiency_trend"], m["trend_ticks"] = efficiency_trend(model_dir)
            m["mode_history"] = mode_runs(history, model, cut)
    return status


# ---- --json ------------------------------------------------------------------------------------
def json_value(text: object, *, real: bool = False) -> object:
    """An attribute's text as JSON wants it: a finite number as a number (an int when
    it is one, unless `real`: a measured quantity such as the objective or an
    efficiency is a float even when its text reads "1098"), `nan`, `?` (unreadable) or
    an empty text as null, anything else (a choice knob's value) as the text."""
    if not isinstance(text, str):
        return text
    word = text.strip()
    if word in ("", "?"):
        return None
    if not real:
        try:
            return int(word)
        except ValueError:
            pass
    try:
        number = float(word)
    except ValueError:
        return word
    return number if math.isfinite(number) else None


def machine(status: dict) -> dict:
    """`collect`'s status for `--json`: objective, knob values and efficiency as numbers,
    nan and `?` as null (any non-finite number too), an unknown tick (-1) as null (the
    text view keeps its texts)."""
    out = dict(status, subsystems={})
    for name, entry in status.get("subsystems", {}).items():
        entry = dict(entry)
        entry["objective"] = json_value(entry.get("objective"), real=True)
        entry["knobs"] = {k: json_value(v) for k, v in entry.get("knobs", {}).items()}
        if isinstance(entry.get("tick"), int) and entry["tick"] < 0:
            entry["tick"] = None
        models = {}
        for model, m in entry.get("models", {}).items():
            models[model] = dict(m, efficiency=json_value(m.get("efficiency"), real=True),
                                 efficiency_vs_incumbent=json_value(
                                     m.get("efficiency_vs_incumbent"), real=True))
        entry["models"] = models
        out["subsystems"][name] = entry
    return _no_nan(out)


def _no_nan(value: object) -> object:
    """Every non-finite float anywhere in `value` as null: JSON has no nan."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value
