"""State format 4's write-ahead files, as written before the stores shared one engine.

`tests/data/state-format-4-wal.tar.gz` was made by `build()` below at the commit before
the JSON-lines and Arrow write-ahead code became one engine (mlfs/core/storage/wal.py):
a tick store, a record store and a model's recommendation journal, each with rows sealed
and rows pending, then damaged the way a crash or a bad disk does.  The tests replay those
bytes with today's code (a mount written before must come up with every row), and write
the same input again to show that today's writer makes the same bytes.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mlfs.base.portion import StorePolicy, StoreWatch
from mlfs.base.statedir import upgrade
from mlfs.core.models.journal import Journal
from mlfs.core.storage.records import RecordStore, to_table
from mlfs.core.storage.store import PortionStore

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "state-format-4-wal.tar.gz"
SCHEMA = pa.schema([("tick", pa.int64()), ("value", pa.float64()), ("label", pa.string())])
FIELDS = {"sector": "uint64", "ok": "bool"}
DATASET = "sim/dataset"
RECORDS = "sim/records"
JOURNAL = "sim/models/m1/recommendations"
#: the byte-compared files: everything `build` writes except the journal (its rows carry
#: the wall clock)
COMPARED = [f"{DATASET}/wal.1.jsonl", f"{DATASET}/wal.2.jsonl", f"{RECORDS}/wal.1.arrows",
            f"{RECORDS}/wal.2.arrows"]


def _records(tick: int, rows: int = 7) -> pa.Table:
    arr = np.zeros(rows, dtype=[("sector", np.uint64), ("ok", np.bool_)])
    arr["sector"] = np.arange(tick * 100, tick * 100 + rows)
    arr["ok"] = arr["sector"] % 3 == 0
    return to_table(arr, FIELDS)


def _begin_next_file(store: PortionStore) -> None:
    """The next flush begins a new write-ahead file, as after a write that could not be
    cut back (the fields before the one engine, when made at that commit)."""
    if hasattr(store, "wal"):
        store.wal.seq += 1
        store.wal.created = False
    else:
        store._wal_seq += 1
        store._wal_created = False


def build(state: Path) -> None:
    """A state directory whose stores were left as a SIGKILL and a bad disk leave them.

    dataset: ticks 0..4 sealed; 5..9 in wal.1.jsonl, whose last line lost its newline in
    the middle (a torn write, then a newer file began), and a line that is no JSON; 10..13
    in wal.2.jsonl, the newest, with a torn last line (tick 14, never acknowledged).
    records: ticks 0..1 sealed; 2..4 in wal.1.arrows, whose third batch is damaged below
    the ack mark; 5..6 in wal.2.arrows, the newest, with a torn frame beyond the mark.
    journal: two accepted rows sealed, two strict rows pending.
    """
    upgrade(state)
    watch = StoreWatch()
    dataset = PortionStore(state / DATASET, SCHEMA, "tick", StorePolicy(), watch)
    for tick in range(14):
        dataset.append({"tick": tick, "value": tick / 4, "label": f"t{tick}"})
        if tick == 4:
            dataset.seal_now()
        if tick == 9:
            assert dataset.flush_wal()
            with open(state / DATASET / "wal.1.jsonl", "ab") as fh:
                fh.write(b'{"tick": "not a number"}\n{"tick":99,"val')  # refused, torn
            _begin_next_file(dataset)  # the next flush begins wal.2.jsonl
    assert dataset.flush_wal()
    with open(state / DATASET / "wal.2.jsonl", "ab") as fh:
        fh.write(b'{"tick":14,"value":3.5,"la')
    records = RecordStore(state / RECORDS, FIELDS, StorePolicy(), watch)
    for tick in range(7):
        records.append_table(_records(tick), tick)
        assert records.flush_wal()
        if tick == 1:
            records.seal_now()
        if tick == 4:
            wal = state / RECORDS / "wal.1.arrows"
            data = bytearray(wal.read_bytes())
            data[-20] ^= 0xFF  # inside the last batch's payload: its checksum fails
            wal.write_bytes(bytes(data))
            _begin_next_file(records)
    with open(state / RECORDS / "wal.2.arrows", "ab") as fh:
        fh.write(b"MLFSFRM\x01\x10\x00")  # a frame header cut short, never acknowledged
    journal = Journal(state / JOURNAL, StorePolicy(), watch, "m1", lambda status: None)
    for line in ("read_ahead_kb=512", "read_ahead_kb=256"):
        journal.write("accepted", None, line, "", tick=1, strict=True)
    journal.seal_now()
    for line in ("nr_requests=64", "nr_requests=128"):
        journal.write("accepted", None, line, "", tick=2, strict=True)


def _unpack(target: Path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(target, filter="data")
    return target / "state"


def test_a_state_directory_written_before_the_one_engine_replays_every_row(tmp_path):
    state = _unpack(tmp_path)
    watch = StoreWatch()
    dataset = PortionStore(state / DATASET, SCHEMA, "tick", StorePolicy(), watch)
    assert dataset.pending == 9, "ticks 5..13: the refused line and the torn lines are not rows"
    assert dataset.quarantined_rows == 2, "the line that is no JSON and the older torn line"
    kept = (state / DATASET / "quarantine" / "wal.1.jsonl").read_bytes().splitlines()
    assert kept == [b'{"tick":99,"val', b'{"tick": "not a number"}']
    dataset.seal_now()
    assert dataset.read_all().column("tick").to_pylist() == list(range(14))
    assert not list((state / DATASET).glob("wal.*"))

    records = RecordStore(state / RECORDS, FIELDS, StorePolicy(), watch)
    assert records.replay_lost == 7, "the damaged batch, acknowledged: counted"
    assert (state / RECORDS / "quarantine" / "wal.1.arrows").exists()
    records.seal_now()
    table = records.read_all()
    expected = [s for s in range(49) if not 28 <= s < 35]
    assert table.column("record_seq").to_pylist() == expected
    assert table.column("tick").to_pylist() == [s // 7 for s in expected]
    assert table.column("sector").to_pylist() == [s // 7 * 100 + s % 7 for s in expected]
    assert records.next_seq() == 49

    journal = Journal(state / JOURNAL, StorePolicy(), watch, "m1", lambda status: None)
    assert journal.pending == 2
    assert journal.write("applied", 3, "nr_requests=64", "", tick=3) == 5
    journal.seal_now()
    rows = journal.read_all().to_pylist()
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["line"] for r in rows][2:4] == ["nr_requests=64", "nr_requests=128"]


def test_todays_writer_makes_the_same_bytes_as_the_writer_before(tmp_path):
    build(tmp_path / "state")
    with tarfile.open(FIXTURE) as tar:
        for name in COMPARED:
            old = tar.extractfile(f"state/{name}").read()
            assert (tmp_path / "state" / name).read_bytes() == old, name


@pytest.mark.parametrize("name", COMPARED)
def test_the_fixture_holds_the_damage_it_says(name):
    with tarfile.open(FIXTURE) as tar:
        data = tar.extractfile(f"state/{name}").read()
    if name.endswith(".jsonl"):
        assert not data.endswith(b"\n"), "a torn last line"
        assert all(json.loads(line) for line in data.split(b"\n")[:-1] if b"not" not in line
                   and b"99" not in line)
    else:
        assert data.startswith(b"MLFSRWA\x01")


def make_fixture(target: Path = FIXTURE) -> None:
    """Write the fixture (run once, at the commit before the one engine)."""
    work = Path(target).with_suffix(".work")
    shutil.rmtree(work, ignore_errors=True)
    build(work / "state")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted((work / "state").rglob("*")):
            info = tar.gettarinfo(path, arcname=str(path.relative_to(work)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_file():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    Path(target).write_bytes(buffer.getvalue())
    shutil.rmtree(work)


if __name__ == "__main__":
    make_fixture()
