"""`mlfs report`'s HTML page: inline SVG charts of a `Run`, drawn here.

No plotting library, no scripts, no external files: the page can be mailed,
attached to a ticket or opened offline.  Downsampling is deterministic:
past `max_points` rows every k-th row is drawn, k = ceil(rows / max_points),
and the caption and each `<svg>`'s `data-rows` / `data-points` say so.
"""

from __future__ import annotations

import datetime as dt
import html
import math

from ..abi import knob_column
from .data import WINDOW_TICKS, Run

WIDTH, HEIGHT = 960, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 20, 24, 40
COLORS = {"default": "#4c78a8", "ml": "#f58518", "emergency": "#e45756",
          "learning": "#eeca3b", "collaboration": "#72b7b2", "recommendation": "#54a24b"}


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


def render(run: Run, max_points: int = 5000) -> tuple[str, dict]:
    """(the HTML page, the run's summary with what was drawn) for a `Run`."""
    rows, model, objective, goal = run.rows, run.model, run.objective, run.goal
    subsystem, mountpoint, total, scope = run.subsystem, run.mountpoint, run.total, run.scope
    feedback, changes, bands, window = run.feedback, run.changes, run.bands, run.window
    first_tick, last_tick = run.first_tick, run.last_tick
    stride = max(1, math.ceil(len(rows) / max(1, max_points)))
    fb_stride = max(1, math.ceil(len(feedback) / max(1, max_points)))

    obj_svg, drawn = objective_svg(rows, stride, bands, changes, objective.get("unit", ""),
                                   objective.get("name", "objective"), model)
    eff_svg, dots = efficiency_svg(window, feedback, fb_stride, (first_tick, last_tick),
                                   bands, changes)
    knob_svgs = []
    for knob, spec in list(run.info.get("knobs", {}).items())[:4]:
        if spec.get("type") in ("int", "float"):
            column = knob_column(knob)
            knob_svgs.append(knob_svg(rows, stride, column, knob, changes))

    ml = run.ml_values()
    default = run.default_values()
    other_ml = run.other_ml()
    summary = run.summary()
    summary.update(points=drawn, stride=stride, feedback_dots=dots)
    ticks_by_mode = summary["ticks_by_mode"]

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
    return "\n".join(page), summary
