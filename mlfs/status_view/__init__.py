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

`--json` prints the same status with numbers as JSON numbers: the objective,
knob values and efficiency (`nan` or an unreadable `?` become null).

The package: `data` (reading the mount), `render` (text), `watch` (redrawing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..client import NotMounted, read_portion, tail_rows
from .data import collect, machine
from .render import render, use_color
from .watch import watch

__all__ = ["NotMounted", "collect", "machine", "main", "read_portion", "render", "tail_rows",
           "watch"]


def main(mountpoint: Path, as_json: bool = False, watch_seconds: float | None = None) -> int:
    if watch_seconds is not None:
        return watch(mountpoint, watch_seconds, as_json)
    try:
        status = collect(mountpoint)
    except OSError as exc:
        print(f"mlfs: {mountpoint}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(machine(status), indent=2, default=str, allow_nan=False))
    else:
        sys.stdout.write(render(status, color=use_color()))
    return 0
