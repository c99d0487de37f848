"""`mlfs report MOUNTPOINT SUBSYSTEM`: one self-contained HTML page about a run.

Everything comes from the mount (a client, like `mlfs status`): the
subsystem's `info` and dataset portions, and the model's feedback portions.
The page holds inline SVG drawn here (no plotting library, no scripts, no
external files), so it can be mailed, attached to a ticket or opened offline:

- the objective of every dataset row, per tick, coloured by who controlled
  the tick (`ml` or `default`), with the model's mode changes as vertical
  markers and its modes as background bands;
- efficiency over time: the window efficiency replayed from the dataset
  through `mlfs.core.models.efficiency` (each ML tick against the default ticks
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

On a live mount the subsystem's pending rows are sealed first
(`prepare_dataset`, as a trainer asks), so the page ends at the last tick and
agrees with `mlfs status`; when the seal is refused (no write access to
`control`), one line says how many rows are left out.  A state directory is
reported as it is.

Layout: `data` turns rows into a `Run` (the figures, efficiency through
`mlfs.core.models.efficiency`); `html` and `png` only draw a `Run`; this module
is the command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .data import CONTEXT_ROWS, WINDOW_TICKS, Run, collect, is_state_dir, load_info
from .data import window_efficiency as window_efficiency
from .html import render
from .png import png_available, write_png

__all__ = ["CONTEXT_ROWS", "WINDOW_TICKS", "Run", "build", "collect", "is_state_dir",
           "load_info", "main", "png_available", "render", "seal", "window_efficiency",
           "write_png"]


def build(mountpoint: Path, subsystem: str, model: str | None = None, last: int = 0,
          max_points: int = 5000, whole: bool = False) -> tuple[str, dict, Run]:
    """(the HTML page, a summary dict, the `Run` drawn) for one subsystem of a mount."""
    run = collect(mountpoint, subsystem, model, last, whole)
    page, summary = render(run, max_points)
    return page, summary, run


def pending_rows(mountpoint: Path, subsystem: str) -> str:
    """The subsystem's `mlfs_dataset_rows_pending` from MOUNT/metrics, or "?"."""
    prefix = f'mlfs_dataset_rows_pending{{subsystem="{subsystem}"}} '
    try:
        text = (mountpoint / "metrics").read_text()
    except OSError:
        return "?"
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip().removesuffix(".0")
    return "?"


def seal(mountpoint: Path, subsystem: str) -> str | None:
    """Seal the live subsystem's pending rows (`prepare_dataset`, as a trainer does), so
    the report ends at the last tick; None when sealed, else the line saying what is left
    out (the errno, and the rows pending)."""
    from ..client import write_line

    if pending_rows(mountpoint, subsystem) == "0":
        # nothing to seal; and prepare_dataset would wait for the next tick's row (an
        # hour for a subsystem ticking hourly, or the daemon's bound on that wait)
        return None
    try:
        write_line(mountpoint / subsystem / "control", "prepare_dataset")
        return None
    except OSError as exc:
        return (f"mlfs: {mountpoint / subsystem}/control: prepare_dataset refused "
                f"({exc.strerror or exc}): {pending_rows(mountpoint, subsystem)} rows "
                "pending since the last portion are not in the report")


def main(args: argparse.Namespace) -> int:
    mountpoint = Path(args.mountpoint)
    sub = mountpoint / args.subsystem
    if args.png and not png_available():  # before anything is written or sealed
        print("mlfs: --png needs matplotlib (pip install 'mlfs[plots]')", file=sys.stderr)
        return 2
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
    if not state:
        left_out = seal(mountpoint, args.subsystem)
        if left_out:
            print(left_out, file=sys.stderr)
    if args.model and not (sub / "models" / args.model).is_dir():
        print(f"mlfs: no model {args.model!r} in {sub}/models (its dataset rows are "
              "still reported)", file=sys.stderr)
    try:
        page, summary, run = build(mountpoint, args.subsystem, args.model, args.last,
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
        if not write_png(png, run):  # checked above: only if it vanished meanwhile
            print("mlfs: --png needs matplotlib (pip install 'mlfs[plots]'); wrote the HTML "
                  "only", file=sys.stderr)
            return 2
        print(f"mlfs: wrote {png}")
    return 0
