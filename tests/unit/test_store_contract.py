"""The fleet store's contract (mlfs/fleet/store.py), one suite run over every store.

As S3QL's tests/t1_backends.py runs one suite against every backend, each test here
runs against each registered implementation: a directory, `memory://`, a generic
fsspec store (which refuses a conditional write) and S3 against a real moto server
started for the session.  A new store passes this suite, or it is not done.
"""

from __future__ import annotations

import io
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlfs.base.durable import TooLarge, UnsafePath
from mlfs.fleet.store import (
    STORES,
    DirectoryStore,
    FsspecStore,
    MemoryStore,
    S3Store,
    Store,
    StoreUnavailable,
    Unsupported,
    store_class,
)
from tests.moto_s3 import new_bucket

KINDS = ("directory", "memory", "fsspec", "s3")


@pytest.fixture(params=KINDS)
def store(request, tmp_path) -> Store:
    name = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "directory":
        return Store(str(tmp_path / "store"))
    if request.param == "memory":
        return Store(f"memory://{name}/store")
    if request.param == "fsspec":  # any fsspec URL no entry of STORES names
        return FsspecStore(f"memory://{name}/store")
    request.getfixturevalue("s3_endpoint")
    return Store(new_bucket(name) + "/store")


def test_store_url_picks_the_implementation_by_scheme(tmp_path):
    assert type(Store(str(tmp_path))) is DirectoryStore
    assert type(Store(f"file://{tmp_path}")) is DirectoryStore
    assert store_class("s3://bucket/x") is S3Store
    assert type(Store("memory://x")) is MemoryStore
    assert store_class("gcs://bucket/x") is FsspecStore
    assert set(STORES.values()) >= {DirectoryStore, S3Store, MemoryStore}


def test_put_then_get_returns_the_bytes_and_a_second_put_replaces_them(store):
    store.put("a/b/one.json", b"first")
    assert store.get("a/b/one.json") == b"first"
    store.put("a/b/one.json", b"second")
    assert store.get("a/b/one.json") == b"second"
    assert store.exists("a/b/one.json")


def test_a_missing_object_is_file_not_found_and_does_not_exist(store):
    with pytest.raises(FileNotFoundError):
        store.get("nothing/here.json")
    assert not store.exists("nothing/here.json")
    assert store.list("nothing/") == []


def test_list_is_every_key_under_a_prefix_sorted_and_only_that_prefix(store):
    for key in ("p/2.json", "p/1.json", "p/deep/3.json", "pq/4.json", "other.json"):
        store.put(key, b"x")
    assert store.list("p/") == ["p/1.json", "p/2.json", "p/deep/3.json"]
    assert store.list("p") == store.list("p/")
    assert store.list() == ["other.json", "p/1.json", "p/2.json", "p/deep/3.json",
                            "pq/4.json"]


def test_get_refuses_an_object_over_its_bound(store):
    store.put("big.bin", b"x" * 1000)
    with pytest.raises(TooLarge):
        store.get("big.bin", limit=999)
    assert store.get("big.bin", limit=1000) == b"x" * 1000


def test_put_if_absent_writes_once_or_is_refused_where_the_store_cannot(store):
    if not store.conditional:
        with pytest.raises(Unsupported, match="no conditional write"):
            store.put_if_absent("claims/h.json", b"mine")
        assert not store.exists("claims/h.json")
        return
    assert store.put_if_absent("claims/h.json", b"mine") is True
    assert store.put_if_absent("claims/h.json", b"theirs") is False
    assert store.get("claims/h.json") == b"mine"


def test_delete_removes_one_object_and_a_missing_one_is_file_not_found(store):
    store.put("d/x.json", b"x")
    store.put("d/y.json", b"y")
    store.delete("d/x.json")
    assert store.list("d/") == ["d/y.json"]
    with pytest.raises(FileNotFoundError):
        store.delete("d/x.json")


def test_open_gives_a_seekable_file_parquet_reads_by_its_footer(store):
    buffer = io.BytesIO()
    pq.write_table(pa.table({"tick": list(range(100))}), buffer)
    store.put("subsystem=s/host=h/kind=dataset/0000000001.parquet", buffer.getvalue())
    with store.open("subsystem=s/host=h/kind=dataset/0000000001.parquet") as fh:
        assert pq.ParquetFile(fh).metadata.num_rows == 100


@pytest.mark.parametrize("key", ["../escape.json", "/abs.json", "a//b.json", "a/./b",
                                 "a/../../b", ""])
def test_a_key_that_leaves_the_store_is_refused(store, key):
    with pytest.raises(StoreUnavailable) as refused:
        store.put(key, b"x")
    assert isinstance(refused.value.__cause__, UnsafePath)
    with pytest.raises(UnsafePath):
        store.get(key)
    with pytest.raises(UnsafePath):
        store.list(key + "/x/..")
    assert store.list() == []


def test_atomic_says_whether_a_listing_is_the_truth(store):
    assert store.atomic is isinstance(store, DirectoryStore)


def test_hidden_names_a_writer_keeps_while_writing_are_never_listed(tmp_path):
    store = Store(str(tmp_path))
    store.put("m/h.json", b"x")
    (tmp_path / "m" / ".h.json.0123.tmp").write_bytes(b"half")
    assert store.list("m/") == ["m/h.json"]


def test_the_directory_store_root_may_be_a_link_the_operator_chose(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "chosen").symlink_to(tmp_path / "real")
    Store(str(tmp_path / "chosen")).put("a/b.json", b"x")
    assert (tmp_path / "real" / "a" / "b.json").read_bytes() == b"x"


def test_s3_store_is_not_atomic_but_conditional(s3_endpoint):
    store = Store(new_bucket(f"t{uuid.uuid4().hex[:12]}"))
    assert isinstance(store, S3Store) and not store.atomic and store.conditional
    store.put("x.json", b"1")
    assert store.list() == ["x.json"]


