"""A knob model's measured pairs in its state directory, so they survive a restart.

The incumbent and the safe set (`incumbent.py`, `safe_set.py`) are built on the
proxy's stable pairs; kept in memory only, a daemon restart (umount and mount, or a
crash) left a model restored in recommendation without its incumbent and its policy
unrestricted until it had measured everything again.  The feedback rows cannot
rebuild them: they do not say which pairs were stable, nor the mode a
recommendation ran in (which decides whether it was the model's own tick), nor the
level of the latest default tick.  So the pairs are kept as a snapshot,
`measured.json` beside `model.json`:

- written the one safe way (`write_durably`: no link followed, an atomic replace)
  when the model stops, when the mount closes, and every `SAVE_EVERY_PAIRS` pairs
  (a crash loses at most that many);
- bounded like the ring it copies (`KEPT_PAIRS` pairs, `MAX_SETTINGS` settings of the
  subsystem's own knob columns, `MAX_BYTES` read), checked field by field when read
  back; a snapshot that fails is set aside (`.damaged`) with the reason in the
  model's `errors` and the log, and the model starts with no pairs, as before.

Read back, the pairs are replayed oldest first through `SafeSet.measured`, and the
level is the one saved: the `incumbent` file shows the same setting right after the
restore, until the next default tick says where the workload is now.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection
from pathlib import Path

import numpy as np

from mlfs.base.durable import TooLarge, UnsafePath, read_bounded, write_durably
from mlfs.base.errors import Refused, invalid

from .safe_set import KEPT_PAIRS, MAX_SETTINGS, SafeSet

log = logging.getLogger("mlfs.proxy")

SAFE_SET_FILE = "measured.json"
FORMAT = 1
#: pairs between two snapshots while the model runs (at one pair a tick at most, a
#: snapshot every quarter of an hour or more on a one-second tick)
SAVE_EVERY_PAIRS = 1000
#: the largest snapshot read back: `KEPT_PAIRS` pairs of under 100 bytes and
#: `MAX_SETTINGS` settings of a few knobs, with room to spare
MAX_BYTES = 16 << 20
_PAIR_FIELDS = ("baseline", "ratio", "slot", "tick", "by_model")
#: the longest knob value (a string knob's word) a snapshot may name
MAX_VALUE_CHARS = 256


def encode(safe: SafeSet) -> bytes:
    """The snapshot of `safe`: its settings, its pairs oldest first, its level."""
    settings, pairs = safe.held()
    level = safe.level if math.isfinite(safe.level) else None
    return json.dumps({
        "format": FORMAT, "level": level,
        "settings": [sorted(s.items()) for s in settings],
        "pairs": {name: pairs[name].tolist() for name in _PAIR_FIELDS},
    }, allow_nan=False, separators=(",", ":")).encode()


def _setting(item, columns: Collection[str]) -> dict:
    if not isinstance(item, list) or len(item) > len(columns):
        raise invalid("settings: a setting is not a list of [knob column, value]")
    setting = {}
    for entry in item:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise invalid("settings: an entry is not [knob column, value]")
        column, value = entry
        if column not in columns:
            raise invalid(f"settings: {column[:40]!r} is not a knob column of the subsystem")
        if not (value is None or isinstance(value, str) and len(value) <= MAX_VALUE_CHARS
                or isinstance(value, int) and not isinstance(value, bool)):
            raise invalid(f"settings: {column} has a value that is no knob value")
        setting[column] = value
    return setting


def decode(data: bytes, columns: Collection[str]) -> SafeSet:
    """A SafeSet rebuilt from a snapshot, checked first (Refused naming the field)."""
    try:
        saved = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise invalid(f"not JSON: {str(exc)[:100]}") from None
    if not isinstance(saved, dict) or set(saved) != {"format", "level", "settings", "pairs"}:
        raise invalid("not an object of format, level, settings and pairs")
    if saved["format"] != FORMAT:
        raise invalid(f"format is {str(saved['format'])[:20]!r}, not {FORMAT}")
    level = saved["level"]
    if level is not None and not (isinstance(level, float | int) and not isinstance(level, bool)
                                  and math.isfinite(level) and level > 0):
        raise invalid("level is not null or a positive number")
    settings = saved["settings"]
    if not isinstance(settings, list) or len(settings) > MAX_SETTINGS:
        raise invalid(f"settings is not a list of at most {MAX_SETTINGS}")
    settings = [_setting(item, columns) for item in settings]
    pairs = saved["pairs"]
    if not isinstance(pairs, dict) or set(pairs) != set(_PAIR_FIELDS):
        raise invalid(f"pairs is not an object of {' '.join(_PAIR_FIELDS)}")
    lengths = {len(v) if isinstance(v, list) else -1 for v in pairs.values()}
    if len(lengths) != 1 or not 0 <= lengths.pop() <= KEPT_PAIRS:
        raise invalid(f"pairs: not lists of one length of at most {KEPT_PAIRS}")
    numbers = [isinstance(x, float | int) and not isinstance(x, bool)
               for name in ("baseline", "ratio") for x in pairs[name]]
    integers = [isinstance(x, int) and not isinstance(x, bool)
                for name in ("slot", "tick") for x in pairs[name]]
    if not all(numbers) or not all(integers) or not all(
            isinstance(x, bool) for x in pairs["by_model"]):
        raise invalid("pairs: a value of the wrong type")
    if pairs["slot"] and not 0 <= min(pairs["slot"]) <= max(pairs["slot"]) < len(settings):
        raise invalid("pairs: a slot names no setting")
    baseline, ratio = np.asarray(pairs["baseline"], float), np.asarray(pairs["ratio"], float)
    if not (np.isfinite(baseline).all() and (baseline > 0).all() and np.isfinite(ratio).all()):
        raise invalid("pairs: a baseline or ratio that is not a finite measurement")
    safe = SafeSet()
    for slot, b, r, tick, by_model in zip(pairs["slot"], baseline.tolist(), ratio.tolist(),
                                          pairs["tick"], pairs["by_model"], strict=True):
        safe.measured(settings[slot], b, r, tick, by_model)
    if level is not None:
        safe.default_tick(float(level))
    return safe


class SafeSetFile:
    """The snapshot of one model's SafeSet: read back once, written now and then."""

    def __init__(self, directory: Path, columns: Collection[str], label: str) -> None:
        self.path = directory / SAFE_SET_FILE
        self.columns = frozenset(columns)
        self.label = label  # subsystem/model, for the log
        self.saved_at = 0  # the SafeSet's pairs_seen at the last snapshot
        self._saved: tuple[int, float] | None = None  # (pairs seen, level) last written

    def load(self) -> tuple[SafeSet | None, str | None]:
        """The SafeSet saved (None: no snapshot, or a damaged one) and why it is damaged
        (None: it is not); the caller sets a damaged one aside."""
        try:
            data = read_bounded(self.path, MAX_BYTES)
        except FileNotFoundError:
            return None, None
        except TooLarge:
            return None, f"over {MAX_BYTES} bytes"
        except (UnsafePath, OSError) as exc:
            return None, f"unreadable: {exc}"
        try:
            safe = decode(data, self.columns)
        except Refused as exc:
            return None, exc.reason
        self.saved_at = safe.pairs_seen
        self._saved = (safe.pairs_seen, safe.level)
        return safe, None

    def save(self, safe: SafeSet) -> None:
        """Write the snapshot (best effort: a failing disk is logged; the pairs stay in
        memory and the next snapshot tries again).  Nothing new since the last one, or
        nothing measured at all: nothing written."""
        mark = (safe.pairs_seen, safe.level)
        if not safe.pairs_seen or mark == self._saved:
            return
        try:
            write_durably(self.path, encode(safe))
        except OSError as exc:
            log.error("%s: %s not written: %s", self.label, SAFE_SET_FILE, exc)
            return
        self.saved_at, self._saved = safe.pairs_seen, mark

    def save_now_and_then(self, safe: SafeSet) -> None:
        """Every `SAVE_EVERY_PAIRS` pairs (bounded loss on a crash, no write per tick)."""
        if safe.pairs_seen - self.saved_at >= SAVE_EVERY_PAIRS:
            self.save(safe)
