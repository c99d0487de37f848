"""Window features: an entity's recent rows, one grammar for the trainer and the proxy.

numpy is imported inside the functions: `import mlfs.abi` stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# ---- window features: an entity's recent rows, for predictors -------------------------
#
# A predictor sees one row per entity and tick, but what gives a failure away is often a
# trend: errors on several of the last days, a latency above its own month.  The trainer
# and the proxy running a policy must compute such features the same way, so the grammar
# and both computations (over a whole dataset, and tick by tick) are defined here.  A
# policy names them like any column: `<field>__<aggregate><W>`, over the entity's last W
# rows (fewer while it has fewer), the current row included:
#   mean  the field's mean;
#   pos   how many of the rows have the field above 0;
#   first rows since the oldest of them with the field above 0 (0: the current row),
#         -1 when none is.
# Rows, not ticks: an entity has one row per tick while it exists (a record source's
# contract), so W rows are the last W ticks it was seen.

#: the longest window a window feature may name
MAX_WINDOW = 90
WINDOW_AGGREGATES = ("mean", "pos", "first")
_WINDOW_NAME = re.compile(r"^(?P<field>[A-Za-z0-9_]+?)__(?P<agg>mean|pos|first)"
                          r"(?P<w>[0-9]{1,3})$")


@dataclass(frozen=True)
class WindowFeature:
    """One parsed window feature name."""

    name: str
    field: str
    aggregate: str
    window: int


def window_feature(name: str) -> WindowFeature | None:
    """The window feature a column name asks for, or None for a plain column (or a name
    whose window is outside 2..MAX_WINDOW)."""
    match = _WINDOW_NAME.match(name)
    if match is None:
        return None
    window = int(match["w"])
    if not 2 <= window <= MAX_WINDOW:
        return None
    return WindowFeature(name, match["field"], match["agg"], window)


def window_features(keys: Any, ticks: Any, columns: Mapping[str, Any],
                    names: list[str]) -> dict[str, Any]:
    """The named window features of every row of a dataset (rows in any order; each
    key's rows are taken in tick order): one float64 array per name."""
    import numpy as np

    specs = [w for w in map(window_feature, names) if w is not None]
    keys = np.asarray(keys)
    order = np.lexsort((np.asarray(ticks, dtype=np.int64), keys))
    n = len(order)
    k = keys[order]
    start = np.ones(n, bool)
    start[1:] = k[1:] != k[:-1]
    first_row = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    here = np.arange(n)
    seen = here - first_row + 1  # rows of this key so far, the current one included
    out: dict[str, Any] = {}
    for spec in specs:
        values = np.asarray(columns[spec.field], dtype=np.float64)[order]
        count = np.minimum(seen, spec.window)
        lo = here - count + 1  # the window's oldest row
        if spec.aggregate == "mean":
            total = np.concatenate(([0.0], np.cumsum(values)))
            result = (total[here + 1] - total[lo]) / count
        elif spec.aggregate == "pos":
            total = np.concatenate(([0], np.cumsum(values > 0)))
            result = (total[here + 1] - total[lo]).astype(np.float64)
        else:
            positive = np.flatnonzero(values > 0)
            idx = np.searchsorted(positive, lo)
            cand = positive[np.minimum(idx, max(len(positive) - 1, 0))] if len(positive) \
                else here
            has = (idx < len(positive)) & (cand <= here)
            result = np.where(has, here - cand, -1).astype(np.float64)
        unsorted = np.empty(n)
        unsorted[order] = result
        out[spec.name] = unsorted
    return out


class WindowState:
    """The same window features tick by tick, from each entity's last rows kept here.

    `update(keys, columns)` takes one tick's rows (one per entity) and returns the named
    features for them, equal to `window_features` over all the rows so far.  An entity
    unseen for `MAX_WINDOW` updates is forgotten when room is needed (at most
    `max_entities` are kept; one that comes back starts a new history).
    """

    def __init__(self, names: list[str], max_entities: int = 100_000) -> None:
        import numpy as np

        self.specs = [w for w in map(window_feature, names) if w is not None]
        self.names = [s.name for s in self.specs]
        self.depth: dict[str, int] = {}
        for spec in self.specs:
            self.depth[spec.field] = max(self.depth.get(spec.field, 0), spec.window)
        self.max_entities = max_entities
        self.slots: dict[Any, int] = {}
        self.capacity = 0
        self.seen = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)
        self.rings = {f: np.zeros((0, d)) for f, d in self.depth.items()}
        self.updates = 0

    def _grow(self, need: int) -> None:
        import numpy as np

        if need <= self.capacity:
            return
        if need > self.max_entities:
            self._forget()
            need = len(self.slots) + (need - self.capacity)
        size = max(need, 2 * self.capacity, 64)
        self.seen = np.concatenate((self.seen, np.zeros(size - self.capacity, np.int64)))
        self.last = np.concatenate((self.last, np.zeros(size - self.capacity, np.int64)))
        for f, ring in self.rings.items():
            self.rings[f] = np.concatenate((ring, np.zeros((size - self.capacity,
                                                            ring.shape[1]))))
        self.capacity = size

    def _forget(self) -> None:
        """Compact: keep the entities seen within the last MAX_WINDOW updates."""
        import numpy as np

        keep = [(key, slot) for key, slot in self.slots.items()
                if self.updates - self.last[slot] < MAX_WINDOW]
        old = np.array([slot for _, slot in keep], dtype=np.int64)
        self.slots = {key: i for i, (key, _) in enumerate(keep)}
        self.seen = self.seen[old]
        self.last = self.last[old]
        self.rings = {f: ring[old] for f, ring in self.rings.items()}
        self.capacity = len(old)

    def update(self, keys: Any, columns: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np

        self.updates += 1
        keys = np.asarray(keys).tolist()
        new = [key for key in dict.fromkeys(keys) if key not in self.slots]
        if new:
            self._grow(len(self.slots) + len(new))
            for key in new:
                self.slots[key] = len(self.slots)
            self.seen[[self.slots[key] for key in new]] = 0
        slots = np.fromiter((self.slots[key] for key in keys), np.int64, len(keys))
        self.last[slots] = self.updates
        for f, depth in self.depth.items():
            self.rings[f][slots, self.seen[slots] % depth] = np.asarray(columns[f],
                                                                       dtype=np.float64)
        self.seen[slots] += 1
        seen = self.seen[slots]
        out: dict[str, Any] = {}
        for spec in self.specs:
            depth = self.depth[spec.field]
            back = np.arange(spec.window)  # 0: this row, 1: the row before, ...
            window = self.rings[spec.field][slots[:, None],
                                            (seen[:, None] - 1 - back[None, :]) % depth]
            valid = back[None, :] < np.minimum(seen, spec.window)[:, None]
            if spec.aggregate == "mean":
                out[spec.name] = (np.where(valid, window, 0.0).sum(axis=1)
                                  / valid.sum(axis=1))
            elif spec.aggregate == "pos":
                out[spec.name] = ((window > 0) & valid).sum(axis=1).astype(np.float64)
            else:
                hit = (window > 0) & valid
                oldest = spec.window - 1 - np.argmax(hit[:, ::-1], axis=1)
                out[spec.name] = np.where(hit.any(axis=1), oldest, -1).astype(np.float64)
        return out
