"""Record stores: batches in, numbered and sealed as Parquet, replayed after a crash, never
half-stored."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlfs.base.portion import StorePolicy
from mlfs.core.storage.arrow_wal import read_wal
from mlfs.core.storage.records import RecordsRefused, RecordStore, record_schema, to_table

FIELDS = {"device": "string", "sector": "uint64", "latency_us": "float64", "ok": "bool"}


def _batch(n: int, start: int = 0) -> np.ndarray:
    out = np.empty(n, dtype=[("device", "U8"), ("sector", np.uint64),
                             ("latency_us", np.float64), ("ok", np.bool_)])
    out["device"] = "loop3"
    out["sector"] = np.arange(start, start + n)
    out["latency_us"] = 10.0
    out["ok"] = True
    return out


def _store(path, **policy) -> RecordStore:
    return RecordStore(path, FIELDS, StorePolicy(**policy))


def _rows_per_frame(wal) -> list[int]:
    """The batches a write-ahead file holds, as their row counts, read as replay reads."""
    scan = read_wal(wal.read_bytes(), record_schema(FIELDS))
    assert not scan.damage and not scan.torn
    return [frame.batch.num_rows for frame in scan.frames]


def test_batches_are_numbered_across_ticks_and_sealed_into_one_portion(tmp_path):
    store = _store(tmp_path)
    store.append_table(to_table(_batch(1000), FIELDS), tick=7)
    store.append_table(to_table(pa.table({"device": ["sda"], "sector": pa.array([5], pa.uint64()),
                                          "latency_us": [1.5], "ok": [False]}), FIELDS), tick=8)
    store.append_table(to_table(_batch(0), FIELDS), tick=9)  # a tick without records
    portion = store.seal_now()
    table = pq.read_table(portion.path)
    assert table.num_rows == 1001
    assert table.column("record_seq").to_pylist() == list(range(1001))
    assert table.column("tick").to_pylist()[-2:] == [7, 8]
    assert table.schema.field("sector").type == pa.uint64()


def test_a_crash_before_the_seal_loses_nothing_and_keeps_the_numbering(tmp_path):
    store = _store(tmp_path)
    store.append_table(to_table(_batch(300), FIELDS), tick=1)
    store.seal_now()
    store.append_table(to_table(_batch(200, 300), FIELDS), tick=2)
    store.append_table(to_table(_batch(100, 500), FIELDS), tick=3)
    assert store.flush_wal()
    # the process dies here: no seal, no close
    again = _store(tmp_path)
    assert again.pending == 300
    again.append_table(to_table(_batch(5, 600), FIELDS), tick=4)
    again.seal_now()
    seq = pa.concat_tables([pq.read_table(p.path) for p in again.portions.values()])
    assert sorted(seq.column("record_seq").to_pylist()) == list(range(605))
    assert sorted(seq.column("sector").to_pylist()) == list(range(605))


def test_a_torn_last_batch_is_skipped_and_earlier_batches_are_kept(tmp_path):
    store = _store(tmp_path)
    store.append_table(to_table(_batch(10), FIELDS), tick=1)
    assert store.flush_wal()
    wal = next(tmp_path.glob("wal.*.arrows"))
    before = wal.read_bytes()
    store.append_table(to_table(_batch(10, 10), FIELDS), tick=2)
    assert store.flush_wal()
    # the second flush's write never finished: its frame is cut, the ack mark is the first's
    wal.write_bytes(before + wal.read_bytes()[len(before):-9])
    again = _store(tmp_path)
    assert again.pending == 10
    assert again.next_seq() == 10
    assert again.replay_lost == 0 and not (tmp_path / "quarantine").exists()


def test_a_batch_that_does_not_match_the_declared_fields_is_refused_whole(tmp_path):
    with pytest.raises(RecordsRefused, match="not declared"):
        to_table(pa.table({"device": ["x"], "sector": [1], "latency_us": [1.0], "ok": [True],
                           "pid": [3]}), FIELDS)
    with pytest.raises(RecordsRefused, match="missing"):
        to_table(pa.table({"device": ["x"]}), FIELDS)
    with pytest.raises(RecordsRefused, match="'sector' is not uint64"):
        to_table(pa.table({"device": ["x"], "sector": [-1], "latency_us": [1.0],
                           "ok": [True]}), FIELDS)
    with pytest.raises(RecordsRefused, match="structured dtype"):
        to_table(np.zeros(3), FIELDS)


def test_a_full_store_refuses_a_batch_and_changes_nothing(tmp_path):
    from mlfs.base.portion import StoreError

    store = _store(tmp_path, max_waiting_rows=100)
    store.append_table(to_table(_batch(100), FIELDS), tick=1)
    with pytest.raises(StoreError):
        store.append_table(to_table(_batch(1), FIELDS), tick=2)
    assert store.pending == 100 and store.next_seq() == 100


def test_batches_flushed_one_at_a_time_make_one_stream_that_replays_whole(tmp_path):
    store = _store(tmp_path)
    for tick in range(5):  # the seal loop flushes every 50 ms: one file, many flushes
        store.append_table(to_table(_batch(100, 100 * tick), FIELDS), tick=tick)
        assert store.flush_wal()
    (wal,) = tmp_path.glob("wal.*.arrows")
    assert _rows_per_frame(wal) == [100] * 5, "one schema frame, then the batches"
    again = _store(tmp_path)
    assert again.pending == 500 and again.next_seq() == 500
    portion = again.seal_now()
    assert pq.read_table(portion.path).column("sector").to_pylist() == list(range(500))


def test_a_flush_that_fails_midway_keeps_whole_batches_and_the_retry_completes_the_file(
        tmp_path, monkeypatch):
    import errno
    import os

    from mlfs.core.storage import arrow_wal

    store = _store(tmp_path)
    store.append_table(to_table(_batch(100), FIELDS), tick=1)
    assert store.flush_wal()
    store.append_table(to_table(_batch(100, 100), FIELDS), tick=2)
    store.append_table(to_table(_batch(100, 200), FIELDS), tick=3)
    real_write, budget = os.write, [900]  # the disk fills in the middle of a batch

    def filling(fd, data):
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        count = real_write(fd, bytes(data)[:budget[0]])
        budget[0] -= count
        return count

    monkeypatch.setattr(arrow_wal.os, "write", filling)
    assert not store.flush_wal()
    assert store.error == (errno.ENOSPC, "ENOSPC")
    (wal,) = tmp_path.glob("wal.*.arrows")
    assert _rows_per_frame(wal) == [100], \
        "the torn batch is cut off: the file holds whole batches only"
    monkeypatch.setattr(arrow_wal.os, "write", real_write)
    assert store.flush_wal() and store.error is None
    assert _rows_per_frame(wal) == [100] * 3
    again = _store(tmp_path)  # a crash now loses nothing
    assert again.pending == 300
    assert pq.read_table(again.seal_now().path).column("record_seq").to_pylist() == \
        list(range(300))


def test_a_tear_that_cannot_be_cut_off_closes_that_file_and_nothing_is_lost(
        tmp_path, monkeypatch):
    import errno
    import os

    from mlfs.core.storage import arrow_wal

    store = _store(tmp_path)
    store.append_table(to_table(_batch(100), FIELDS), tick=1)
    assert store.flush_wal()
    store.append_table(to_table(_batch(100, 100), FIELDS), tick=2)
    real_write, budget = os.write, [500]

    def failing(fd, data):  # an I/O error in the middle of the batch
        if budget[0] <= 0:
            raise OSError(errno.EIO, "Input/output error")
        count = real_write(fd, bytes(data)[:budget[0]])
        budget[0] -= count
        return count

    def no_cut(fd, length):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(arrow_wal.os, "write", failing)
    monkeypatch.setattr(arrow_wal.os, "ftruncate", no_cut)
    assert not store.flush_wal() and store.error == (errno.EIO, "EIO")
    monkeypatch.undo()
    store.append_table(to_table(_batch(100, 200), FIELDS), tick=3)
    assert store.flush_wal()
    torn, fresh = sorted(tmp_path.glob("wal.*.arrows"))
    assert _rows_per_frame(fresh) == [100, 100], \
        "the batches not written go to a new file, never after the tear"
    assert read_wal(torn.read_bytes(), record_schema(FIELDS)).torn, "the tear stays"
    again = _store(tmp_path)  # a crash now: the torn file's whole batch, then the new file
    assert again.pending == 300
    # the tear lies past the torn file's ack mark: that write never returned, and its
    # batch went to the new file; nothing was lost, so nothing is set aside or counted
    assert again.replay_lost == 0 and not (tmp_path / "quarantine").exists()
    assert sorted(pq.read_table(again.seal_now().path).column("sector").to_pylist()) == \
        list(range(300))
