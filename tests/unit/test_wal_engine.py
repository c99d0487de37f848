"""The one write-ahead engine (mlfs/core/storage/wal.py) under both codecs: the rules it
holds for every store, shown once for JSON lines and once for Arrow frames."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pyarrow as pa
import pytest

from mlfs.base.portion import StoreError, StorePolicy
from mlfs.core.storage.records import RecordStore, to_table
from mlfs.core.storage.store import PortionStore
from mlfs.core.storage.wal import WriteAhead
from mlfs.core.storage.wal_lines import LineCodec

SCHEMA = pa.schema([("tick", pa.int64()), ("label", pa.string())])
FIELDS = {"sector": "uint64"}


def _ticks(store: PortionStore) -> list[int]:
    return store.read_all().column("tick").to_pylist()


def _records(tick: int) -> pa.Table:
    arr = np.zeros(10, dtype=[("sector", np.uint64)])
    arr["sector"] = np.arange(tick * 10, tick * 10 + 10)
    return to_table(arr, FIELDS)


@pytest.mark.parametrize("name, seq", [("wal.7.jsonl", 7), ("wal.0.jsonl", 0),
                                       ("wal.x.jsonl", None), ("wal.7.arrows", None),
                                       ("wal.\u00b2.jsonl", None), ("wal..jsonl", None),
                                       ("xwal.7.jsonl", None)])
def test_a_write_ahead_file_is_known_by_its_prefix_number_and_codec_suffix(tmp_path, name,
                                                                           seq):
    assert WriteAhead(tmp_path, LineCodec({}, "tick")).seq_of(tmp_path / name) == seq


def test_a_strict_line_cut_half_way_that_cannot_be_cut_off_moves_to_a_new_file(
        tmp_path, monkeypatch, caplog):
    """The torn part of a strict row stays where it is only when it cannot be cut; then
    no later line may be glued to it: the next write begins a new file (as a record
    store's torn frame does), and replay keeps every row and quarantines the torn part."""
    store = PortionStore(tmp_path, SCHEMA, "tick", StorePolicy())
    store.append({"tick": 0, "label": "a"}, strict=True)
    real_write = os.write
    calls = []

    def half(fd, data):  # the first write takes 7 bytes, the next one fails
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.EIO, "I/O error")
        return real_write(fd, bytes(data[:7]))

    def refuse(fd, length):
        raise OSError(errno.EROFS, "read-only")

    monkeypatch.setattr(os, "write", half)
    monkeypatch.setattr(os, "ftruncate", refuse)
    with caplog.at_level(logging.ERROR), pytest.raises(StoreError) as failed:
        store.append({"tick": 1, "label": "lost"}, strict=True)
    assert failed.value.errno == errno.EIO and store.pending == 1
    assert "could not be cut off" in caplog.text
    monkeypatch.undo()
    store.append({"tick": 2, "label": "b"}, strict=True)
    assert sorted(p.name for p in tmp_path.glob("wal.*")) == ["wal.0.jsonl", "wal.1.jsonl"]
    again = PortionStore(tmp_path, SCHEMA, "tick", StorePolicy())
    assert again.pending == 2 and again.quarantined_rows == 1
    assert (tmp_path / "quarantine" / "wal.0.jsonl").read_bytes() == b'{"tick"\n'
    again.seal_now()
    assert _ticks(again) == [0, 2]


def test_a_damaged_file_whose_copy_cannot_be_kept_still_gives_back_its_intact_rows(
        tmp_path, caplog):
    """Rows are held before anything is set aside: a damaged file that cannot be copied to
    quarantine/ (a full disk, here a file in its place) stays where it is, its intact
    batches are pending now, and sealing them loses and repeats nothing."""
    store = RecordStore(tmp_path, FIELDS, StorePolicy())
    for tick in range(5):
        store.append_table(_records(tick), tick)
        assert store.flush_wal()
    wal = tmp_path / "wal.0.arrows"
    data = bytearray(wal.read_bytes())
    at = data.find(np.arange(20, 22, dtype=np.uint64).tobytes())  # tick 2's record_seq
    data[at] ^= 0xFF
    wal.write_bytes(bytes(data))
    (tmp_path / "quarantine").write_text("in the way\n")
    with caplog.at_level(logging.ERROR):
        again = RecordStore(tmp_path, FIELDS, StorePolicy())
    assert again.pending == 40 and again.replay_lost == 10
    assert "not kept in quarantine" in caplog.text and "10 records lost" in caplog.text
    again.append_table(_records(5), 5)
    again.seal_now()
    assert wal.exists(), "left in place: the next start tries the copy again"
    (tmp_path / "quarantine").unlink()
    third = RecordStore(tmp_path, FIELDS, StorePolicy())
    assert third.pending == 0 and third.replay_lost == 0, "sealed, and counted once"
    assert (tmp_path / "quarantine" / "wal.0.arrows").read_bytes() == bytes(data)
    seqs = third.read_all().column("record_seq").to_pylist()
    assert seqs == [s for s in range(60) if not 20 <= s < 30]


def test_a_flush_with_nothing_queued_creates_no_file(tmp_path):
    for store in (PortionStore(tmp_path / "lines", SCHEMA, "tick", StorePolicy()),
                  RecordStore(tmp_path / "frames", FIELDS, StorePolicy())):
        assert store.flush_wal() and store.wal.paths == []
        assert not list(store.directory.glob("wal.*"))
