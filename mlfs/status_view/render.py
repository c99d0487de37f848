"""Drawing a status as text: colours, sparklines, wrapping to the terminal's width."""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shutil
import sys

from .data import TREND_WIDTH, bin_means

SPARK = "▁▂▃▄▅▆▇█"
HISTORY_SHOWN = 6


def efficiency_sparkline(values: list[float]) -> str:
    """Efficiencies on a log scale centred on 1.0: ▄/▅ is "as good as the default".

    Symmetric in ratio (0.5 is as far below the middle as 2.0 is above), and
    never stretched beyond ±25 %, so noise around 1.0 does not look like a trend.
    """
    logs = [math.log(v) if v is not None and math.isfinite(v) and v > 0 else math.nan
            for v in values]
    finite = [abs(v) for v in logs if math.isfinite(v)]
    if not finite:
        return ""
    scale = max(max(finite), math.log(1.25))
    return "".join(" " if not math.isfinite(v) else
                   SPARK[max(0, min(7, int((v / scale + 1) / 2 * 8)))] for v in logs)


# ---- drawing ---------------------------------------------------------------------------------
_COLORS = {"emergency": "31;1", "learning": "33", "collaboration": "36",
           "recommendation": "32;1", "good": "32", "bad": "31", "dim": "2", "bold": "1",
           "stopped": "2", "initialized": "2"}


class Painter:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, style: str) -> str:
        code = _COLORS.get(style)
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and code else text


def use_color(stream=None) -> bool:
    stream = stream or sys.stdout
    return (stream.isatty() and "NO_COLOR" not in os.environ
            and os.environ.get("TERM", "") != "dumb")


def _local_time(stamp) -> str:
    """HH:MM:SS in local time from an RFC 3339 / ISO stamp (the stamp if unparsable)."""
    when = _parse_ts(stamp)
    return when.astimezone().strftime("%H:%M:%S") if when else str(stamp)


def _number(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"


def _visible(text: str) -> int:
    return len(re.sub(r"\x1b\[[0-9;]*m", "", text))


def _clip(text: str, width: int) -> str:
    """Cut a line to `width` columns (a cut line loses its colours)."""
    if _visible(text) <= width:
        return text
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return plain[:max(0, width - 1)] + "…"


def _wrap(prefix: str, parts: list[str], sep: str, width: int) -> list[str]:
    """`prefix` + parts joined by `sep`, wrapped at part boundaries under the prefix."""
    lines, line = [], prefix
    for i, part in enumerate(parts):
        piece = (sep if i else "") + part
        if i and _visible(line) + _visible(piece) + len(sep.rstrip()) > width:
            lines.append(line + sep.rstrip() if sep.strip() else line)
            line = " " * _visible(prefix) + part
        else:
            line += piece
    lines.append(line)
    return [_clip(one, width) for one in lines]


def _parse_ts(stamp) -> dt.datetime | None:
    if isinstance(stamp, dt.datetime):
        return stamp
    try:
        return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def _efficiency_style(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return "dim"
    if not math.isfinite(value):
        return "dim"
    return "good" if value >= 1.05 else "bad" if value < 0.97 else ""


def _history_parts(m: dict, paint: Painter) -> list[str]:
    """`learning 14:02:01 → collaboration 14:03:12 (why)`, newest last.

    Runs come from the dataset's `mode` column; `mode` events seen while
    watching add their reason to the run they started, or add the changes the
    dataset does not show yet.
    """
    items = [{"mode": run["mode"], "when": _parse_ts(run["ts"]), "why": "",
              "before": run.get("partial", False)} for run in m.get("mode_history", [])]
    for event in m.get("mode_events", []):
        when = _parse_ts(event["ts"])
        if when is None:
            continue
        same = [item for item in items if item["mode"] == event["to"] and item["when"]
                and abs((item["when"] - when).total_seconds()) < 5 and not item["why"]]
        if same:
            same[0].update(when=when, why=event.get("why", ""))
        elif not items or items[-1]["when"] is None or when > items[-1]["when"]:
            items.append({"mode": event["to"], "when": when, "why": event.get("why", "")})
    if not items or items[-1]["mode"] != m["mode"]:
        items.append({"mode": m["mode"], "when": None, "why": ""})
    shown = items[-HISTORY_SHOWN:]
    parts = [paint(item["mode"], item["mode"])
             + (f" {'≤' if item.get('before') else ''}{_local_time(item['when'])}"
                if item["when"] else " now")
             + (f" ({item['why']})" if item["why"] else "") for item in shown]
    if len(items) > len(shown):
        parts.insert(0, "…")
    return parts


def render(status: dict, color: bool = False, width: int | None = None) -> str:
    """The status as text; one model per line first (`name state mode switching eff`)."""
    paint = Painter(color)
    width = width or shutil.get_terminal_size((100, 40)).columns
    out = [paint(f"{status['version']} at {status['mountpoint']}", "bold")
           + f"   {_local_time(status.get('time', ''))}"]
    if status.get("emergency_pinned"):
        out.append(paint("EMERGENCY: every model pinned by the operator "
                         "(`echo auto > MOUNT/control` releases them)", "emergency"))
    for error in status.get("control_errors_tail", []):
        stamp, _, rest = error.partition(" ")
        out.append(_clip(paint("error", "bad") + f"   {_local_time(stamp)} {rest}", width))
    if not status["subsystems"]:
        out.append("\nno subsystems")
    for name, sub in status["subsystems"].items():
        objective = sub.get("objective_info", {})
        obj_text = _number(sub["objective"])
        if objective:
            obj_text = (f"{objective.get('name', 'objective')} {obj_text} "
                        f"{objective.get('unit', '')} ({objective.get('goal', '?')})")
        tick = f"tick {sub['tick']}  ·  " if sub.get("tick", -1) >= 0 else ""
        critical = "  " + paint("CRITICAL", "emergency") if sub.get("critical") else ""
        out.append("")
        origin = "loaded" if sub.get("source") == "load" else "configured"
        out.append(_clip(f"{paint(name, 'bold')}  {sub['backend']} ({origin})  ·  "
                         f"{tick}{obj_text}  ·  "
                         f"{sub['portions']} portions{critical}", width))
        defaults = sub.get("knob_defaults", {})
        knobs = []
        for knob, value in sub["knobs"].items():
            default = defaults.get(knob)
            if default is None or str(default) == value:
                knobs.append(f"{knob}={value}" + paint(" (default)", "dim"))
            else:
                knobs.append(f"{knob}={paint(value, 'bold')} (default {default})")
        out += _wrap("  knobs  ", knobs, "  ", width)
        if not sub["models"]:
            out.append(paint("  no models (mkdir models/<name> to create one)", "dim"))
            continue
        out.append(paint(f"  {'model':<16} {'state':<12} {'mode':<15} {'switching':<10} "
                         f"{'efficiency':>10} {'vs incumb.':>10}  knobs", "dim"))
        pad = " " * 19
        for model, m in sub["models"].items():
            eff, state, mode = m["efficiency"], m["state"], m["mode"]
            versus = m.get("efficiency_vs_incumbent", "?")
            out.append(f"  {model:<16} {paint(f'{state:<12}', state)} "
                       f"{paint(f'{mode:<15}', mode)} {m['mode_switching']:<10} "
                       f"{paint(f'{eff:>10}', _efficiency_style(eff))} "
                       f"{paint(f'{versus:>10}', _efficiency_style(versus))}  {m['knobs']}")
            trend = m.get("efficiency_trend", [])
            if trend:
                finite = [v for v in trend if math.isfinite(v)]
                label = (f"  {min(finite):.2f}–{max(finite):.2f}, 1.0 at ▄▅, "
                         f"{m['trend_ticks']} ML ticks")
                chars = max(8, min(TREND_WIDTH, width - len(pad) - 8 - len(label)))
                trend_text = (efficiency_sparkline(bin_means(trend, chars))
                              + paint(label, "dim"))
            else:
                trend_text = paint("no feedback yet", "dim")
            out.append(f"{pad}trend   {trend_text}")
            out += _wrap(f"{pad}modes   ", _history_parts(m, paint), " → ", width)
            for error in m.get("errors_tail", []):
                stamp, _, rest = error.partition(" ")
                out.append(_clip(f"{pad}" + paint("error", "bad")
                                 + f"   {_local_time(stamp)} {rest}", width))
    return "\n".join(out) + "\n"
