"""The measured pairs' snapshot (mlfs/core/models/safe_set_file.py): a round trip gives
the same incumbent and the same safe set; a damaged snapshot is refused whole."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from mlfs.base.errors import Refused
from mlfs.core.models.incumbent import Incumbent
from mlfs.core.models.safe_set import SafeSet
from mlfs.core.models.safe_set_file import (
    MAX_BYTES,
    SAFE_SET_FILE,
    SAVE_EVERY_PAIRS,
    SafeSetFile,
    decode,
    encode,
)

COLUMNS = ["knob_x", "knob_mode"]
LEVEL = 100.0


def measured(kept: int = 20_000) -> SafeSet:
    """Episodes of four settings at one level (x=2 clearly best), some the model's."""
    safe = SafeSet(kept)
    rng = random.Random(4)
    tick = 0
    for _ in range(20):
        for value, gain in {1: 1.05, 2: 1.3, 3: 0.7, 4: 1.0}.items():
            for _ in range(3):
                safe.measured({"knob_x": value, "knob_mode": "a" if value % 2 else None},
                              LEVEL * (1 + rng.gauss(0, 0.02)), gain * (1 + rng.gauss(0, 0.04)),
                              tick, by_model=value == 3)
                tick += 1
            tick += 2
    safe.default_tick(LEVEL)
    return safe


def test_the_round_trip_keeps_the_incumbent_the_safe_set_and_the_pairs():
    before = measured()
    after = decode(encode(before), COLUMNS)
    assert after.level == before.level
    for got, want in zip(after.at_level(), before.at_level(), strict=True):
        assert np.array_equal(got, want)
    names = {"knob_x": "x", "knob_mode": "mode"}
    assert Incumbent(after, names).file_text() == Incumbent(before, names).file_text()
    assert Incumbent(after, names).standing().incumbent.knobs == {"x": 2}
    candidates = [{"knob_x": x, "knob_mode": m} for x in range(1, 6) for m in ("a", None)]
    default = np.array([c == {"knob_x": 4, "knob_mode": None} for c in candidates])
    assert np.array_equal(after.allowed(candidates, (5, 2), default),
                          before.allowed(candidates, (5, 2), default))


def test_a_full_ring_comes_back_oldest_first():
    before = measured(kept=50)  # 240 pairs through a ring of 50
    after = decode(encode(before), COLUMNS)
    assert after.pairs_seen == 50
    _, pairs = after.held()
    _, want = before.held()
    assert pairs["tick"].tolist() == want["tick"].tolist()
    assert pairs["tick"].tolist() == sorted(pairs["tick"].tolist())


def damaged_snapshots() -> dict[str, bytes]:
    good = json.loads(encode(measured()))
    cases = {"truncated": encode(measured())[:5000], "not json": b"\x00\xff",
             "a list": b"[]"}

    def edited(change) -> bytes:
        copy = json.loads(json.dumps(good))
        change(copy)
        return json.dumps(copy).encode()

    cases["unknown column"] = edited(lambda s: s["settings"][0].__setitem__(0, ["knob_y", 1]))
    cases["slot out of range"] = edited(lambda s: s["pairs"]["slot"].__setitem__(0, 99))
    cases["lengths differ"] = edited(lambda s: s["pairs"]["tick"].pop())
    cases["ratio a string"] = edited(lambda s: s["pairs"]["ratio"].__setitem__(0, "1.2"))
    cases["negative baseline"] = edited(lambda s: s["pairs"]["baseline"].__setitem__(0, -1))
    cases["too many pairs"] = edited(lambda s: [s["pairs"][k].extend(s["pairs"][k] * 100)
                                                for k in s["pairs"]])
    cases["wrong format"] = edited(lambda s: s.__setitem__("format", 2))
    cases["a bool tick"] = edited(lambda s: s["pairs"]["tick"].__setitem__(0, True))
    return cases


@pytest.mark.parametrize("case", sorted(damaged_snapshots()))
def test_a_damaged_snapshot_is_refused_whole(case):
    with pytest.raises(Refused):
        decode(damaged_snapshots()[case], COLUMNS)


def test_the_file_is_written_when_pairs_are_new_and_read_back(tmp_path):
    keeper = SafeSetFile(tmp_path, COLUMNS, "sim/m")
    keeper.save(SafeSet())  # nothing measured: no file
    assert not (tmp_path / SAFE_SET_FILE).exists()
    safe = measured()
    keeper.save(safe)
    written = (tmp_path / SAFE_SET_FILE).stat().st_mtime_ns
    keeper.save(safe)  # nothing new: not written again
    assert (tmp_path / SAFE_SET_FILE).stat().st_mtime_ns == written
    back, why = SafeSetFile(tmp_path, COLUMNS, "sim/m").load()
    assert why is None and back.pairs_seen == safe.pairs_seen


def test_a_damaged_or_oversized_file_says_why_and_gives_no_pairs(tmp_path):
    path = tmp_path / SAFE_SET_FILE
    path.write_bytes(encode(measured())[:-10])
    back, why = SafeSetFile(tmp_path, COLUMNS, "sim/m").load()
    assert back is None and why.startswith("not JSON")
    path.write_bytes(b" " * (MAX_BYTES + 1))
    back, why = SafeSetFile(tmp_path, COLUMNS, "sim/m").load()
    assert back is None and why == f"over {MAX_BYTES} bytes"
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    back, why = SafeSetFile(tmp_path, COLUMNS, "sim/m").load()
    assert back is None and why.startswith("unreadable")
    assert SafeSetFile(tmp_path / "none", COLUMNS, "sim/m").load() == (None, None)


def test_a_running_model_writes_every_save_every_pairs(tmp_path):
    keeper = SafeSetFile(tmp_path, COLUMNS, "sim/m")
    safe = SafeSet()
    for tick in range(SAVE_EVERY_PAIRS - 1):
        safe.measured({"knob_x": 1}, LEVEL, 1.1, tick)
        keeper.save_now_and_then(safe)
    assert not (tmp_path / SAFE_SET_FILE).exists()
    safe.measured({"knob_x": 1}, LEVEL, 1.1, SAVE_EVERY_PAIRS)
    keeper.save_now_and_then(safe)
    back, _ = SafeSetFile(tmp_path, COLUMNS, "sim/m").load()
    assert back.pairs_seen == SAVE_EVERY_PAIRS
