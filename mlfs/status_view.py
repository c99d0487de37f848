"""`mlfs status`: the mount at a glance, once or live (`--watch`).

A client of the mount only, like any other reader: it reads `version`,
`metrics`, each subsystem's `info`, `objective`, `knobs/`, the newest dataset
portions, and each model's `state`, `mode`, `efficiency`, `errors` and newest
feedback portions.  It never talks to the daemon, so it works (and fails) the
way a user's own `cat` would.

Per model it shows the mode with its recent history (from the `mode` column of
the newest dataset rows; while watching, also from `mode` events with their
reason), an efficiency trend (a sparkline of the feedback rows' per-tick
`efficiency`, the newest ML ticks binned into at most 40 characters), the last
three lines of `errors`, and per subsystem each knob against its default.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

from .client import EventStream, NotMounted, collect_status, read_attr_or, read_portion, tail_rows

__all__ = ["NotMounted", "collect", "main", "read_portion", "render", "tail_rows", "watch"]

SPARK = "▁▂▃▄▅▆▇█"
#: sparkline width in characters; each is the mean of up to TREND_BIN ML ticks
TREND_WIDTH = 40
TREND_BIN = 10
#: dataset rows read (newest first) to find each model's recent mode changes
HISTORY_ROWS = 4000
HISTORY_PORTIONS = 32
#: portions read at most for a model's feedback trend
MAX_PORTIONS = 64
ERRORS_SHOWN = 3
HISTORY_SHOWN = 6

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


def sparkline(values: list[float]) -> str:
    """▁▂▃▄▅▆▇█ scaled from the smallest to the largest value shown."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
        elif high - low < 1e-12:
            out.append(SPARK[3])
        else:
            out.append(SPARK[min(7, int((v - low) / (high - low) * 8))])
    return "".join(out)


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
                         f"{'efficiency':>10}  knobs", "dim"))
        pad = " " * 19
        for model, m in sub["models"].items():
            eff, state, mode = m["efficiency"], m["state"], m["mode"]
            out.append(f"  {model:<16} {paint(f'{state:<12}', state)} "
                       f"{paint(f'{mode:<15}', mode)} {m['mode_switching']:<10} "
                       f"{paint(f'{eff:>10}', _efficiency_style(eff))}  {m['knobs']}")
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


# ---- watching --------------------------------------------------------------------------------
class ModeTracker:
    """`mode` events seen while watching (root `events`, O_NONBLOCK), per model."""

    KEPT = 20

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self.stream: EventStream | None = None
        self.events: dict[tuple[str, str], list[dict]] = {}

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def drain(self) -> None:
        """Take in what the stream holds now, without waiting."""
        if self.stream is None:
            with contextlib.suppress(OSError):
                self.stream = EventStream(self.mountpoint / "events")
        if self.stream is None:
            return
        try:
            events = self.stream.read()
        except OSError:  # the mount went away: reopen on a later refresh
            self.close()
            return
        if self.stream.ended:
            self.close()
        for event in events:
            if event.get("event") == "mode":
                kept = self.events.setdefault((event.get("subsystem"), event.get("model")), [])
                kept.append({"ts": event.get("ts", ""), "from": event.get("from"),
                             "to": event.get("to"), "why": event.get("why", "")})
                del kept[:-self.KEPT]

    def annotate(self, status: dict) -> None:
        for name, sub in status["subsystems"].items():
            for model, m in sub["models"].items():
                m["mode_events"] = list(self.events.get((name, model), []))


CLEAR = "\x1b[H\x1b[2J"  # home, clear the screen


def redraw(frame: str) -> str:
    """Home, each line erased to its end, the rest of the screen erased: no flicker."""
    return "\x1b[H" + frame.replace("\n", "\x1b[K\n") + "\x1b[K\x1b[J"


def watch(mountpoint: Path, interval: float, as_json: bool = False) -> int:
    """Redraw every `interval` seconds until Ctrl-C (exit 0).  JSON: one line per refresh."""
    interval = max(0.1, interval)
    tty = sys.stdout.isatty()
    tracker = ModeTracker(mountpoint)
    first = True
    try:
        while True:
            try:
                tracker.drain()
                status = collect(mountpoint)
                tracker.annotate(status)
                if as_json:
                    frame = json.dumps(status, default=str) + "\n"
                else:
                    frame = render(status, color=use_color())
            except OSError as exc:
                tracker.close()
                frame = (f"mlfs: {mountpoint}: {exc.strerror or exc} "
                         f"(retrying every {interval:g} s; Ctrl-C to quit)\n")
                if as_json:
                    frame = json.dumps({"mountpoint": str(mountpoint),
                                        "error": str(exc.strerror or exc)}) + "\n"
            if as_json:
                sys.stdout.write(frame)
            elif tty:
                footer = f"\nevery {interval:g} s · Ctrl-C to quit"
                sys.stdout.write((CLEAR if first else "") + redraw(frame + footer))
            else:
                sys.stdout.write(frame + "\n")
            sys.stdout.flush()
            first = False
            time.sleep(interval)
    except KeyboardInterrupt:
        if tty and not as_json:
            sys.stdout.write("\n")
        return 0
    except BrokenPipeError:  # `mlfs status --watch | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit flush
        return 0
    finally:
        tracker.close()


def main(mountpoint: Path, as_json: bool = False, watch_seconds: float | None = None) -> int:
    if watch_seconds is not None:
        return watch(mountpoint, watch_seconds, as_json)
    try:
        status = collect(mountpoint)
    except OSError as exc:
        print(f"mlfs: {mountpoint}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(status, indent=2, default=str))
    else:
        sys.stdout.write(render(status, color=use_color()))
    return 0
