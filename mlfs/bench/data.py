"""The big portion: a dataset file with the schema the proxy builds, written before mounting."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .plan import MiB


def dataset_schema():
    """The dataset schema exactly as the proxy builds it for sim.readahead."""
    from mlfs.backends.sim_readahead import SimReadahead
    from mlfs.core.mount.exchange import Exchange

    from ..config import load_config

    with tempfile.TemporaryDirectory(prefix="mlfs-bench-schema-") as scratch:
        exchange = Exchange(load_config(None), Path(scratch), [SimReadahead()])
        try:
            return exchange.runtimes["sim.readahead"].dataset_schema()
        finally:
            exchange.close()


def write_portion(path: Path, target_bytes: int, seed: int = 0) -> int:
    """A portion of random, poorly compressible rows with the dataset schema.

    Numbers are uniform random (zstd cannot shrink them), so the file on disk
    is as big as the data and every byte has to cross FUSE.  Row groups of
    128 Ki rows, as a long-running subsystem's readers would meet after
    compaction.  Written to a tmp name, fsynced, renamed: a complete file
    before its name exists, like the store's own portions.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = dataset_schema()
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    group = 131_072
    tick = 0
    modes = ["learning", "collaboration", "recommendation", "emergency", "default"]
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        while tick == 0 or tmp.stat().st_size < target_bytes:
            ticks = np.arange(tick, tick + group, dtype=np.int64)
            columns = []
            for f in schema:
                if f.name == "ts":
                    values = pa.array(1_700_000_000_000_000 + ticks * 1_000_000, type=f.type)
                elif f.name == "tick":
                    values = pa.array(ticks, type=f.type)
                elif f.name == "controller":
                    values = pa.array(rng.choice(["default", "ml"], group))
                elif f.name == "model":
                    values = pa.array(rng.choice(["lgbm", "bench"], group))
                elif f.name == "mode":
                    values = pa.array(rng.choice(modes, group))
                elif pa.types.is_integer(f.type):
                    values = pa.array(rng.integers(0, 1 << 40, group), type=f.type)
                else:
                    values = pa.array(rng.random(group), type=f.type)
                columns.append(values)
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
            tick += group
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return tick


def same_bytes(a: Path, b: Path, size: int) -> bool:
    """Spot-check that the mount serves the state file's bytes (start, middle, end)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for off in (0, size // 2, max(0, size - MiB)):
            fa.seek(off)
            fb.seek(off)
            if fa.read(MiB) != fb.read(MiB):
                return False
    return True
