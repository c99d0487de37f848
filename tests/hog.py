"""Run a command beside busy-looping processes, as CI's worst day runs it.

    python -m tests.hog [--cores N] -- COMMAND ...

starts N processes (default 1) that each spin one core, runs COMMAND, ends the
spinners by their PIDs and exits with COMMAND's status.  The suite must pass
this way (issue 55): a test that fails beside a hog assumes a CPU speed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

SPIN = "while True: pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hog", description=__doc__.split("\n")[0])
    parser.add_argument("--cores", type=int, default=1, help="busy-looping processes (1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.cores < 0:
        parser.error("give a command after --, and --cores >= 0")
    # SIGTERM ends this process through `finally`, so the spinners go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.cores)]
    try:
        return subprocess.call(command)
    finally:
        for hog in hogs:
            os.kill(hog.pid, signal.SIGKILL)
            hog.wait()


if __name__ == "__main__":
    sys.exit(main())
