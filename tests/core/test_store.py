"""PortionStore: sealing, write-ahead recovery, numbering and retention (no FUSE)."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlfs.core.store import PortionStore, StorePolicy, portion_name

SCHEMA = pa.schema([("tick", pa.int64()), ("value", pa.float64()), ("label", pa.string())])


def make_store(directory, **policy) -> PortionStore:
    return PortionStore(directory, SCHEMA, "tick", StorePolicy(**policy))


def append_ticks(store: PortionStore, ticks) -> None:
    for tick in ticks:
        store.append({"tick": tick, "value": tick / 2, "label": f"row{tick}"})


def wal_files(directory):
    return sorted(p for p in directory.iterdir() if p.name.startswith("wal."))


def sealed_ticks(store: PortionStore) -> list[int]:
    return store.read_all().column("tick").to_pylist()


def test_seal_writes_one_complete_portion_per_batch_with_rising_numbers(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(0, 5))
    first = store.seal_now()
    append_ticks(store, range(5, 8))
    second = store.seal_now()
    assert (first.number, second.number) == (1, 2)
    assert first.path.name == portion_name(1) == "0000000001.parquet"
    assert pq.read_table(first.path).column("tick").to_pylist() == [0, 1, 2, 3, 4]
    assert (first.rows, second.rows) == (5, 3)
    assert first.size == first.path.stat().st_size
    assert pq.read_table(second.path).schema.equals(SCHEMA)
    assert store.pending == 0
    assert store.seal_now() is None, "sealing with nothing pending must not make a portion"
    assert not list(tmp_path.glob("*.tmp"))


def test_pending_rows_come_back_from_the_write_ahead_file_after_a_crash(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(0, 10))
    store.seal_now()
    append_ticks(store, range(10, 17))
    store.close()  # the process dies: nothing else runs
    again = make_store(tmp_path)
    assert again.pending == 7
    assert again.next_number == 2
    again.seal_now()
    assert sealed_ticks(again) == list(range(17))


def test_a_torn_last_write_ahead_line_is_dropped_and_the_rest_recovered(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(0, 4))
    store.close()
    (wal,) = wal_files(tmp_path)
    with open(wal, "ab") as fh:
        fh.write(b'{"tick":4,"value":2.0,"la')  # SIGKILL in the middle of a write
    again = make_store(tmp_path)
    assert again.pending == 4
    again.seal_now()
    assert sealed_ticks(again) == [0, 1, 2, 3]
    # the rows appended after recovery are well-formed again
    append_ticks(again, [4])
    again.seal_now()
    assert sealed_ticks(again) == [0, 1, 2, 3, 4]


def test_rows_already_sealed_are_not_replayed_from_a_leftover_write_ahead_file(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(0, 6))
    store.flush_wal()
    (wal,) = wal_files(tmp_path)
    saved = wal.read_bytes()
    store.seal_now()
    store.close()
    wal.write_bytes(saved)  # crash between the portion's rename and the WAL's unlink
    again = make_store(tmp_path)
    assert again.pending == 0
    assert sealed_ticks(again) == list(range(6))


def test_a_crash_during_recovery_never_duplicates_rows(tmp_path):
    """Recovery keeps the old WAL (no copy) until a portion holds its rows."""
    store = make_store(tmp_path)
    append_ticks(store, range(0, 5))
    store.close()
    (old,) = wal_files(tmp_path)
    recovered = make_store(tmp_path)  # replays, keeps the file
    append_ticks(recovered, [5])
    recovered.close()  # dies again before sealing
    assert len(wal_files(tmp_path)) == 2
    again = make_store(tmp_path)
    again.seal_now()
    ticks = sealed_ticks(again)
    assert ticks == sorted(set(ticks)), f"a tick was recovered twice: {ticks}"
    assert ticks == [0, 1, 2, 3, 4, 5]
    assert wal_files(tmp_path) == [], "a sealed batch's write-ahead files all go"


def test_portion_numbers_are_never_reused_after_discard_and_restart(tmp_path):
    store = make_store(tmp_path)
    for start in (0, 3, 6):
        append_ticks(store, range(start, start + 3))
        store.seal_now()
    removed = store.discard()
    assert sorted(p.number for p in removed) == [1, 2, 3]
    assert not list(tmp_path.glob("*.parquet"))
    append_ticks(store, [9])
    assert store.seal_now().number == 4
    store.discard()
    store.close()
    again = make_store(tmp_path)
    assert again.portions == {}
    append_ticks(again, [10])
    assert again.seal_now().number == 5


def test_restart_keeps_every_sealed_portion_and_continues_the_numbering(tmp_path):
    store = make_store(tmp_path)
    for start in (0, 2, 4):
        append_ticks(store, range(start, start + 2))
        store.seal_now()
    store.close()
    again = make_store(tmp_path)
    assert sorted(again.portions) == [1, 2, 3]
    assert again.last_key == 5
    assert all(p.size == p.path.stat().st_size for p in again.portions.values())
    append_ticks(again, [6])
    assert again.seal_now().number == 4


def test_retention_by_count_removes_the_oldest_portions(tmp_path):
    store = make_store(tmp_path, retention_count=3)
    for start in range(0, 10, 2):
        append_ticks(store, range(start, start + 2))
        store.seal_now()
    assert sorted(store.portions) == [3, 4, 5]
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == [
        portion_name(n) for n in (3, 4, 5)]
    assert sealed_ticks(store) == list(range(4, 10))


def test_retention_by_bytes_removes_the_oldest_but_keeps_the_newest(tmp_path):
    probe = make_store(tmp_path / "probe")
    append_ticks(probe, range(3))
    size = probe.seal_now().size
    store = make_store(tmp_path / "store", retention_bytes=int(size * 2.5))
    for start in range(0, 15, 3):
        append_ticks(store, range(start, start + 3))
        store.seal_now()
    assert store.bytes() <= size * 2.5
    assert max(store.portions) == 5
    assert len(store.portions) == 2
    assert store.removed_total == 3
    tiny = make_store(tmp_path / "tiny", retention_bytes=1)
    append_ticks(tiny, range(3))
    tiny.seal_now()
    append_ticks(tiny, range(3, 6))
    tiny.seal_now()
    assert sorted(tiny.portions) == [2], "the newest portion always stays"


def test_leftover_temporary_files_are_removed_and_damaged_portions_set_aside(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(3))
    store.seal_now()
    store.close()
    (tmp_path / "0000000002.tmp").write_bytes(b"half a portion")
    (tmp_path / portion_name(3)).write_bytes(b"not parquet at all")
    again = make_store(tmp_path)
    assert sorted(again.portions) == [1]
    assert not (tmp_path / "0000000002.tmp").exists()
    assert (tmp_path / "0000000003.parquet.damaged").exists()
    append_ticks(again, [3])
    assert again.seal_now().number == 4, "a damaged portion's number is not reused"


def test_due_by_rows_or_by_age(tmp_path):
    store = make_store(tmp_path, seal_rows=3, seal_seconds=60.0)
    assert not store.due()
    append_ticks(store, [0])
    assert not store.due()
    import time

    assert store.due(time.monotonic() + 61)
    append_ticks(store, [1, 2])
    assert store.due()


def test_write_ahead_lines_are_json_rows(tmp_path):
    store = make_store(tmp_path, durable=True)
    append_ticks(store, [7])
    (wal,) = wal_files(tmp_path)
    assert [json.loads(line) for line in wal.read_text().splitlines()] == [
        {"tick": 7, "value": 3.5, "label": "row7"}]
    store.close()


@pytest.mark.parametrize("crash_after_unlink", [False, True])
def test_a_sealed_batch_leaves_no_write_ahead_rows_behind(tmp_path, crash_after_unlink):
    store = make_store(tmp_path)
    append_ticks(store, range(4))
    batch = store.take_batch()
    append_ticks(store, [4])  # rows arriving while the batch is encoded
    portion = store.write_batch(batch)
    if not crash_after_unlink:
        store.commit(portion)
    store.close()
    shutil.copytree(tmp_path, tmp_path.parent / (tmp_path.name + "-copy"))
    again = make_store(tmp_path.parent / (tmp_path.name + "-copy"))
    again.seal_now()
    assert sealed_ticks(again) == [0, 1, 2, 3, 4]
    assert not os.path.exists(batch.wal_path)
