"""Which sealed portions a fleet pusher has shipped: what retention may hold back.

`mlfs fleet push` (mlfs/fleet/push.py) keeps its cursor durably in the mount's
state directory, one file per fleet store: `fleet/push-<store key>.json`, with
`shipped` mapping a source key to the last portion number shipped.  Portions of
one source are shipped in order, so "shipped" is a prefix: every portion
numbered at most the cursor is in the store.  The daemon reads these files (it
never talks to a store) to keep unshipped portions from retention up to
`[store] fleet_backlog_bytes`; with several stores, a portion counts as shipped
once every store has it.  No cursor file: no pusher, nothing is held back.

The source key is defined here, once: the pusher writes it, the daemon reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FLEET_DIR = "fleet"
CURSOR_PREFIX = "push-"
CURSOR_SUFFIX = ".json"


def source_key(relative: str) -> str:
    """The cursor key of a portion directory, given relative to the state directory
    (the same path relative to the mountpoint): `S/dataset` -> `S/dataset`,
    `S/models/M/feedback` -> `S/feedback/M`, `S/models/M/recommendations` ->
    `S/recommendations/M`."""
    parts = relative.strip("/").split("/")
    if len(parts) == 4 and parts[1] == "models":
        return f"{parts[0]}/{parts[3]}/{parts[2]}"
    return "/".join(parts)


def cursor_path(state_dir: Path, key: str) -> Path:
    """The cursor file of the store whose key (mlfs/fleet/push.py store_key) is `key`."""
    return Path(state_dir) / FLEET_DIR / f"{CURSOR_PREFIX}{key}{CURSOR_SUFFIX}"


class ShippedCursors:
    """The pushers' cursors of one state directory, re-read when a file changes.

    `shipped(directory)` is the last portion number of that portion directory
    that every pusher has shipped, or None when no pusher runs for this state
    directory (nothing to hold back).  Cheap to call on every seal: one
    `scandir` of `fleet/` and a `stat` per cursor, the JSON parsed only when its
    mtime or size changed.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).resolve()
        self._cache: dict[str, tuple[tuple[int, int], dict[str, int]]] = {}

    def _cursors(self) -> list[dict[str, int]]:
        try:
            entries = [e for e in os.scandir(self.state_dir / FLEET_DIR)
                       if e.name.startswith(CURSOR_PREFIX) and e.name.endswith(CURSOR_SUFFIX)]
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            cached = self._cache.get(entry.name)
            if cached is None or cached[0] != stamp:
                try:
                    data = json.loads(Path(entry.path).read_bytes())
                    shipped = {str(k): int(v) for k, v in data.get("shipped", {}).items()}
                except (OSError, ValueError, TypeError, AttributeError):
                    # unreadable: treated as a pusher that shipped nothing (holds
                    # everything up to the limit) rather than as no pusher
                    shipped = {}
                cached = (stamp, shipped)
                self._cache[entry.name] = cached
            out.append(cached[1])
        return out

    def shipped(self, directory: Path) -> int | None:
        cursors = self._cursors()
        if not cursors:
            return None
        try:
            relative = Path(directory).resolve().relative_to(self.state_dir).as_posix()
        except ValueError:
            return None
        key = source_key(relative)
        return min(c.get(key, -1) for c in cursors)
