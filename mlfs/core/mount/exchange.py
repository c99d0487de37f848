"""The exchange: the hub of one mount, its subsystems' runtimes and their tick loops.

It holds what the whole mount shares (the `MountContext`: event bus, counters,
configuration, the operator's pin; the readers' accounts; the root `errors`)
and runs, in trio, one task per subsystem that ticks on a wall-clock schedule
plus the seal loop.  It decides nothing itself: a tick is the runtime's
(`runtime.py`), a seal the sealer's (`sealing.py`), a load or unload the
loader's (`loading.py`), and every write into the mount enters through
`control.py`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path

import trio

from mlfs.abi import Subsystem
from mlfs.base.errors import error_line
from mlfs.base.portion import errno_name
from mlfs.base.statedir import EMERGENCY_PIN_FILE
from mlfs.core.models.proxy import ERRORS_KEPT, ModelProxy

from .actions import DEFAULT_SPAWNS_PER_MINUTE, ActionRunner
from .context import MountContext
from .readers import ReaderAccounts
from .runtime import CONFIG, SubsystemRuntime
from .sealing import Sealer

log = logging.getLogger("mlfs.exchange")

#: seconds between two reaps of the action commands (at most; each tick offers one)
REAP_EVERY = 0.1


class Exchange:
    """All subsystems of one mount, the event bus and the counters."""

    def __init__(self, config, state_dir: Path, subsystems: list[Subsystem],
                 backends=None, sources: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 actions: dict[str, dict] | None = None) -> None:
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        #: the root `errors` file: the last refused root `control` commands (and the
        #: action commands abandoned because they would not die)
        self.root_errors: collections.deque[str] = collections.deque(maxlen=ERRORS_KEPT)
        #: the mount's one action runner (subsystem -> its action settings, from root's
        #: configuration file only), a mount-wide service: reaped on every tick of every
        #: subsystem, whatever its models do (`_one_tick`)
        runner = ActionRunner(
            actions, spawns_per_minute=getattr(config.mount, "action_spawns_per_minute",
                                               DEFAULT_SPAWNS_PER_MINUTE),
            problem=lambda reason, shown: self.root_errors.append(
                error_line("action", reason, shown)))
        self.mount = MountContext(config, state_dir, runner, clock)
        self.mount.model_count = self.model_count
        #: the backend registry (`mlfs.backends`: check_entry, create_subsystems,
        #: root_only, entry_for_name); None serves no run-time load
        self.backends = backends
        self.readers = ReaderAccounts(config.mount)
        self.started = time.time()
        self.sealer = Sealer(self.mount.bus)
        if self.mount.emergency_pinned:
            log.warning("the operator's emergency pin holds (%s): every model stays in "
                        "emergency until `echo auto > MOUNT/control`", EMERGENCY_PIN_FILE)
        self.runtimes: dict[str, SubsystemRuntime] = {}
        for sub in subsystems:
            self.add([sub], (sources or {}).get(sub.name, CONFIG))
        for name in [n for n in runner.actions if getattr(self.runtimes.get(n), "source",
                                                             None) != CONFIG]:
            runner.drop(name)  # an action is a configured instance's, never a load's
        self._stopping = False
        #: the exchange's nursery once run() started: loaded tick loops start in it
        self._nursery: trio.Nursery | None = None

    # ---- what the mount shares (read by metrics, the tree and tests) -----------
    @property
    def config(self):
        return self.mount.config

    @property
    def state_dir(self) -> Path:
        return self.mount.state_dir

    @property
    def bus(self):
        return self.mount.bus

    @property
    def recommendations(self) -> collections.Counter[str]:
        return self.mount.recommendations

    @property
    def errors(self) -> collections.Counter[tuple[str, str]]:
        return self.mount.errors

    @property
    def emergency_pinned(self) -> bool:
        return self.mount.emergency_pinned

    def model_count(self) -> int:
        return sum(len(runtime.models) for runtime in self.runtimes.values())

    def all_models(self) -> list[ModelProxy]:
        return [proxy for runtime in self.runtimes.values() for proxy in runtime.models.values()]

    def root_errors_text(self) -> str:
        return "".join(line + "\n" for line in self.root_errors)

    # ---- subsystems joining and leaving (the loader's primitives) ----------------
    def add(self, subsystems: list[Subsystem], source: str) -> None:
        """Subsystems served from the start (their tick loops start with run())."""
        for sub in subsystems:
            self.runtimes[sub.name] = SubsystemRuntime(self.mount, sub, source)

    @property
    def serving(self) -> bool:
        """run() has started: a subsystem served now gets its tick loop at once."""
        return self._nursery is not None

    def serve(self, subsystem: Subsystem, source: str) -> SubsystemRuntime:
        """A built subsystem joins the mount: its runtime, its tick loop, its event."""
        runtime = SubsystemRuntime(self.mount, subsystem, source)
        self.runtimes[runtime.name] = runtime
        self._nursery.start_soon(self._tick_loop, runtime)
        self.bus.publish(runtime.name, "subsystem", action="loaded", source=source)
        return runtime

    async def stop_ticks(self, runtime: SubsystemRuntime, wait: float) -> bool:
        """End a subsystem's tick loop; False if a step in flight did not return in `wait` s."""
        runtime.unloading = True
        runtime.loop_scope.cancel()
        with trio.move_on_after(wait):
            await runtime.loop_done.wait()
        return runtime.loop_done.is_set()

    def resume_ticks(self, runtime: SubsystemRuntime) -> None:
        """A refused unload: once its old tick loop ended, the subsystem ticks again."""
        self._nursery.start_soon(self._resume_ticks, runtime)

    async def _resume_ticks(self, runtime: SubsystemRuntime) -> None:
        await runtime.loop_done.wait()
        runtime.loop_scope = trio.CancelScope()
        runtime.loop_done = trio.Event()
        runtime.unloading = False
        log.warning("%s: ticks resume (the unload was refused)", runtime.name)
        await self._tick_loop(runtime)

    def forget(self, runtime: SubsystemRuntime) -> None:
        """An unloaded subsystem leaves the mount (its directory and portions stay).

        What root configured for that instance goes with it: its action command (and
        the commands it still runs).  A subsystem loaded later under the same name is a
        new instance and inherits none of it.
        """
        del self.runtimes[runtime.name]
        if runtime.source == CONFIG:
            self.mount.actions.drop(runtime.name)
        self.bus.publish(runtime.name, "subsystem", action="unloaded", source=runtime.source)
        self.bus.close_subsystem(runtime.name)

    # ---- the loops --------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for runtime in self.runtimes.values():
                nursery.start_soon(self._tick_loop, runtime)
            nursery.start_soon(self.sealer.run, self.runtimes.values)
            task_status.started()

    async def _tick_loop(self, runtime: SubsystemRuntime) -> None:
        try:
            with runtime.loop_scope:
                await self._ticks(runtime)
        finally:
            runtime.loop_done.set()

    async def _ticks(self, runtime: SubsystemRuntime) -> None:
        period = runtime.subsystem.tick_seconds
        deadline = trio.current_time()
        while not self._stopping:
            try:
                await self._one_tick(runtime)
            except Exception:
                runtime.errors += 1
                log.exception("%s: tick failed", runtime.name)
            deadline += period
            now = trio.current_time()
            if deadline < now - period:  # fell behind (suspended?): do not burst
                deadline = now
            await trio.sleep_until(deadline)

    async def _one_tick(self, runtime: SubsystemRuntime) -> None:
        try:  # a mount-wide service: never waits, and never depends on a model's records
            self.mount.actions.reap(every=REAP_EVERY)
        except Exception:
            log.exception("actions: reap failed")
        if runtime.watch.full():
            runtime.hold_ticks("rows waiting in memory reached store.max_waiting_rows"
                               + (f" ({runtime.watch.reason()})" if runtime.watch.failing
                                  else ""))
            return
        try:
            plan = runtime.plan()
        except OSError as exc:  # the tick number could not be reserved: none consumed
            runtime.hold_ticks(f"{errno_name(exc)} reserving tick numbers")
            return
        if runtime.subsystem.blocking:
            sample = await trio.to_thread.run_sync(runtime.subsystem.step, plan.knobs)
        else:
            sample = runtime.subsystem.step(plan.knobs)
        runtime.finish(plan, sample)

    async def seal_all(self) -> None:
        """Shutdown: no more ticks; everything pending becomes portions."""
        self._stopping = True
        for runtime in list(self.runtimes.values()):
            runtime.release_row_waiters()  # a prepare_dataset waiting for a row: no more come
            await self.sealer.drain(runtime.stores())

    def close(self) -> None:
        self.mount.actions.close()
        self.bus.close()
        for runtime in self.runtimes.values():
            try:
                runtime.close()
            except Exception:
                log.exception("%s: close failed", runtime.name)
