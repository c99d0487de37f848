"""`mlfs report --png`: the objective and efficiency charts of a `Run` with matplotlib."""

from __future__ import annotations

from pathlib import Path

from .data import WINDOW_TICKS, Run
from .html import COLORS


def png_available() -> bool:
    """True when matplotlib can be imported (the `plots` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_png(path: Path, run: Run) -> bool:
    """The objective and efficiency charts as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    rows, model, objective, subsystem = run.rows, run.model, run.objective, run.subsystem
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for controller, color in (("default", COLORS["default"]), ("ml", COLORS["ml"])):
        points = [(r["tick"], r["objective"]) for r in rows
                  if (r.get("controller") == "ml") == (controller == "ml")
                  and r.get("objective") is not None]
        if points:
            top.scatter(*zip(*points, strict=True), s=3, color=color, label=controller)
    top.set_ylabel(f"{objective.get('name', 'objective')} ({objective.get('unit', '')})")
    top.legend(loc="upper right")
    dots = [(r["tick"], r["efficiency"]) for r in run.feedback
            if r.get("efficiency") is not None and r["efficiency"] > 0]
    if dots:
        bottom.scatter(*zip(*dots, strict=True), s=2, color=COLORS["ml"], alpha=0.4,
                       label="per-tick efficiency (feedback)")
    if run.window:
        bottom.plot(*zip(*run.window, strict=True), color="#222",
                    label=f"window efficiency ({WINDOW_TICKS} ticks)")
    bottom.axhline(1.0, color="#888", linestyle=":")
    bottom.set_yscale("log", base=2)
    bottom.set_ylabel("efficiency")
    bottom.set_xlabel("tick")
    if dots or run.window:
        bottom.legend(loc="upper left")
    bottom.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    for index, change in enumerate(run.changes):
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

