"""Dataset portions read by DuckDB, Polars, pandas, pyarrow, cp and mmap (docs/contract.md)."""

from __future__ import annotations

import filecmp
import mmap
import os
import re
import shutil
import signal

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness import Models, Mount, sh, wait_for, write_errno


@pytest.fixture
def quiet_models(quiet_mount):
    made = Models(quiet_mount.sub)
    yield made
    made.cleanup()


def prepare(mount, times: int = 1) -> None:
    for _ in range(times):
        assert write_errno(mount.sub / "control", b"prepare_dataset\n") == 0


def portions(mount) -> list:
    return sorted((mount.sub / "dataset").glob("*.parquet"))


def state_portion(mount, portion):
    return mount.state_dir / "sim.readahead/dataset" / portion.name


def test_duckdb_polars_pandas_and_pyarrow_read_the_same_rows(quiet_mount):
    prepare(quiet_mount, 3)
    dataset = quiet_mount.sub / "dataset"
    names = [p.name for p in portions(quiet_mount)]
    assert len(names) >= 3
    glob = f"{dataset}/*.parquet"
    duck = duckdb.sql(f"SELECT tick, objective, controller FROM '{glob}' ORDER BY tick").df()
    polars_eager = pl.read_parquet(glob).sort("tick")
    polars_lazy = pl.scan_parquet(glob).collect().sort("tick")
    pandas = pd.read_parquet(dataset).sort_values("tick")
    arrow = pq.read_table(dataset).sort_by("tick")
    state = pa.concat_tables(pq.read_table(state_portion(quiet_mount, p))
                             for p in portions(quiet_mount)).sort_by("tick")
    ticks = state.column("tick").to_pylist()
    objective = state.column("objective").to_pylist()
    assert len(ticks) > 0
    assert duck["tick"].tolist() == ticks
    assert duck["objective"].tolist() == objective
    assert polars_eager["tick"].to_list() == ticks
    assert polars_lazy["tick"].to_list() == ticks
    assert polars_lazy["objective"].to_list() == objective
    assert pandas["tick"].tolist() == ticks
    assert arrow.column("tick").to_pylist() == ticks
    assert arrow.column("objective").to_pylist() == objective
    assert polars_eager.columns == state.column_names
    assert [p.name for p in portions(quiet_mount)] == names, "nothing sealed meanwhile"


def test_duckdb_aggregates_over_the_portion_glob(quiet_mount):
    prepare(quiet_mount)
    glob = f"{quiet_mount.sub}/dataset/*.parquet"
    ((count, low, high),) = duckdb.sql(
        f"SELECT count(*), min(tick), max(tick) FROM '{glob}'").fetchall()
    assert count == high - low + 1, "ticks are contiguous without a crash"


def test_polars_memory_maps_a_portion(quiet_mount):
    prepare(quiet_mount)
    last = portions(quiet_mount)[-1]
    frame = pl.read_parquet(last, memory_map=True, use_pyarrow=False)
    assert frame.height == pq.read_metadata(state_portion(quiet_mount, last)).num_rows
    with open(last, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        assert mapped[:4] == b"PAR1" and mapped[-4:] == b"PAR1"
        assert bytes(mapped) == state_portion(quiet_mount, last).read_bytes()


def test_cp_of_a_portion_is_byte_identical_and_stat_size_is_exact(quiet_mount, tmp_path):
    prepare(quiet_mount)
    for portion in portions(quiet_mount):
        stored = state_portion(quiet_mount, portion)
        assert os.stat(portion).st_size == stored.stat().st_size
        done = sh(f"cp {portion} {tmp_path}/copy.parquet")
        assert done.returncode == 0, done.stderr
        assert filecmp.cmp(tmp_path / "copy.parquet", stored, shallow=False)
        listing = sh(f"stat -c %s {portion}").stdout.strip()
        assert int(listing) == stored.stat().st_size


def test_rows_have_the_spec_columns_and_types(quiet_mount):
    prepare(quiet_mount)
    table = pq.read_table(quiet_mount.sub / "dataset")
    schema = table.schema
    import json

    info = json.loads((quiet_mount.sub / "info").read_text())
    expected = ["ts", "tick", "controller", "model", "mode", "knob_read_ahead_kb",
                *info["features"], "objective"]
    assert schema.names == expected
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("tick").type == pa.int64()
    for name in ("controller", "model", "mode"):
        assert schema.field(name).type == pa.string()
    assert schema.field("knob_read_ahead_kb").type == pa.int64()
    for name, kind in info["features"].items():
        assert schema.field(name).type == {"int64": pa.int64(), "float64": pa.float64()}[kind]
    assert schema.field("objective").type == pa.float64()
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", name) for name in schema.names)
    assert set(table.column("controller").to_pylist()) <= {"default", "ml"}


def test_features_shows_the_last_ticks_features_as_that_ticks_dataset_row(quiet_mount):
    """`features`: what a trainer decides a recommendation on, so it must be the state
    the proxy decides a policy's tick on: the newest tick's features, by the dataset's
    column names, equal to that tick's row once it is sealed."""
    import json

    info = json.loads((quiet_mount.sub / "info").read_text())
    sample = json.loads((quiet_mount.sub / "features").read_text())
    assert set(sample["features"]) == set(info["features"])
    prepare(quiet_mount)  # seals every row so far, the sampled tick's among them
    rows = pq.read_table(quiet_mount.sub / "dataset",
                         filters=[("tick", "=", sample["tick"])]).to_pylist()
    assert len(rows) == 1
    assert sample["features"] == {name: rows[0][name] for name in info["features"]}
    wait_for(lambda: json.loads((quiet_mount.sub / "features").read_text())["tick"]
             > sample["tick"], what="features of a newer tick")


def test_ticks_rise_by_one_across_portions_and_ts_follows(quiet_mount):
    prepare(quiet_mount, 2)
    ticks, stamps = [], []
    for portion in portions(quiet_mount):
        table = pq.read_table(portion, columns=["tick", "ts"])
        ticks += table.column("tick").to_pylist()
        stamps += table.column("ts").to_pylist()
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))
    assert stamps == sorted(stamps)


def test_rows_without_a_started_model_are_default_rows(quiet_mount):
    prepare(quiet_mount)
    rows = pq.read_table(portions(quiet_mount)[-1]).to_pylist()
    assert {(r["controller"], r["model"], r["mode"]) for r in rows} == {
        ("default", None, "default")}
    assert {r["knob_read_ahead_kb"] for r in rows} == {128}


def test_ml_rows_are_queryable_by_model_and_controller(quiet_mount, quiet_models):
    model = quiet_models("fbk")
    assert write_errno(model / "mode", b"recommendation\n") == 0
    assert write_errno(model / "recommend", b"read_ahead_kb=512 expect=700\n") == 0
    wait_for(lambda: (model / "state").read_text() == "running\n", what="running")
    # a model's control takes prepare_dataset too (the proposal's command set)
    assert write_errno(model / "control", b"prepare_dataset\n") == 0
    rows = duckdb.sql(
        f"SELECT controller, model, mode, knob_read_ahead_kb FROM "
        f"'{quiet_mount.sub}/dataset/*.parquet' WHERE model = 'fbk' AND controller = 'ml'"
    ).fetchall()
    assert rows and set(rows) == {("ml", "fbk", "recommendation", 512)}


def test_discard_removes_portions_within_a_second_and_numbers_are_never_reused(quiet_mount):
    prepare(quiet_mount, 2)
    before = portions(quiet_mount)
    numbers = [int(p.stem) for p in before]
    inodes = {os.stat(p).st_ino for p in before}
    assert write_errno(quiet_mount.sub / "control", b"discard_dataset\n") == 0
    wait_for(lambda: portions(quiet_mount) == [], timeout=1.5, what="an empty listing")
    wait_for(lambda: not os.path.exists(before[-1]), timeout=1.5, what="stat to fail")
    assert not list((quiet_mount.state_dir / "sim.readahead/dataset").glob("*.parquet"))
    prepare(quiet_mount)
    (fresh,) = portions(quiet_mount)
    assert int(fresh.stem) == max(numbers) + 1
    assert os.stat(fresh).st_ino not in inodes
    assert pq.read_table(fresh).num_rows > 0


RETAIN = """
[mount]
allow_other = true

[store]
seal_seconds = 0.3
retention_count = 3

[[subsystem]]
backend = "sim.readahead"
name = "sim.readahead"
seed = 1
tick_seconds = 0.02
"""


def test_retention_keeps_the_newest_portions_and_removes_the_rest(mount_root):
    m = Mount(mount_root, RETAIN).start()
    try:
        dataset = m.sub / "dataset"
        wait_for(lambda: max((int(p.stem) for p in dataset.glob("*.parquet")), default=0) >= 6,
                 what="six portions sealed")
        listed = sorted(int(p.stem) for p in dataset.glob("*.parquet"))
        assert len(listed) <= 3
        assert listed == list(range(listed[0], listed[0] + len(listed)))
        stored = sorted(int(p.stem) for p in
                        (m.state_dir / "sim.readahead/dataset").glob("*.parquet"))
        assert len(stored) <= 4 and 1 not in stored
        wait_for(lambda: not os.path.exists(dataset / "0000000001.parquet"), timeout=1.5,
                 what="a lookup of the removed portion failing")
    finally:
        m.kill(signal.SIGTERM)


def test_a_portion_copied_out_is_an_ordinary_file(quiet_mount, tmp_path):
    prepare(quiet_mount)
    last = portions(quiet_mount)[-1]
    shutil.copy(last, tmp_path / last.name)
    assert pq.read_table(tmp_path / last.name).equals(pq.read_table(last))


def test_an_open_portion_stays_readable_after_discard(quiet_mount):
    prepare(quiet_mount)
    last = portions(quiet_mount)[-1]
    expected = state_portion(quiet_mount, last).read_bytes()
    with open(last, "rb") as fh:
        head = fh.read(100)
        assert write_errno(quiet_mount.sub / "control", b"discard_dataset\n") == 0
        wait_for(lambda: last.name not in os.listdir(quiet_mount.sub / "dataset"),
                 timeout=1.5, what="the portion unlisted")
        rest = fh.read()
    assert head + rest == expected, "an immutable portion changed under its reader"
