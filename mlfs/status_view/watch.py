"""`mlfs status --watch`: redraw in place, with the `mode` events seen meanwhile."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..client import EventStream
from .data import collect, machine
from .render import render, use_color


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
    # Ctrl-C is how a watch ends: started with SIGINT ignored (a parent that ignores it,
    # as a non-interactive shell does for `&` jobs), Python would keep it ignored and the
    # watch could not be stopped from its terminal
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
                    frame = json.dumps(machine(status), default=str, allow_nan=False) + "\n"
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
