"""Every write into the mount enters the core here: one door, one way in.

The filesystem layer (`mlfs/fs/`) only translates: a write to a file becomes
one call below, and a `Refused` becomes the writer's errno.  Whatever a write
changes is changed behind this door, by the object that owns it: a
recommendation by its model's proxy (journal, then fsync, before the write
returns), a policy by the proxy after verification off the trio thread, a
subsystem's load or unload by the loader, the operator's emergency pin here.
Each refusal is recorded where it shows (the model's or the mount's `errors`,
a counter, a log line) before the writer hears of it.

A recommendation's path, one way:
`fs.operations.write` -> `Control.recommend` -> `ModelProxy.recommend` (checked,
journaled) -> `ModelProxy.sync_journal` (fdatasync, a worker thread) -> on the
next tick `SubsystemRuntime.plan` -> `ModelProxy.decide` -> `Subsystem.step`.
"""

from __future__ import annotations

import errno
import logging

import trio

from mlfs.base.clock import rfc3339
from mlfs.base.durable import fsync_dir, write_durably
from mlfs.base.errors import Refused, error_line, invalid
from mlfs.base.portion import Portion, errno_name
from mlfs.base.statedir import EMERGENCY_PIN_FILE
from mlfs.base.text import decode_text, escape_input, one_word
from mlfs.core.models.modes import OPERATOR_PIN, OPERATOR_RELEASE
from mlfs.core.models.proxy import ModelProxy

from .exchange import Exchange
from .loading import Load, Loader, parse_command
from .runtime import SubsystemRuntime

log = logging.getLogger("mlfs.control")

ROOT_COMMANDS = "load, unload, emergency, auto"


def _remove_durably(path) -> None:
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


class Control:
    """The writes of one mount: subsystem, model and root files, mkdir and rmdir."""

    def __init__(self, exchange: Exchange, loader: Loader | None = None) -> None:
        self.exchange = exchange
        self.mount = exchange.mount
        self.loader = loader if loader is not None else Loader(exchange)
        #: one operator switch at a time (apart from loads: a hung backend never delays it)
        self._switch_lock = trio.Lock()

    # ---- a subsystem's files -----------------------------------------------------
    async def subsystem_control(self, runtime: SubsystemRuntime, data: bytes) -> None:
        """`<subsystem>/control`: prepare_dataset, discard_dataset."""
        try:
            command = one_word(data, "control")
            if command not in ("prepare_dataset", "discard_dataset"):
                raise invalid(f"unknown command {command!r} (prepare_dataset, discard_dataset)")
            await self._dataset_command(runtime, command)
        except Refused as exc:
            self.mount.count_error(runtime.name, "control")
            log.warning("%s/control refused: %s", runtime.name, exc.reason)
            raise

    async def _dataset_command(self, runtime: SubsystemRuntime, command: str
                               ) -> list[Portion]:
        if command == "prepare_dataset":
            await self.exchange.sealer.prepare_dataset(runtime)
            return []
        return runtime.dataset.discard()

    def write_objective(self, runtime: SubsystemRuntime, data: bytes) -> None:
        runtime.write_objective(data)

    def create_model(self, runtime: SubsystemRuntime, name: str) -> ModelProxy:
        return runtime.create_model(name)

    def destroy_model(self, runtime: SubsystemRuntime, name: str) -> ModelProxy:
        return runtime.destroy_model(name)

    # ---- a model's files -----------------------------------------------------------
    async def model_control(self, proxy: ModelProxy, data: bytes) -> None:
        """A model's control file: its lifecycle plus the dataset commands."""
        try:
            command = one_word(data, "control")
            if command == "start":
                proxy.start()
            elif command == "stop":
                proxy.stop()
            elif command in ("prepare_dataset", "discard_dataset"):
                await self._dataset_command(proxy.runtime, command)
            else:
                raise invalid(f"unknown command {command!r} "
                              "(start, stop, prepare_dataset, discard_dataset)")
        except Refused as exc:
            raise proxy.refuse("control", data, exc) from None

    def set_mode(self, proxy: ModelProxy, data: bytes, uid: int) -> None:
        proxy.set_mode(data, uid)

    def set_knobs(self, proxy: ModelProxy, data: bytes) -> None:
        proxy.set_knobs(data)

    def set_kind(self, proxy: ModelProxy, data: bytes) -> None:
        proxy.runtime.change_kind(proxy, data)

    async def recommend(self, proxy: ModelProxy, data: bytes) -> None:
        """Accept, then make the journal durable before the write returns.

        The journal line is written on the trio thread (a failure refuses the
        write with its errno, nothing changed); the fdatasync runs in a worker
        thread on a descriptor of its own, so a slow disk stalls only this
        writer, not every request of the mount (concurrent writers' syncs
        overlap: a natural group commit).  A failed fdatasync withdraws the
        recommendation and the writer gets the errno.
        """
        ids = proxy.recommend(data)  # Refused(ENOSPC/EIO/...) when the WAL write failed
        wal = proxy.journal_wal  # taken before any await: a seal may rotate it
        try:
            await trio.to_thread.run_sync(proxy.sync_journal, wal)
        except OSError as exc:  # written but not durable: withdrawn, the writer is told
            reason = f"journal not durable: {errno_name(exc)}"
            log.error("%s/%s: recommend failed (%s)", proxy.runtime.name, proxy.name, reason)
            proxy.withdraw(ids, reason)
            raise Refused(exc.errno or errno.EIO, reason) from None

    async def upload_policy(self, proxy: ModelProxy, data: bytes) -> None:
        """Verify, check out of process and load off the trio thread, then install.

        The check takes seconds; the model may be removed meanwhile (and a new
        one made under its name): `set_policy` refuses a destroyed proxy, so the
        upload never lands in the new model's directory.
        """
        try:
            loaded = None
            if data:
                loaded = await trio.to_thread.run_sync(proxy.check_policy, data)
            proxy.set_policy(data, loaded)
        except Refused as exc:
            raise proxy.refuse("policy", data[:200], exc) from None
        except OSError as exc:  # a full disk (policy.txt), no process for the check
            raise proxy.refuse("policy", data[:200], Refused(
                exc.errno or errno.EIO, f"policy not installed: {exc.strerror or exc}")) from None
        except Exception as exc:
            raise proxy.refuse("policy", data[:200], Refused(errno.EINVAL, str(exc))) from None

    # ---- the root: the operator's switches, loading ----------------------------------
    async def root_control(self, data: bytes, uid: int = 0) -> None:
        """`MOUNT/control`: load/unload subsystems; `emergency`/`auto` for every model.

        A refused command changes nothing and leaves a line in the root
        `errors`, a counter and a log line, as a model's refusals do.  One
        command at a time: the record on disk follows the order of the writes.
        `uid` is the writer's (taken when it opened the file).
        """
        try:
            words = decode_text(data).split()
            if words and words[0] in ("load", "unload"):
                command = parse_command(words)
                async with self.loader.lock:
                    if isinstance(command, Load):
                        await self.loader.load(command.entry, uid)
                    else:
                        await self.loader.unload(command.name, uid)
                return
            if len(words) != 1 or words[0] not in ("emergency", "auto"):
                shown = " ".join(words) or "(nothing)"
                raise invalid(f"unknown command {shown[:64]!r} ({ROOT_COMMANDS})")
            async with self._switch_lock:
                if words[0] == "emergency":
                    await self.pin_emergency(uid)
                else:
                    await self.release_emergency(uid)
        except Refused as exc:
            self.refuse_root("control", exc, escape_input(data))
            raise

    def refuse_root(self, file: str, exc: Refused, shown: str) -> None:
        """A refused root command: a line in MOUNT/errors, a counter, a log line."""
        self.exchange.root_errors.append(error_line(file, exc.reason, shown))
        self.mount.count_error("", file)
        log.warning("%s refused (%s): %s", file, exc.reason, shown)

    async def mkdir_subsystem(self, name: str, uid: int) -> None:
        """`mkdir MOUNT/<name>`: load the backend that derives everything from the name."""
        try:
            await self.loader.load_by_name(name, uid)
        except Refused as exc:
            self.refuse_root("mkdir", exc, escape_input(name.encode()))
            raise

    async def rmdir_subsystem(self, name: str, uid: int) -> None:
        """`rmdir MOUNT/<name>`: unload it (as `unload <name>`, with the same rights)."""
        try:
            async with self.loader.lock:
                await self.loader.unload(name, uid)
        except Refused as exc:
            self.refuse_root("rmdir", exc, escape_input(name.encode()))
            raise

    async def pin_emergency(self, uid: int = 0) -> None:
        """Every model of every subsystem to emergency, now and until released.

        The models switch first, then the pin is recorded durably (in a worker
        thread: a slow disk delays this writer only): an operator who pulled
        the switch does not expect a crash or a restart to release it.  If it
        cannot be recorded (disk full, I/O error) the pin still holds in
        memory, safety first, and the writer gets the errno and a reason.
        """
        if self.mount.emergency_pinned:
            return
        self.mount.emergency_pinned = True
        self.mount.emergency_pinned_by = uid
        log.warning("every model pinned to emergency by the operator (MOUNT/control)")
        self.mount.bus.publish(None, "emergency", model=None, pinned=True, why=OPERATOR_PIN)
        for proxy in self.exchange.all_models():
            proxy.modes.operator_pin()
        record = f"pinned by the operator (uid {uid}) at {rfc3339()}\n".encode()
        try:
            await trio.to_thread.run_sync(write_durably, self.mount.state_dir / EMERGENCY_PIN_FILE,
                                          record)
        except OSError as exc:
            log.error("emergency pin not recorded on disk: %s", exc)
            raise Refused(exc.errno or errno.EIO,
                          f"pinned, but not recorded on disk ({exc.strerror}): "
                          "a restart would release it") from None

    async def release_emergency(self, uid: int = 0) -> None:
        """Every model back to its own pin or to automatic switching.

        Anyone who may write MOUNT/control pulls the switch; releasing a pin root
        pulled is root's.  The record goes first: if it cannot be removed, nothing is
        released (a restart would pin again) and the writer gets the errno.
        """
        if not self.mount.emergency_pinned:
            return
        if uid != 0 and self.mount.emergency_pinned_by == 0:
            raise Refused(errno.EPERM, "the emergency pin was pulled by root: only root "
                          "releases it")
        try:
            await trio.to_thread.run_sync(_remove_durably,
                                          self.mount.state_dir / EMERGENCY_PIN_FILE)
        except OSError as exc:
            raise Refused(exc.errno or errno.EIO,
                          f"still pinned: its record could not be removed ({exc.strerror})"
                          ) from None
        self.mount.emergency_pinned = False
        log.warning("the operator released the emergency pin (MOUNT/control)")
        self.mount.bus.publish(None, "emergency", model=None, pinned=False, why=OPERATOR_RELEASE)
        for proxy in self.exchange.all_models():
            proxy.modes.operator_release(proxy.runtime.critical)
