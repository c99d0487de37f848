"""`mlfs report MOUNTPOINT SUBSYSTEM`: one self-contained HTML page about a run.

Everything comes from the mount (a client, like `mlfs status`): the
subsystem's `info` and dataset portions, and the model's feedback portions.
The page holds inline SVG drawn here (no plotting library, no scripts, no
external files), so it can be mailed, attached to a ticket or opened offline:

- the objective of every dataset row, per tick, coloured by who controlled
  the tick (`ml` or `default`), with the model's mode changes as vertical
  markers and its modes as background bands;
- efficiency over time: the window efficiency replayed from the dataset
  through `mlfs.core.efficiency` (each ML tick against the default ticks
  around it, over the last WINDOW_TICKS ticks of the default configuration:
  the rule and the number of the model's `efficiency` file) and the per-tick
  `efficiency` of the feedback rows as dots, on a log scale;
- each numeric knob's value in effect per tick.

Rows: by default the model's run, from CONTEXT_ROWS (500) dataset rows
before the model's first row to the end; `--all` shows every row of the
dataset, `--last N` only the newest N of those.

Downsampling (documented, deterministic): when a run has more rows than
`--max-points` (default 5000), every k-th row is drawn, k = ceil(rows /
max_points); the figure caption and the `data-rows` / `data-points`
attributes of each `<svg>` say how many were drawn.  Rows with a non-finite
objective are not drawn.  Rolling statistics always use every row.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import math
import os
import sys
from pathlib import Path

from .abi import knob_column
from .config import ModeConfig
from .core.efficiency import replay
from .status_view import read_portion

WINDOW_TICKS = ModeConfig.window_ticks  # [modes] of the default configuration
UNSTABLE_RATIO = ModeConfig.unstable_baseline_ratio
CONTEXT_ROWS = 500  # rows shown before the model's first row
WIDTH, HEIGHT = 960, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 20, 24, 40
COLORS = {"default": "#4c78a8", "ml": "#f58518", "emergency": "#e45756",
          "learning": "#eeca3b", "collaboration": "#72b7b2", "recommendation": "#54a24b"}


# ---- data ---------------------------------------------------------------------------------
def read_dir(directory: Path, columns: list[str] | None = None) -> list[dict]:
    """Every row of a portion directory, in portion order (vanished portions skipped)."""
    import pyarrow as pa

    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
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

    The rows are replayed through `mlfs.core.efficiency`, the one definition
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
            replay(rows, model, goal, window, unstable_ratio, settle)
            if math.isfinite(stats.efficiency)]


# ---- drawing ------------------------------------------------------------------------------
def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round axis ticks covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        low, high = low - 0.5, high + 0.5
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = magnitude
    for m in (1, 2, 2.5, 5, 10):
        step = m * magnitude
        if (high - low) / step <= count:
            break
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


class Plot:
    """One SVG chart: linear x (ticks), linear or log2 y."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float],
                 log_y: bool = False, height: int = HEIGHT) -> None:
        self.x0, self.x1 = x_range
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        self.log_y = log_y
        y0, y1 = y_range
        if log_y:
            y0, y1 = math.log2(y0), math.log2(y1)
        if y1 <= y0:
            y0, y1 = y0 - 0.5, y1 + 0.5
        pad = (y1 - y0) * 0.04
        self.y0, self.y1 = y0 - pad, y1 + pad
        self.height = height
        self.parts: list[str] = []

    def x(self, value: float) -> float:
        inner = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
        return round(MARGIN_LEFT + (value - self.x0) / (self.x1 - self.x0) * inner, 1)

    def y(self, value: float) -> float:
        if self.log_y:
            value = math.log2(value)
        inner = self.height - MARGIN_TOP - MARGIN_BOTTOM
        return round(self.height - MARGIN_BOTTOM - (value - self.y0) / (self.y1 - self.y0)
                     * inner, 1)

    def axes(self, x_label: str, y_label: str) -> None:
        bottom, top = self.height - MARGIN_BOTTOM, MARGIN_TOP
        left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
        p = self.parts
        p.append(f'<rect class="frame" x="{left}" y="{top}" width="{right - left}" '
                 f'height="{bottom - top}"/>')
        for tick in nice_ticks(self.x0, self.x1, 8):
            x = self.x(tick)
            p.append(f'<line class="grid" x1="{x}" y1="{top}" x2="{x}" y2="{bottom}"/>')
            p.append(f'<text class="xt" x="{x}" y="{bottom + 16}">{int(tick)}</text>')
        if self.log_y:
            y_ticks = [2.0 ** e for e in range(math.ceil(self.y0), math.floor(self.y1) + 1)]
        else:
            y_ticks = nice_ticks(self.y0, self.y1, 5)
        for tick in y_ticks:
            y = self.y(tick)
            p.append(f'<line class="grid" x1="{left}" y1="{y}" x2="{right}" y2="{y}"/>')
            p.append(f'<text class="yt" x="{left - 6}" y="{y + 4}">{fmt(tick)}</text>')
        p.append(f'<text class="label" x="{(left + right) / 2}" y="{self.height - 6}">'
                 f'{html.escape(x_label)}</text>')
        p.append(f'<text class="label" transform="rotate(-90)" x="{-(top + bottom) / 2}" '
                 f'y="16">{html.escape(y_label)}</text>')

    def bands(self, bands: list[tuple[int, int, str]]) -> None:
        top, bottom = MARGIN_TOP, self.height - MARGIN_BOTTOM
        for first, last, mode in bands:
            x0, x1 = self.x(first), self.x(last + 1)
            self.parts.append(
                f'<rect class="band" x="{x0}" y="{top}" width="{max(0.5, x1 - x0)}" '
                f'height="{bottom - top}" fill="{COLORS.get(mode, "#999")}">'
                f'<title>{html.escape(mode)}: ticks {first}–{last}</title></rect>')

    def markers(self, changes: list[dict]) -> None:
        top, bottom = MARGIN_TOP, self.height - MARGIN_BOTTOM
        free = [-1e9, -1e9, -1e9]  # where each of three label rows is free again
        for change in changes:
            x = self.x(change["tick"])
            title = html.escape(f"tick {change['tick']}: {change['from']} → {change['to']}")
            self.parts.append(
                f'<line class="mode-change" x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" '
                f'stroke="{COLORS.get(change["to"], "#333")}"><title>{title}</title></line>')
            row = next((i for i, edge in enumerate(free) if x >= edge), None)
            if row is None:
                continue  # no room: the line keeps its tooltip
            label = change["to"]
            free[row] = x + 6 * len(label) + 8
            self.parts.append(f'<text class="mode-label" x="{x + 3}" y="{top + 11 + 12 * row}">'
                              f'{html.escape(label)}</text>')

    def svg(self, cls: str, rows: int, points: int, title: str) -> str:
        return (f'<svg class="chart {cls}-chart" xmlns="http://www.w3.org/2000/svg" '
                f'viewBox="0 0 {WIDTH} {self.height}" width="{WIDTH}" height="{self.height}" '
                f'data-rows="{rows}" data-points="{points}" role="img" '
                f'aria-label="{html.escape(title)}">' + "".join(self.parts) + "</svg>")


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and isinstance(v, int | float)
            and math.isfinite(v)]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _legend(items: list[tuple[str, str]]) -> str:
    return '<p class="legend">' + " ".join(
        f'<span><i style="background:{color}"></i>{html.escape(text)}</span>'
        for text, color in items) + "</p>"


def objective_svg(rows: list[dict], stride: int, bands, changes, unit: str, name: str,
                  model: str | None) -> tuple[str, int]:
    drawn = [r for r in rows[::stride] if r.get("objective") is not None
             and math.isfinite(r["objective"])]
    values = [r["objective"] for r in drawn]
    plot = Plot((rows[0]["tick"], rows[-1]["tick"]),
                (min(values, default=0.0), max(values, default=1.0)))
    plot.bands(bands)
    plot.axes("tick", f"{name} ({unit})" if unit else name)
    for row in drawn:
        controller = "ml" if row.get("controller") == "ml" else "default"
        if controller == "ml" and model and row.get("model") != model:
            controller = "ml other"
        plot.parts.append(f'<circle class="pt {controller}" cx="{plot.x(row["tick"])}" '
                          f'cy="{plot.y(row["objective"])}" r="1.6"/>')
    plot.markers(changes)
    return plot.svg("objective", len(rows), len(drawn), f"{name} per tick"), len(drawn)


def efficiency_svg(window: list[tuple[int, float]], feedback: list[dict], stride: int,
                   x_range: tuple[int, int], bands, changes) -> tuple[str, int]:
    dots = [(r["tick"], r["efficiency"]) for r in feedback[::stride]
            if r.get("efficiency") is not None and math.isfinite(r["efficiency"])
            and r["efficiency"] > 0]
    # the range: the window line, 1.0 and the middle 96 % of the dots (outliers sit at the edge)
    spread = sorted(v for _, v in dots)
    if spread:
        spread = [spread[int(len(spread) * 0.02)], spread[int(len(spread) * 0.98) - 1]]
    values = [v for _, v in window] + spread + [1.0]
    low, high = max(min(values), 1 / 64), min(max(values), 64.0)
    plot = Plot(x_range, (min(low, 0.8), max(high, 1.25)), log_y=True)
    plot.bands(bands)
    plot.axes("tick", "efficiency (log scale)")
    for tick, value in dots:
        value = min(max(value, low), high)
        plot.parts.append(f'<circle class="ept" cx="{plot.x(tick)}" cy="{plot.y(value)}" '
                          f'r="1.3"/>')
    plot.parts.append(f'<line class="ref" x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" '
                      f'y1="{plot.y(1.0)}" y2="{plot.y(1.0)}"/>')
    if window:
        step = max(1, len(window) // 2000)
        path = " ".join(f"{'M' if i == 0 else 'L'}{plot.x(t)},{plot.y(min(max(v, low), high))}"
                        for i, (t, v) in enumerate(window[::step]))
        plot.parts.append(f'<path class="weff" d="{path}"/>')
    plot.markers(changes)
    return plot.svg("efficiency", len(feedback), len(dots), "efficiency over time"), len(dots)


def knob_svg(rows: list[dict], stride: int, column: str, knob: str, changes) -> str:
    """The knob's value in effect per tick, dots coloured by controller like the objective."""
    points = [(r["tick"], r[column], r.get("controller") == "ml") for r in rows[::stride]
              if isinstance(r.get(column), int | float) and not isinstance(r[column], bool)]
    if not points:
        return ""
    plot = Plot((rows[0]["tick"], rows[-1]["tick"]),
                (min(v for _, v, _ in points), max(v for _, v, _ in points)), height=170)
    plot.axes("tick", knob)
    for tick, value, is_ml in points:
        plot.parts.append(f'<circle class="kpt {"ml" if is_ml else "default"}" '
                          f'cx="{plot.x(tick)}" cy="{plot.y(value)}" r="1.4"/>')
    plot.markers(changes)
    return plot.svg("knob", len(rows), len(points), f"{knob} per tick")


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 4px}
.sub{color:#666;margin:0 0 16px}table{border-collapse:collapse;margin:8px 0}
td,th{padding:3px 12px 3px 0;text-align:left;vertical-align:top}th{color:#555;font-weight:500}
svg{display:block;max-width:100%;height:auto;font:11px system-ui,sans-serif}
.frame{fill:none;stroke:#bbb}.grid{stroke:#eee}.xt{text-anchor:middle;fill:#555}
.yt{text-anchor:end;fill:#555}.label{text-anchor:middle;fill:#333}
.band{opacity:.10}.mode-change{stroke-width:1.5;stroke-dasharray:4 3}
.mode-label{fill:#333;font-size:10px}
.pt.default{fill:#4c78a8;opacity:.55}.pt.ml{fill:#f58518;opacity:.8}
.pt.ml.other{fill:#b279a2;opacity:.7}.ept{fill:#f58518;opacity:.5}.weff{fill:none;stroke:#222;stroke-width:1.8}
.ref{stroke:#888;stroke-dasharray:2 2}
.kpt.default{fill:#4c78a8;opacity:.55}.kpt.ml{fill:#f58518;opacity:.8}
.legend span{margin-right:14px;white-space:nowrap}
.legend i{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:4px}
.caption{color:#666;font-size:12px;margin:2px 0 0}code{background:#f4f4f4;padding:0 3px}
"""


def _when(value) -> str:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


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


def build(mountpoint: Path, subsystem: str, model: str | None = None, last: int = 0,
          max_points: int = 5000, whole: bool = False) -> tuple[str, dict, dict]:
    """(the HTML page, a summary dict, the data drawn) for one subsystem of a mount.

    `mountpoint` may also be the mount's state directory, mounted or not: its
    sealed portions, models and feedback sit in the same layout
    (STATE/<subsystem>/dataset/*.parquet, .../models/<model>/feedback/).
    The rows shown are the model's run: from CONTEXT_ROWS rows before its
    first row to the end (`whole`: every row of the dataset); `last` then
    keeps only the newest `last` of them.
    """
    sub = mountpoint / subsystem
    info = load_info(sub)
    objective = info.get("objective", {})
    goal = objective.get("goal", "max")
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
    feedback = [r for r in feedback if first_tick <= r["tick"] <= last_tick]
    stride = max(1, math.ceil(len(rows) / max(1, max_points)))
    fb_stride = max(1, math.ceil(len(feedback) / max(1, max_points)))
    changes = mode_changes(rows, model)
    bands = mode_bands(rows, model)
    window = [(t, v) for t, v in window if first_tick <= t <= last_tick]

    obj_svg, drawn = objective_svg(rows, stride, bands, changes, objective.get("unit", ""),
                                   objective.get("name", "objective"), model)
    eff_svg, dots = efficiency_svg(window, feedback, fb_stride, (first_tick, last_tick),
                                   bands, changes)
    knob_svgs = []
    for knob, spec in list(info.get("knobs", {}).items())[:4]:
        if spec.get("type") in ("int", "float"):
            column = knob_column(knob)
            knob_svgs.append(knob_svg(rows, stride, column, knob, changes))

    ml = _finite(r["objective"] for r in rows if r.get("controller") == "ml")
    other_ml = any(r.get("controller") == "ml" and r.get("model") != model for r in rows)
    default = _finite(r["objective"] for r in rows if r.get("controller") != "ml")
    ticks_by_mode: dict[str, int] = {}
    for r in rows:
        if model and r.get("model") == model:
            ticks_by_mode[r["mode"]] = ticks_by_mode.get(r["mode"], 0) + 1
    summary = {
        "mountpoint": str(mountpoint), "subsystem": subsystem, "model": model,
        "rows": len(rows), "dataset_rows": total, "points": drawn, "stride": stride,
        "first_tick": first_tick, "last_tick": last_tick, "ml_rows": len(ml),
        "default_rows": len(default),
        "ml_mean": _mean(ml), "default_mean": _mean(default),
        "efficiency_last": window[-1][1] if window else None, "mode_changes": len(changes),
        "ticks_by_mode": ticks_by_mode, "feedback_rows": len(feedback), "feedback_dots": dots,
    }

    title = f"mlfs report — {subsystem}" + (f" / {model}" if model else "")
    e = html.escape
    sampling = ("every row" if stride == 1
                else f"1 row in {stride} ({drawn} of {len(rows)}; --max-points {max_points})")
    table = [
        ("objective", f"{objective.get('name', '?')} ({objective.get('unit', '')}, "
                      f"{'higher' if goal != 'min' else 'lower'} is better)"),
        ("rows", f"{len(rows)} of {total} (ticks {first_tick}–{last_tick}; {scope}), "
                 f"{len(ml)} ML-controlled ({len(ml) / len(rows):.0%})"),
        ("time", f"{_when(rows[0]['ts'])} → {_when(rows[-1]['ts'])}"),
        ("mean objective", f"ML {fmt(summary['ml_mean']) if ml else '—'} · default "
                           f"{fmt(summary['default_mean']) if default else '—'}"),
        ("window efficiency at the end",
         f"{summary['efficiency_last']:.3f}" if window else "— (needs ML and default ticks)"),
        ("ticks per mode", ", ".join(f"{k} {v}" for k, v in ticks_by_mode.items()) or "—"),
        ("mode changes", str(len(changes))),
    ]
    changes_rows = "".join(
        f"<tr><td>{c['tick']}</td><td>{e(_when(c['ts']))}</td><td>{e(c['from'])} → "
        f"{e(c['to'])}</td></tr>" for c in changes[-50:])
    mode_legend = [(mode, COLORS[mode]) for mode in
                   ("learning", "collaboration", "recommendation", "emergency")
                   if mode in ticks_by_mode]
    page = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="sub">{e(str(mountpoint))} · generated '
        f'{e(dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))} by '
        f"<code>mlfs report</code></p>",
        "<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in table)
        + "</table>",
        "<h2>Objective per tick</h2>",
        _legend([("default tick", COLORS["default"]),
                 (f"ML tick of {model}" if model else "ML tick", COLORS["ml"])]
                + ([("ML tick of another model", "#b279a2")] if other_ml else [])
                + [(f"{m} (band)", c) for m, c in mode_legend]),
        obj_svg,
        f'<p class="caption">Drawn: {e(sampling)}. Dashed lines: mode changes of '
        f"{e(model or 'the model')}; bands: its mode.</p>",
        "<h2>Efficiency over time</h2>",
        _legend([(f"window efficiency (the efficiency file's rule: each ML tick against the "
                  f"default ticks around it, last {WINDOW_TICKS} ticks; from the dataset)",
                  "#222"), ("per-tick efficiency (feedback)", COLORS["ml"])]),
        eff_svg,
        f'<p class="caption">{len(feedback)} feedback rows'
        + (f", 1 in {fb_stride} drawn" if fb_stride > 1 else "")
        + ". The dotted line is 1.0: as good as the default algorithm.</p>",
    ]
    if any(knob_svgs):
        page += ["<h2>Knobs in effect</h2>"] + [s for s in knob_svgs if s]
    if changes:
        page += ["<h2>Mode changes</h2>", "<table><tr><th>tick</th><th>time</th>"
                 f"<th>change</th></tr>{changes_rows}</table>"]
    page.append("</body></html>\n")
    data = {"rows": rows, "model": model, "info": info, "changes": changes, "window": window,
            "feedback": feedback}
    return "\n".join(page), summary, data


def write_png(path: Path, subsystem: str, data: dict) -> bool:
    """The objective and efficiency charts as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    rows, model, objective = data["rows"], data["model"], data["info"].get("objective", {})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for controller, color in (("default", COLORS["default"]), ("ml", COLORS["ml"])):
        points = [(r["tick"], r["objective"]) for r in rows
                  if (r.get("controller") == "ml") == (controller == "ml")
                  and r.get("objective") is not None]
        if points:
            top.scatter(*zip(*points, strict=True), s=3, color=color, label=controller)
    top.set_ylabel(f"{objective.get('name', 'objective')} ({objective.get('unit', '')})")
    top.legend(loc="upper right")
    dots = [(r["tick"], r["efficiency"]) for r in data["feedback"]
            if r.get("efficiency") is not None and r["efficiency"] > 0]
    if dots:
        bottom.scatter(*zip(*dots, strict=True), s=2, color=COLORS["ml"], alpha=0.4,
                       label="per-tick efficiency (feedback)")
    if data["window"]:
        bottom.plot(*zip(*data["window"], strict=True), color="#222",
                    label=f"window efficiency ({WINDOW_TICKS} ticks)")
    bottom.axhline(1.0, color="#888", linestyle=":")
    bottom.set_yscale("log", base=2)
    bottom.set_ylabel("efficiency")
    bottom.set_xlabel("tick")
    if dots or data["window"]:
        bottom.legend(loc="upper left")
    bottom.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    for index, change in enumerate(data["changes"]):
        for axis in (top, bottom):
            axis.axvline(change["tick"], color=COLORS.get(change["to"], "#333"),
                         linestyle="--", linewidth=1)
        top.annotate(change["to"], (change["tick"], 1), xycoords=("data", "axes fraction"),
                     xytext=(3, -10 - 9 * (index % 3)), textcoords="offset points",
                     fontsize=7)
    fig.suptitle(f"mlfs report — {subsystem}" + (f" / {model}" if model else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(args: argparse.Namespace) -> int:
    mountpoint = Path(args.mountpoint)
    sub = mountpoint / args.subsystem
    state = is_state_dir(mountpoint, args.subsystem)
    if not state and not (mountpoint / "version").exists():
        print(f"mlfs: {mountpoint}: neither an mlfs mount (no version file) nor a state "
              f"directory with {args.subsystem}/dataset", file=sys.stderr)
        return 1
    if not state and not (sub / "info").exists():
        try:
            names = sorted(p.name for p in mountpoint.iterdir() if (p / "info").exists())
        except OSError as exc:
            print(f"mlfs: {mountpoint}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"mlfs: no subsystem {args.subsystem!r} in {mountpoint} "
              f"(there: {', '.join(names) or 'none'})", file=sys.stderr)
        return 1
    if args.model and not (sub / "models" / args.model).is_dir():
        print(f"mlfs: no model {args.model!r} in {sub}/models (its dataset rows are "
              "still reported)", file=sys.stderr)
    try:
        page, summary, data = build(mountpoint, args.subsystem, args.model, args.last,
                              args.max_points, getattr(args, "all", False))
    except LookupError as exc:
        print(f"mlfs: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"mlfs: {mountpoint}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    out = Path(args.out or f"mlfs-report-{args.subsystem}"
               + (f"-{summary['model']}" if summary["model"] else "") + ".html")
    out.write_text(page, encoding="utf-8")
    print(f"mlfs: wrote {out} ({summary['rows']} of {summary['dataset_rows']} rows, "
          f"{summary['points']} points drawn, "
          f"{summary['mode_changes']} mode changes)")
    if args.png:
        png = out.with_suffix(".png")
        if write_png(png, args.subsystem, data):
            print(f"mlfs: wrote {png}")
        else:
            print("mlfs: --png needs matplotlib (pip install matplotlib); wrote the HTML only",
                  file=sys.stderr)
    return 0
