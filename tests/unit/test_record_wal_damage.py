"""A record store's write-ahead files after damage (redteam3 W2-W5, W7, W8): every intact,
acknowledged batch comes back, the damaged file is copied to quarantine/, the records it
lost are counted (`replay_lost`, the runtime's `records_lost`) and a WARNING says so; only
a torn frame that was never acknowledged is skipped quietly.

The damage is put where the writer's bytes are found by value (a batch's record_seq
column), so each test means the same on the format before frames and after."""

import logging
import os
import struct

import numpy as np
import pyarrow as pa
import pytest

from mlfs.base.portion import StorePolicy
from mlfs.core.storage.records import RecordStore, record_schema, to_table

FIELDS = {"sector": "uint64"}
BATCHES, ROWS = 10, 10


def _store(path) -> RecordStore:
    return RecordStore(path, FIELDS, StorePolicy())


def _batch(tick: int) -> pa.Table:
    arr = np.zeros(ROWS, dtype=[("sector", np.uint64)])
    arr["sector"] = np.arange(tick * ROWS, (tick + 1) * ROWS)
    return to_table(arr, FIELDS)


def _fill(path, batches: int = BATCHES) -> list[bytes]:
    """Flush `batches` batches, one per flush (as the seal loop does, tick by tick); the
    write-ahead file's bytes after each flush."""
    store = _store(path)
    states = []
    for tick in range(batches):
        store.append_table(_batch(tick), tick=tick)
        assert store.flush_wal()
        (wal,) = path.glob("wal.*.arrows")
        states.append(wal.read_bytes())
    return states


def _seq_at(data: bytes, first: int) -> int:
    """Where the record_seq column of the batch starting at `first` lies in the file."""
    at = data.find(struct.pack("<QQ", first, first + 1))
    assert at > 0
    return at


def _replayed(path) -> list[int]:
    store = _store(path)
    table = pa.concat_tables(store._tables) if store._tables else None
    return [] if table is None else table.column("record_seq").to_pylist()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _expect_set_aside(tmp_path, caplog, wal_name: str, lost: int) -> RecordStore:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        store = _store(tmp_path)
    assert (tmp_path / "quarantine" / wal_name).exists(), "a copy of the damaged file"
    assert store.replay_lost == lost
    assert any("damaged" in m and f"{lost} records lost" in m for m in _warnings(caplog)), \
        caplog.text
    return store


def test_w3_damage_in_the_middle_of_the_newest_file_keeps_every_intact_batch_after_it(
        tmp_path, caplog):
    data = bytearray(_fill(tmp_path)[-1])
    at = _seq_at(data, 50)
    data[at - 24:at - 8] = bytes(16)  # the end of batch 5's message metadata
    (tmp_path / "wal.0.arrows").write_bytes(bytes(data))
    seqs = _replayed(tmp_path)
    assert seqs == [s for s in range(100) if not 50 <= s < 60], \
        f"{len(seqs)} of the 90 intact rows back"
    _expect_set_aside(tmp_path, caplog, "wal.0.arrows", 10)


def test_w3_the_damaged_file_is_kept_after_the_next_seal(tmp_path, caplog):
    data = bytearray(_fill(tmp_path)[-1])
    at = _seq_at(data, 50)
    data[at:at + 16] = os.urandom(16)
    (tmp_path / "wal.0.arrows").write_bytes(bytes(data))
    store = _expect_set_aside(tmp_path, caplog, "wal.0.arrows", 10)
    portion = store.seal_now()
    assert portion.rows == 90
    assert not (tmp_path / "wal.0.arrows").exists()
    assert (tmp_path / "quarantine" / "wal.0.arrows").read_bytes() == bytes(data)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_w4_a_flipped_record_seq_sets_its_batch_aside_and_the_store_opens(
        tmp_path, caplog, value):
    data = bytearray(_fill(tmp_path)[-1])
    at = _seq_at(data, 30)
    data[at:at + 8] = struct.pack("<Q", value)
    (tmp_path / "wal.0.arrows").write_bytes(bytes(data))
    assert _replayed(tmp_path) == [s for s in range(100) if not 30 <= s < 40]
    store = _expect_set_aside(tmp_path, caplog, "wal.0.arrows", 10)
    assert store.next_seq() == 100


def test_w4_a_newest_sealed_record_seq_past_2_63_does_not_stop_the_store(tmp_path):
    """Replay compares the files' record_seq with the newest portion's: at 2**63 and more
    that used to be a Python int pyarrow could not compare with a uint64 column."""
    import pyarrow.parquet as pq

    store = _store(tmp_path)
    store.append_table(_batch(0), tick=0)
    portion = store.seal_now()
    store.append_table(_batch(1), tick=1)
    assert store.flush_wal()
    table = pq.read_table(portion.path)
    seq = pa.array([2**63 + i for i in range(ROWS)], pa.uint64())
    pq.write_table(table.set_column(0, "record_seq", seq), portion.path)
    again = _store(tmp_path)  # opens; its rows are at or below that floor
    assert again.last_key == 2**63 + ROWS - 1 and again.pending == 0


def test_w5_a_record_seq_of_zero_sets_its_batch_aside_and_says_so(tmp_path, caplog):
    data = bytearray(_fill(tmp_path)[-1])
    at = _seq_at(data, 40)
    data[at:at + 8] = struct.pack("<Q", 0)
    (tmp_path / "wal.0.arrows").write_bytes(bytes(data))
    assert _replayed(tmp_path) == [s for s in range(100) if not 40 <= s < 50]
    _expect_set_aside(tmp_path, caplog, "wal.0.arrows", 10)


def test_w2_a_truncated_newest_file_keeps_whole_batches_and_counts_the_acknowledged_rest(
        tmp_path, caplog):
    data = _fill(tmp_path)[-1]
    (tmp_path / "wal.0.arrows").write_bytes(data[:int(len(data) * 0.6)])
    seqs = _replayed(tmp_path)
    assert seqs == list(range(len(seqs))) and 40 <= len(seqs) < 70
    store = _expect_set_aside(tmp_path, caplog, "wal.0.arrows", 100 - len(seqs))
    assert store.next_seq() == 100, "a lost record's number is not given to a new one"


def test_w2_a_torn_frame_that_was_never_acknowledged_is_skipped_quietly(tmp_path, caplog):
    """A SIGKILL in the middle of a flush: the file holds the earlier flushes' frames and
    their ack mark, then part of the frame being written; the flush never returned."""
    states = _fill(tmp_path)
    before, after = states[-2], states[-1]
    for cut in (3, 50, (len(after) - len(before)) - 8):
        (tmp_path / "wal.0.arrows").write_bytes(before + after[len(before):len(before) + cut])
        caplog.clear()
        with caplog.at_level(logging.INFO):
            store = _store(tmp_path)
        assert store.pending == 90 and store.replay_lost == 0
        assert not (tmp_path / "quarantine").exists()
        assert not _warnings(caplog)
        assert "never acknowledged" in caplog.text


@pytest.mark.parametrize("content", [os.urandom(4096), b"", b"\xff\xff\xff\xff"
                                     + struct.pack("<i", 0x7FFFFFFF) + bytes(4088)],
                         ids=["garbage", "empty", "metadata-length-0x7fffffff"])
def test_w7_a_write_ahead_file_that_is_no_such_file_is_set_aside(tmp_path, caplog, content):
    (tmp_path / "wal.0.arrows").write_bytes(content)
    with caplog.at_level(logging.INFO):
        store = _store(tmp_path)
    assert store.pending == 0
    assert (tmp_path / "quarantine" / "wal.0.arrows").read_bytes() == content
    assert any("damaged" in m for m in _warnings(caplog)), caplog.text


def test_w7_a_huge_frame_length_loses_only_its_own_batch(tmp_path, caplog):
    data = bytearray(_fill(tmp_path)[-1])
    at = _seq_at(data, 20)
    frame = data.rfind(b"MLFSFRM\x01", 0, at)
    data[frame + 8:frame + 16] = struct.pack("<Q", 0x7FFFFFFF)
    (tmp_path / "wal.0.arrows").write_bytes(bytes(data))
    assert _replayed(tmp_path) == [s for s in range(100) if not 20 <= s < 30]
    _expect_set_aside(tmp_path, caplog, "wal.0.arrows", 10)


def test_w8_a_directory_in_the_write_ahead_files_place_is_moved_aside(tmp_path, caplog):
    _fill(tmp_path, 3)
    (tmp_path / "wal.1.arrows").mkdir()
    (tmp_path / "wal.1.arrows" / "x").write_text("x")
    with caplog.at_level(logging.INFO):
        store = _store(tmp_path)
    assert store.pending == 30
    assert (tmp_path / "quarantine" / "wal.1.arrows" / "x").read_text() == "x"
    assert not (tmp_path / "wal.1.arrows").exists()
    assert any("a directory" in m for m in _warnings(caplog))
    store.append_table(_batch(3), tick=3)
    assert store.flush_wal() and store.seal_now().rows == 40


def test_a_file_written_before_frames_replays_and_resynchronises_past_damage(tmp_path,
                                                                              caplog):
    """State format 3 as written before frames: a plain Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    schema = record_schema(FIELDS)
    with pa.ipc.new_stream(sink, schema) as writer:
        for tick in range(BATCHES):
            table = _batch(tick)
            seq = pa.array(np.arange(tick * ROWS, (tick + 1) * ROWS, dtype=np.uint64))
            ticks = pa.array(np.full(ROWS, tick, dtype=np.int64))
            writer.write_batch(pa.RecordBatch.from_arrays(
                [seq, ticks, *(c.combine_chunks() for c in table.columns)], schema=schema))
    legacy = sink.getvalue().to_pybytes()[:-8]  # the old writer wrote no end marker
    (tmp_path / "wal.3.arrows").write_bytes(legacy)
    assert _replayed(tmp_path) == list(range(100))
    damaged = bytearray(legacy)
    message = damaged.rfind(b"\xff\xff\xff\xff", 0, _seq_at(legacy, 60))
    damaged[message + 4:message + 8] = struct.pack("<i", 0x7FFFFFFF)
    (tmp_path / "wal.3.arrows").write_bytes(bytes(damaged))
    assert _replayed(tmp_path) == [s for s in range(100) if not 60 <= s < 70]
    store = _expect_set_aside(tmp_path, caplog, "wal.3.arrows", 10)
    store.append_table(_batch(10), tick=10)  # new batches go to a new, framed file
    assert store.flush_wal()
    assert (tmp_path / "wal.4.arrows").read_bytes().startswith(b"MLFSRWA\x01")
    assert store.seal_now().rows == 100


def test_a_damaged_ack_mark_keeps_the_batches_and_says_the_count_is_a_floor(tmp_path,
                                                                            caplog):
    data = bytearray(_fill(tmp_path)[-1])
    data[20:24] = b"\xff\xff\xff\xff"  # inside the ack mark
    (tmp_path / "wal.0.arrows").write_bytes(bytes(data))
    with caplog.at_level(logging.INFO):
        store = _store(tmp_path)
    assert store.pending == 100 and store.replay_lost == 0
    assert (tmp_path / "quarantine" / "wal.0.arrows").exists()
    assert any("at least 0 records lost" in m for m in _warnings(caplog)), caplog.text


def test_a_directory_in_a_tick_stores_write_ahead_files_place_is_moved_aside(tmp_path,
                                                                             caplog):
    """The same rule for the JSON-lines write-ahead files of tick stores."""
    from mlfs.core.storage.store import PortionStore

    schema = pa.schema([("tick", pa.int64()), ("value", pa.float64())])
    store = PortionStore(tmp_path, schema, "tick", StorePolicy())
    store.append({"tick": 1, "value": 1.0})
    assert store.flush_wal()
    (tmp_path / "wal.7.jsonl").mkdir()
    with caplog.at_level(logging.INFO):
        again = PortionStore(tmp_path, schema, "tick", StorePolicy())
    assert again.pending == 1
    assert (tmp_path / "quarantine" / "wal.7.jsonl").is_dir()
    assert any("a directory" in m for m in _warnings(caplog))


def test_a_damaged_schema_frame_loses_no_batch_and_counts_nothing_below_the_file(
        tmp_path, caplog):
    store = _store(tmp_path)
    store.append_table(_batch(0), tick=0)
    store.seal_now()  # wal.1.arrows starts at record_seq 10
    for tick in (1, 2, 3):
        store.append_table(_batch(tick), tick=tick)
        assert store.flush_wal()
    (wal,) = tmp_path.glob("wal.*.arrows")
    data = bytearray(wal.read_bytes())
    schema_frame = data.find(b"MLFSFRM\x01")
    data[schema_frame + 60:schema_frame + 64] = b"\x00\x01\x02\x03"
    wal.write_bytes(bytes(data))
    assert _replayed(tmp_path) == list(range(10, 40))
    _expect_set_aside(tmp_path, caplog, wal.name, 0)
