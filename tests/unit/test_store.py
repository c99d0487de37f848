"""PortionStore: sealing, write-ahead recovery, numbering and retention (no FUSE)."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlfs.base.portion import StorePolicy, portion_name
from mlfs.core.storage.store import PortionStore

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


# ---- faults: nothing acknowledged is lost, nothing is sealed out of order ----

def obstruct(path):
    """Make writing `path` fail with EISDIR (root passes permission checks)."""
    path.mkdir()
    return path


def quarantined(directory) -> list[dict]:
    rows = []
    for path in sorted((directory / "quarantine").glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def test_rows_that_cannot_be_encoded_are_quarantined_and_the_rest_still_seal(tmp_path, caplog):
    store = make_store(tmp_path)
    append_ticks(store, [0, 1])
    store.append({"tick": 2, "value": 1.0, "label": 12345})  # not a string
    store.append({"tick": 3, "value": 1.0, "label": "x", "junk": 1})
    store.append({"tick": 4, "value": 10**30, "label": "an int too big for float64 too"})
    store.append({"tick": 2**70, "value": 1.0, "label": "tick beyond int64"})
    portion = store.seal_now()
    assert portion.number == 1
    assert sealed_ticks(store) == [0, 1, 3]
    assert [row["tick"] for row in quarantined(tmp_path)] == [2, 4, 2**70]
    assert store.quarantined_rows == 3 and store.watch.quarantined_rows_total == 3
    assert "quarantined" in caplog.text
    append_ticks(store, [5, 6])  # the rows after it seal as usual
    assert store.seal_now().number == 2
    assert sealed_ticks(store) == [0, 1, 3, 5, 6]
    assert wal_files(tmp_path) == []


def test_a_failed_seal_is_kept_and_retried_before_any_later_batch(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(0, 5))
    blocker = obstruct(tmp_path / "0000000001.tmp")
    with pytest.raises(OSError):
        store.seal_now()
    assert store.error[1] == "EISDIR" and store.watch.failing
    assert store.waiting == 5 and len(wal_files(tmp_path)) == 1
    append_ticks(store, range(5, 8))  # later rows wait behind the failed batch
    with pytest.raises(OSError):
        store.seal_now()  # the retry takes batch 1 again, not the new rows
    assert store.portions == {}
    blocker.rmdir()
    first = store.seal_now()
    assert (first.number, first.rows) == (1, 5)
    assert store.error is None and not store.watch.failing
    second = store.seal_now()
    assert (second.number, second.rows) == (2, 3)
    assert sealed_ticks(store) == list(range(8))
    assert wal_files(tmp_path) == []


def test_replay_after_a_failed_seal_loses_nothing_and_duplicates_nothing(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, range(0, 5))
    store.seal_now()
    append_ticks(store, range(5, 9))
    obstruct(tmp_path / "0000000002.tmp")
    with pytest.raises(OSError):
        store.seal_now()
    append_ticks(store, range(9, 12))
    store.close()  # the daemon dies with batch 2 unsealed and rows pending
    (tmp_path / "0000000002.tmp").rmdir()
    again = make_store(tmp_path)
    assert again.pending == 7
    again.seal_now()
    assert sealed_ticks(again) == list(range(12))
    again.close()
    assert sealed_ticks(make_store(tmp_path)) == list(range(12))


def test_a_failed_write_ahead_write_takes_the_row_back_and_reports_the_errno(tmp_path):
    from mlfs.base.portion import StoreError

    store = make_store(tmp_path, durable=True)
    append_ticks(store, [0])
    store.seal_now()
    blocker = obstruct(tmp_path / "wal.1.jsonl")
    with pytest.raises(StoreError) as failed:
        store.append({"tick": 1, "value": 0.5, "label": "a"}, strict=True)
    assert failed.value.errno == 21  # EISDIR
    assert store.pending == 0 and store.rows_total == 1, "nothing changed"
    assert store.watch.reason() == "storage: EISDIR writing " + store.kind
    store.append({"tick": 2, "value": 1.0, "label": "queued"})  # no writer waits: kept
    assert store.pending == 1
    blocker.rmdir()
    assert store.flush_wal()
    assert store.error is None and not store.watch.failing
    store.append({"tick": 3, "value": 1.5, "label": "b"}, strict=True)
    store.close()
    assert [json.loads(x)["tick"] for x in (tmp_path / "wal.1.jsonl").read_text().split()] \
        == [2, 3]


def test_a_full_store_refuses_strict_rows_with_enospc(tmp_path):
    from mlfs.base.portion import StoreError

    store = make_store(tmp_path, max_waiting_rows=3)
    append_ticks(store, range(3))
    assert store.full
    with pytest.raises(StoreError) as failed:
        store.append({"tick": 3, "value": 0.0, "label": "x"}, strict=True)
    assert failed.value.errno == 28
    assert store.pending == 3


@pytest.mark.parametrize("line", [b"[1,2,3]", b'{"tick":"abc"}', b"42", b'{"value":"x"}',
                                  b"not json"])
def test_damaged_write_ahead_lines_are_quarantined_and_the_rest_replayed(tmp_path, line,
                                                                         caplog):
    store = make_store(tmp_path)
    append_ticks(store, [0, 1])
    store.close()
    (wal,) = wal_files(tmp_path)
    good = b'{"tick":2,"value":1.0,"label":"after"}\n'
    wal.write_bytes(wal.read_bytes() + line + b"\n" + good)
    again = make_store(tmp_path)
    assert again.pending == 3
    (kept,) = (tmp_path / "quarantine").iterdir()
    assert kept.read_bytes() == line + b"\n"
    assert "quarantined" in caplog.text
    again.seal_now()
    assert sealed_ticks(again) == [0, 1, 2]
    assert wal_files(tmp_path) == []
    # the quarantine file is not lost or repeated by the next start
    again.close()
    make_store(tmp_path)
    assert len(list((tmp_path / "quarantine").iterdir())) == 1


def test_a_torn_line_in_an_older_write_ahead_file_is_quarantined_not_dropped(tmp_path):
    store = make_store(tmp_path)
    append_ticks(store, [0])
    store.flush_wal()
    store.close()
    (old,) = wal_files(tmp_path)
    with open(old, "ab") as fh:
        fh.write(b'{"tick":1,"val')
    (tmp_path / "wal.5.jsonl").write_bytes(b'{"tick":2,"value":0.0,"label":"n"}\n')
    again = make_store(tmp_path)
    assert again.pending == 2
    assert [p.name for p in (tmp_path / "quarantine").iterdir()] == [old.name]


@pytest.mark.parametrize("damage", [b"banana\n", b"-4\n", b"\xff\xfe", b""])
def test_a_damaged_portion_counter_is_recomputed_from_the_portions(tmp_path, damage, caplog):
    store = make_store(tmp_path)
    for start in (0, 2, 4):
        append_ticks(store, range(start, start + 2))
        store.seal_now()
    store.close()
    (tmp_path / "next_portion").write_bytes(damage)
    again = make_store(tmp_path)
    append_ticks(again, [6])
    assert again.seal_now().number == 4
    if damage:
        assert "next_portion" in caplog.text
        assert (tmp_path / "next_portion.damaged").exists()


def test_an_idle_store_holds_no_file_descriptor(tmp_path):
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    stores = [make_store(tmp_path / str(i), durable=bool(i % 2)) for i in range(40)]
    for i, store in enumerate(stores):
        append_ticks(store, [i])
        store.flush_wal()
    assert fds() <= before + 2, "a store keeps a descriptor open between writes"
    for store in stores:
        store.seal_now()
        store.settle()
    assert not any(store.watch.dirty for store in stores), "sealed stores leave the dirty set"
