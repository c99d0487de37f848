"""A model's recommendation journal: every input it was given, and what became of it.

One row per step of an input's life (accepted, applied, superseded, expired,
ignored, rejected), numbered by `seq`, which never repeats: `id` names the
input a row is about.  An accepted recommendation is written `strict` (its
write-ahead line is on disk before the writer hears success, and fdatasynced
by `sync` off the trio thread); a refusal is kept unless the store is full,
where only the writer, the log and `errors` hear of it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from mlfs.base.clock import now_us
from mlfs.base.portion import StorePolicy, StoreWatch
from mlfs.core.storage.store import PortionStore


def journal_schema() -> pa.Schema:
    return pa.schema([
        ("seq", pa.int64()),
        ("id", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("tick", pa.int64()),
        ("model", pa.string()),
        ("line", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("expect", pa.float64()),
        ("ttl", pa.int64()),
    ])


class Journal(PortionStore):
    """STATE/<subsystem>/models/<model>/recommendations/ as a store that numbers its rows."""

    def __init__(self, directory: Path, policy: StorePolicy, watch: StoreWatch, model: str,
                 count: Callable[[str], None]) -> None:
        super().__init__(directory, journal_schema(), "seq", policy, watch, "journal")
        self.model = model
        #: rows by status (this process), and the mount's counter
        self.counts: collections.Counter[str] = collections.Counter()
        self._count = count
        self._seq = self.last_key or 0

    def write(self, status: str, rec_id: int | None, line: str, reason: str, tick: int,
              expect: float | None = None, ttl: int | None = None,
              strict: bool = False) -> int:
        """One row; its seq (0: a refusal left out of a full store).  `strict`: written
        now or StoreError, nothing changed."""
        if status == "rejected" and self.full:
            return 0
        seq = self._seq + 1
        self.append({
            "seq": seq, "id": rec_id if rec_id is not None else seq, "ts": now_us(),
            "tick": tick, "model": self.model, "line": line,
            "status": status, "reason": reason, "expect": expect, "ttl": ttl,
        }, strict=strict)
        self._seq = seq
        self.counts[status] += 1
        self._count(status)
        return seq
