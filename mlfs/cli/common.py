"""What every command's parser and several commands share."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path


def default_state_dir(mountpoint: Path) -> Path:
    """One state directory per mountpoint, so two mounts never share rows."""
    real = os.path.realpath(mountpoint)
    tag = real.strip("/").replace("/", "_") or "root"
    tag = f"{tag[:80]}-{hashlib.sha1(real.encode()).hexdigest()[:8]}"
    if os.geteuid() == 0:
        base = Path("/var/lib/mlfs")
    else:
        base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "mlfs"
    return base / tag


def command(sub, name: str, help_text: str, examples: str | None) -> argparse.ArgumentParser:
    """The parser of one command: `help_text` is its one line in `mlfs --help` and, as a
    sentence, its description; `examples` its epilog (and the man page's EXAMPLES)."""
    return sub.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:]
                          + ".", epilog=examples,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
