"""A subsystem whose state dir refuses writes: critical state, bounded memory, resume.

Drives the exchange's own tick and seal steps on the simulated readahead
subsystem; the fault is real (the write-ahead file's name is taken by a
directory, so every open fails with EISDIR, as ENOSPC or EMFILE would).
"""

from __future__ import annotations

import errno

import pytest
import trio
from mlfs.backends.sim_readahead import SimReadahead

from mlfs.base.errors import Refused
from mlfs.config import parse_config
from mlfs.core.mount.exchange import Exchange

CONFIG = """
[modes]
silence_seconds = 600.0
[store]
max_waiting_rows = 50
"""


@pytest.fixture
def exchange(tmp_path):
    ex = Exchange(parse_config(CONFIG, "test"), tmp_path, [SimReadahead(seed=1)])
    yield ex
    ex.close()


def test_a_failing_state_dir_holds_rows_in_bounded_memory_then_resumes(exchange, tmp_path):
    rt = exchange.runtimes["sim.readahead"]
    proxy = rt.create_model("m")
    proxy.start()
    blocker = tmp_path / "sim.readahead" / "dataset" / "wal.0.jsonl"
    blocker.mkdir()

    async def ticks(n: int) -> None:
        for _ in range(n):
            await exchange._one_tick(rt)
            for store in list(rt.watch.dirty):
                store.flush_wal()  # what the seal loop does every 50 ms

    trio.run(ticks, 3)
    assert rt.watch.reason() == "storage: EISDIR writing dataset"
    assert proxy.mode == "emergency" and "EISDIR writing dataset" in rt.critical
    with pytest.raises(Refused) as refused:
        proxy.recommend(b"read_ahead_kb=256\n")
    assert refused.value.errno == errno.EISDIR
    trio.run(ticks, 80)
    assert rt.dataset.pending == 50, "rows wait up to store.max_waiting_rows, no more"
    assert rt.skipped_ticks == 83 - 50
    assert rt.next_tick == 50, "a held tick consumes no tick number"
    with pytest.raises(Refused) as refused:
        trio.run(exchange.sealer.prepare_dataset, rt)
    assert refused.value.errno == errno.EISDIR

    blocker.rmdir()  # the disk works again
    trio.run(exchange.sealer.prepare_dataset, rt)
    assert rt.dataset.read_all().column("tick").to_pylist() == list(range(50))
    assert not rt.watch.failing
    trio.run(ticks, 5)
    assert rt.next_tick == 55 and rt.held is None and rt.critical is None
