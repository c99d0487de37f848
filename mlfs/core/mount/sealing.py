"""Sealing: pending rows become Parquet portions, off the trio thread, one seal per store.

A seal takes a store's batch on the trio thread (cheap), encodes and writes it
in a worker thread, and commits it on the trio thread again, so no store is
ever touched by two threads.  One seal per store is in flight at a time; who
must wait for it (`prepare_dataset`, an unload, the shutdown) waits on the
seal's own `trio.Event`, never by polling.  Each new portion is announced by an
event named after the store's owner (`PortionStore.owner`).

The seal loop visits only the stores in a subsystem's `StoreWatch.dirty` set,
every SEAL_INTERVAL, so idle models cost nothing here.  Nothing in it may end
the loop: a store error is recorded on the store (critical state, retried),
anything else is logged and the loop goes on.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

import trio

from mlfs.base.errors import Refused
from mlfs.base.portion import Portion
from mlfs.core.storage.store import PortionStore

from .events import EventBus
from .runtime import SubsystemRuntime

log = logging.getLogger("mlfs.sealing")

#: seconds between two passes of the seal loop (queued WAL lines wait at most this)
SEAL_INTERVAL = 0.05
#: the longest `prepare_dataset` waits for a first row when nothing is pending
PREPARE_WAIT = 30.0


class Sealer:
    """Every seal of a mount's stores goes through here (the one seal in flight per store)."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        #: stores with a seal in flight, and the event set when it has landed
        self._in_flight: dict[PortionStore, trio.Event] = {}

    async def _landed(self, store: PortionStore) -> None:
        """Wait until no seal of `store` is in flight."""
        while (event := self._in_flight.get(store)) is not None:
            await event.wait()

    async def seal(self, store: PortionStore) -> Portion | None:
        """Seal pending rows (or the oldest failed batch) of one store into a portion."""
        await self._landed(store)
        batch = store.take_batch()
        if batch is None:
            return None
        landed = self._in_flight[store] = trio.Event()
        try:
            return await self._write(store, batch)
        finally:
            del self._in_flight[store]
            landed.set()

    async def _write(self, store: PortionStore, batch) -> Portion | None:
        try:
            portion = await trio.to_thread.run_sync(store.write_batch, batch)
            if store.closed:
                # its model was removed (rmdir) meanwhile, perhaps re-created under
                # the same name: the file must not turn up in the new model's dir
                if portion is not None:
                    portion.path.unlink(missing_ok=True)
                store.sealing -= 1
                return None
        except Exception as exc:
            if store.closed:
                store.sealing -= 1
                return None  # its model was removed (rmdir) while it was written
            if not isinstance(exc, OSError):
                log.exception("sealing %s failed; the batch is kept and retried",
                              store.directory)
            store.abort(batch, exc)  # kept in memory and in its WAL, retried first
            return None
        store.commit(portion, batch)
        if portion is not None:
            self._announce(store, portion)
        return portion

    def _announce(self, store: PortionStore, portion: Portion) -> None:
        owner = store.owner
        if owner is None:  # the recommendation journal: no event
            return
        model = {"model": owner.model} if owner.model is not None else {}
        self.bus.publish(owner.subsystem, owner.event, **model,
                         path=f"{owner.where}/{portion.name}", rows=portion.rows)

    async def drain(self, stores: Iterable[PortionStore]) -> None:
        """Seal everything the stores hold, failed batches first (unload, shutdown).

        A store whose disk refuses keeps what it could not write (in memory and
        in its write-ahead file): replayed at the next start, never lost.
        """
        for store in list(stores):
            await self._landed(store)
            try:
                store.flush_wal()
            except Exception:
                log.exception("%s: write-ahead flush", store.directory)
            while store.due(math.inf) and store.error is None:
                before = store.waiting
                await self.seal(store)
                if store.waiting >= before:
                    break

    async def prepare_dataset(self, runtime: SubsystemRuntime) -> None:
        """Seal the dataset now (with nothing pending, after the next tick's row).

        Failed batches are retried first, in order, then one seal of what is
        pending; a record source's records are sealed with it.  A store that
        cannot be written refuses with its errno.
        """
        store = runtime.dataset
        if store.pending == 0:  # a slow tick (hourly) is not waited for: PREPARE_WAIT at most
            wait = min(PREPARE_WAIT, max(5.0, 20 * runtime.subsystem.tick_seconds))
            with trio.move_on_after(wait):
                await runtime.next_row()
        for store, what in ((runtime.dataset, "dataset"), (runtime.records, "records")):
            if store is None:
                continue
            await self._landed(store)
            while not store.closed and (store.pending or store.retrying):
                retrying = store.retrying
                await self.seal(store)
                if store.error is not None or not retrying:
                    break
            if store.error is not None:
                code, name = store.error
                raise Refused(code, f"{what} not sealed: {name} in the state directory")

    async def run(self, runtimes: Callable[[], Iterable[SubsystemRuntime]]) -> None:
        """The seal loop: write queued WAL lines and seal due stores, for ever."""
        while True:
            now = time.monotonic()
            for runtime in list(runtimes()):
                if runtime.unloading:  # unload seals it itself
                    continue
                for store in list(runtime.watch.dirty):
                    try:
                        store.flush_wal()
                        if store not in self._in_flight and store.due(now):
                            await self.seal(store)
                        store.settle()
                    except Exception:
                        log.exception("%s: seal loop", store.directory)
            await trio.sleep(SEAL_INTERVAL)
