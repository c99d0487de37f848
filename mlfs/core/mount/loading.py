"""Run-time loading (the modprobe model): the root `load` grammar and what is remembered.

`load <backend> [key=value ...]` on MOUNT/control is a `[[subsystem]]` table
written on one line: each value is one TOML value without spaces (a bare word
that is not TOML is taken as a string), so what an operator types and what the
configuration file holds are checked by the same backend code.  This module
only parses; whether the backend exists and the settings fit is the backend's
`check` (through `mlfs.backends.check_entry`), run before anything changes.

Loaded subsystems are remembered in STATE/loaded.json (written durably, the
whole file replaced), so they come back at the next mount and after a crash.
A damaged file is set aside with a log line and counts as empty: a remembered
load must never block the mount.

`Loader` does the loading and unloading, and builds the remembered loads at
mount time with the same checks (`build_remembered`): one place decides what a
subsystem from a load is, whenever it is built.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

import trio

from mlfs.abi import ACTION_SETTINGS, Subsystem
from mlfs.base.durable import set_aside, write_durably
from mlfs.base.errors import Refused, invalid
from mlfs.base.statedir import LOADED_FILE, subsystem_name_problem

from .exchange import Exchange
from .runtime import LOADED, SubsystemRuntime

log = logging.getLogger("mlfs.loading")

#: how long unload waits for a blocking step in flight (seconds, or two ticks)
UNLOAD_STEP_WAIT = 10.0
#: seconds a load's backend check and constructor may take before the writer gets
#: ETIMEDOUT (the kill switch on the same file must answer within LOAD_SECONDS + 1)
LOAD_SECONDS = 2.0
#: abandoned loads still stuck in their backends before further loads get EAGAIN
MAX_ABANDONED_BUILDS = 8

#: a setting's key, as TOML bare keys are written in the configuration
_KEY = re.compile(r"[a-z_][a-z0-9_]{0,63}")
#: a backend's name (entry-point names: dotted words)
_BACKEND = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
#: a bare word taken as a string when it is not a TOML value (`name=sim2`)
_BARE = re.compile(r"[A-Za-z0-9_.:/+-]{1,256}")
#: bounds on one command: an operator's line, not a data upload
MAX_SETTINGS = 32
#: how deep a setting's TOML value may nest arrays and tables (no setting needs more than 2)
MAX_NESTING = 8
FILE_VERSION = 1


@dataclass(frozen=True)
class Load:
    """`load <backend> key=value ...`: a [[subsystem]] table."""

    entry: dict


@dataclass(frozen=True)
class Unload:
    name: str


def _nesting(text: str) -> int:
    """How deep `[` and `{` nest in `text` (brackets in strings count too: an upper bound)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_value(key: str, text: str) -> object:
    """One setting's value: a TOML value, else a bare word string; EINVAL otherwise.

    Nesting is bounded before tomllib sees the text: tomllib recurses per level,
    and ~700 levels in a 4 KiB command raised RecursionError (EIO, no `errors`
    line) instead of a refusal.
    """
    if _nesting(text) > MAX_NESTING:
        raise invalid(f"{key}: arrays or tables nested deeper than {MAX_NESTING} levels")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if _BARE.fullmatch(text):
            return text
        raise invalid(f"{key}: {text[:64]!r} is neither a TOML value (written without "
                      "spaces) nor a bare word") from None


def parse_command(words: list[str]) -> Load | Unload:
    """`load`/`unload` words (split on spaces) to a command; EINVAL naming the fault."""
    verb, args = words[0], words[1:]
    if verb == "unload":
        if len(args) != 1:
            raise invalid("unload takes one subsystem name: unload <name>")
        return Unload(args[0])
    if not args:
        raise invalid("load takes a backend: load <backend> [name=<name>] [key=value ...]")
    backend, settings = args[0], args[1:]
    if "=" in backend or not _BACKEND.fullmatch(backend):
        raise invalid(f"{backend[:64]!r} is not a backend name "
                      "(load <backend> [key=value ...])")
    if len(settings) > MAX_SETTINGS:
        raise invalid(f"{len(settings)} settings (at most {MAX_SETTINGS})")
    entry: dict = {"backend": backend}
    for token in settings:
        key, eq, text = token.partition("=")
        if not eq or not _KEY.fullmatch(key) or not text:
            raise invalid(f"{token[:64]!r} is not key=value (a TOML value without spaces)")
        if key in entry:
            raise invalid(f"{key} given twice" if key != "backend"
                          else "backend is the word after load, not a setting")
        entry[key] = parse_value(key, text)
    return Load(entry)


@dataclass(frozen=True)
class Remembered:
    """One subsystem loaded at run time: its name and its [[subsystem]] table."""

    name: str
    entry: dict


#: the most loads remembered and the largest record read (mount.max_subsystems is at most
#: 4096; each entry is a load command's settings, a few hundred bytes)
MAX_REMEMBERED = 4096
MAX_REMEMBERED_BYTES = 4 << 20


def read_remembered(state_dir: Path) -> list[Remembered]:
    """STATE/loaded.json's loads, in load order; a damaged file is set aside (empty)."""
    path = Path(state_dir) / LOADED_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("%s unreadable (%s): no remembered subsystem loaded", path, exc)
        return []
    try:
        if len(text) > MAX_REMEMBERED_BYTES:
            raise ValueError(f"{len(text)} bytes, over {MAX_REMEMBERED_BYTES}")
        data = json.loads(text)
        items = data["loaded"]
        if not isinstance(items, list) or len(items) > MAX_REMEMBERED:
            raise ValueError(f"loaded is not a list of at most {MAX_REMEMBERED} entries")
        out = [Remembered(str(item["name"]), dict(item["entry"])) for item in items]
        if any("backend" not in r.entry for r in out):
            raise ValueError("an entry without a backend")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        log.error("%s is damaged (%s); set aside, no remembered subsystem loaded", path, exc)
        set_aside(path, f"damaged: {exc}")
        return []
    return out


def write_remembered(state_dir: Path, loads: list[Remembered]) -> None:
    """Replace STATE/loaded.json durably (OSError when it cannot be written)."""
    data = {"version": FILE_VERSION,
            "loaded": [{"name": r.name, "entry": r.entry} for r in loads]}
    write_durably(Path(state_dir) / LOADED_FILE,
                  (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())



class Loader:
    """Loads and unloads subsystems of one exchange (the modprobe model), one at a time.

    Apart from the operator's emergency switch: a backend's slow (or hung)
    constructor never delays `echo emergency > MOUNT/control`.
    """

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        #: the backend registry (`mlfs.backends`); None serves no run-time load
        self.backends = exchange.backends
        self.state_dir = exchange.state_dir
        self.lock = trio.Lock()
        #: loads whose backend did not answer within LOAD_SECONDS: still stuck, and ever
        self.builds_running = 0
        self.builds_abandoned = 0
        #: loads waiting for their backend right now (each for at most LOAD_SECONDS)
        self.loads_waiting = 0

    def build_remembered(self, configured: set[str]) -> tuple[list[Subsystem], list[str]]:
        """The subsystems loaded at run time before (STATE/loaded.json), built again.

        The configuration wins a name clash (the remembered load is skipped).  A
        remembered load that cannot be built (its backend uninstalled, a device
        gone) never blocks the mount: it is reported (log, MOUNT/errors), kept
        for a later mount, and the ledger's originals of every knob no live
        subsystem owns are put back.
        """
        backends = self.backends
        built: list[Subsystem] = []
        problems: list[str] = []
        orphaned = False
        for item in read_remembered(self.state_dir):
            reserved = subsystem_name_problem(item.name)
            if reserved:  # remembered by an mlfs that did not reserve it yet
                problems.append(f"remembered load of {item.name!r} skipped: {reserved}")
                log.error("%s", problems[-1])
                continue
            if item.name in configured or any(s.name == item.name for s in built):
                problems.append(f"remembered load of {item.name!r} skipped: the "
                                "configuration serves that name")
                log.warning("%s", problems[-1])
                continue
            try:
                subsystems = backends.create_subsystems([item.entry], self.state_dir)
                if [s.name for s in subsystems] != [item.name]:
                    for subsystem in subsystems:
                        subsystem.close()
                    raise backends.SettingError("name", f"the settings now make "
                                                f"{[s.name for s in subsystems]}")
            except Exception as exc:  # a plugin's constructor: anything may happen
                orphaned = True
                problems.append(f"remembered load of {item.name!r} (backend "
                                f"{item.entry.get('backend')!r}) not served: {exc}")
                log.error("%s", problems[-1])
                continue
            log.info("%s: loaded again (remembered in %s)", item.name, LOADED_FILE)
            built.extend(subsystems)
        if orphaned:
            try:
                backends.restore_orphans(self.state_dir)
            except OSError as exc:
                log.error("ledger: originals not restored: %s", exc)
        return built, problems

    async def load_by_name(self, name: str, uid: int) -> SubsystemRuntime:
        """`mkdir MOUNT/<name>`: load the backend that derives everything from the name."""
        if self.backends is None:
            raise Refused(errno.EPERM, "run-time loading is not available on this mount")
        problem = subsystem_name_problem(name)
        if problem:
            raise invalid(problem)
        try:
            entry = await trio.to_thread.run_sync(self.backends.entry_for_name, name)
        except self.backends.SettingError as exc:
            raise invalid(str(exc)) from None
        if entry is None:
            raise Refused(errno.EPERM, f"no backend serves {name!r} from its name "
                          "alone (`load <backend> key=value ...` on MOUNT/control)")
        async with self.lock:
            return await self.load(entry, uid)

    async def load(self, entry: dict, uid: int) -> SubsystemRuntime:
        """Check a [[subsystem]] table whole, build it off-thread, serve it.

        Nothing changes until every check passed: backend known (and root's
        alone for a `Backend.root_only` backend), settings known and well typed, exactly
        one subsystem with a valid, free name.  The backend's constructor may
        touch the kernel (the ledger of originals, reading sysfs), so it runs
        in a worker thread.  The load is remembered durably before it is
        served; if it cannot be, the subsystem is closed again (its knobs
        restored) and the writer gets the errno.
        """
        backends = self.backends
        if backends is None or not self.exchange.serving:
            raise Refused(errno.EAGAIN, "run-time loading is not available on this mount")
        if self.builds_running >= MAX_ABANDONED_BUILDS:
            raise Refused(errno.EAGAIN, f"{self.builds_running} abandoned loads are still "
                          "stuck in their backends; no more until they end")
        backend = entry["backend"]
        if any(key in ACTION_SETTINGS for key in entry):
            raise Refused(errno.EPERM, "an action command comes from root's configuration "
                          "file only, never from a load")
        try:
            if await self._bounded(backends.root_only, backend) and uid != 0:
                raise Refused(errno.EPERM, f"backend {backend!r} writes the files its "
                              "settings name: only root may load it")
            if uid != 0 and backends.writes_kernel(entry):
                raise Refused(errno.EPERM, "these settings let the subsystem write kernel "
                              "settings or start root's programs (apply, knobs, "
                              "tracepoints): only root may load them")
            names = await self._bounded(backends.check_entry, entry)
        except backends.SettingError as exc:
            raise invalid(str(exc)) from None
        if len(names) != 1:
            raise invalid(f"load makes one subsystem at a time; these settings make "
                          f"{len(names)} ({', '.join(names[:8]) or 'none'})")
        name = names[0]
        self._check_free(name)
        try:
            built = await self._bounded(backends.create_subsystems, [entry], self.state_dir,
                                        close=lambda subs: [s.close() for s in subs])
        except backends.SettingError as exc:
            raise invalid(str(exc)) from None
        except Refused:
            raise  # ETIMEDOUT from _bounded: said as it is
        except OSError as exc:
            raise Refused(exc.errno or errno.EIO,
                          f"{name}: not built: {exc.strerror or exc}") from None
        except Exception as exc:  # a plugin's constructor: anything may happen
            log.exception("%s: backend %s failed to build it", name, backend)
            raise invalid(f"{name}: backend {backend!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
        subsystem = built[0]
        try:
            if subsystem.name != name:
                raise invalid(f"backend {backend!r} built {subsystem.name!r}, not {name!r}")
            remembered = read_remembered(self.state_dir)
            remembered = [r for r in remembered if r.name != name]
            remembered.append(Remembered(name, dict(entry)))
            try:
                await trio.to_thread.run_sync(write_remembered, self.state_dir, remembered)
            except OSError as exc:
                raise Refused(exc.errno or errno.EIO, f"{name}: not loaded: it cannot be "
                              f"remembered ({exc.strerror or exc} in the state directory)"
                              ) from None
            self._check_free(subsystem.name)
            runtime = self.exchange.serve(subsystem, LOADED)
            await trio.to_thread.run_sync(runtime.keep_info)
        except BaseException:
            await trio.to_thread.run_sync(subsystem.close)  # its knobs restored
            raise
        log.warning("%s: loaded (backend %s, %s)", name, backend,
                    " ".join(f"{k}={v!r}" for k, v in entry.items() if k != "backend"))
        return runtime

    async def _bounded(self, function, *args, close=None):
        """`function(*args)` in a worker thread, answered within LOAD_SECONDS whatever it does.

        A backend's check or constructor may block for good (a declared file that
        never answers, /proc/kmsg): the kernel serialises writes to one file, so a load
        stuck in MOUNT/control would also hold `echo emergency > MOUNT/control`.  Past
        the deadline the writer gets ETIMEDOUT, nothing is served, and the thread is
        abandoned and counted (`builds_running`); when it ends after all, `close`
        undoes what it built (its knobs restored).
        """
        state = {"done": False, "abandoned": False, "result": None}
        lock = threading.Lock()

        def run():
            result = function(*args)
            with lock:
                state["done"], state["result"] = True, result
                if not state["abandoned"]:
                    return result
            self.builds_running -= 1  # it ended after all: undo what it built
            if close is not None and result:
                close(result)
            return None

        self.loads_waiting += 1
        try:
            with trio.move_on_after(LOAD_SECONDS) as scope:
                return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        finally:
            self.loads_waiting -= 1
        with lock:
            state["abandoned"] = True
            finished = state["done"]
        if finished and close is not None and state["result"]:  # just in time: undo it
            await trio.to_thread.run_sync(close, state["result"])
        elif not finished:
            self.builds_running += 1
            self.builds_abandoned += 1
        assert scope.cancelled_caught
        raise Refused(errno.ETIMEDOUT, f"the backend did not answer within {LOAD_SECONDS:g} s "
                      "(a declared file that blocks?); nothing was loaded")

    def _check_free(self, name: str) -> None:
        problem = subsystem_name_problem(name)
        if problem:
            raise invalid(problem)
        if name in self.exchange.runtimes:
            raise Refused(errno.EEXIST, f"subsystem {name!r} is served already "
                          f"({self.exchange.runtimes[name].source})")
        limit = self.exchange.config.mount.max_subsystems
        served = len(self.exchange.runtimes)
        if served >= limit:
            raise Refused(errno.ENOSPC, f"the mount serves {served} subsystems "
                          f"(mount.max_subsystems = {limit})")

    async def may_unload(self, runtime: SubsystemRuntime, uid: int) -> None:
        """EPERM unless `uid` holds the right that serving `runtime` needed (rights are
        symmetric: red team A3/A4 had the group unload root's `linux.kmsg`).

        A subsystem from root's configuration file is root's to unload.  One loaded at
        run time needs what its load needed: root for a `Backend.root_only` backend or settings
        that write kernel settings; a load whose settings are no longer on record
        counts as root's.
        """
        if uid == 0:
            return
        if runtime.source != LOADED:
            raise Refused(errno.EPERM, f"{runtime.name} comes from root's configuration "
                          "file: only root unloads it")
        entry = next((r.entry for r in read_remembered(self.state_dir)
                      if r.name == runtime.name), None)
        backends = self.backends
        if entry is None or backends is None:
            raise Refused(errno.EPERM, f"{runtime.name}: its load is not on record: only "
                          "root unloads it")
        try:
            needs_root = (await self._bounded(backends.root_only, entry["backend"])
                          or await self._bounded(backends.writes_kernel, entry))
        except Exception as exc:  # the backend gone or broken: the safe answer
            log.warning("%s: rights of its backend unknown (%s): root's", runtime.name, exc)
            needs_root = True
        if needs_root:
            raise Refused(errno.EPERM, f"{runtime.name}: only root may load it, so only "
                          "root unloads it")

    async def unload(self, name: str, uid: int) -> None:
        """Stop its ticks, its models, seal, restore its knobs, then let it go.

        Its tick loop ends first (a blocking step in flight finishes; one that
        does not return within UNLOAD_STEP_WAIT refuses the unload with EBUSY
        and ticks resume once it returns), then the remembered load is
        forgotten: if that cannot be written, ticks resume and the unload is
        refused with its errno.  From there on nothing can fail.  A configured
        subsystem is only gone until the next mount.  Its directory stays
        visible until its knobs are restored; its portions stay.

        What belonged to this instance dies with it: its models are stopped and lose
        their pins (a `recommendation` or `emergency` pin root wrote), and a configured
        action goes (`Exchange.forget`), so a subsystem loaded later under the same name,
        by anyone, starts from nothing root granted the old one.
        """
        runtime = self.exchange.runtimes.get(name)
        if runtime is None:
            raise Refused(errno.ENOENT, f"no subsystem {name!r}")
        await self.may_unload(runtime, uid)
        if runtime.unloading:
            raise Refused(errno.EBUSY, f"{name}: its backend's step has not returned yet")
        wait = max(UNLOAD_STEP_WAIT, 2 * runtime.subsystem.tick_seconds)
        if not await self.exchange.stop_ticks(runtime, wait):
            self.exchange.resume_ticks(runtime)
            raise Refused(errno.EBUSY, f"{name}: not unloaded: its backend's step has not "
                          f"returned for {wait:g} s (ticks resume once it does)")
        remembered = read_remembered(self.state_dir)
        if any(r.name == name for r in remembered):
            try:
                await trio.to_thread.run_sync(
                    write_remembered, self.state_dir, [r for r in remembered if r.name != name])
            except OSError as exc:
                self.exchange.resume_ticks(runtime)
                raise Refused(exc.errno or errno.EIO, f"{name}: not unloaded: the record "
                              f"cannot be updated ({exc.strerror or exc})") from None
        for proxy in list(runtime.models.values()):
            try:
                proxy.stop()
                if proxy.pinned is not None:  # a pin is the instance's, never the name's
                    proxy.set_mode(b"auto\n", 0)
            except Exception:
                log.exception("%s/%s: stop at unload failed", name, proxy.name)
        await self.exchange.sealer.drain(runtime.stores())
        for proxy in runtime.models.values():
            proxy.journal.close()
            proxy.feedback.close()
        runtime.dataset.close()
        try:
            await trio.to_thread.run_sync(runtime.subsystem.close)  # restores its knobs
        except Exception:
            log.exception("%s: close at unload failed", name)
        self.exchange.forget(runtime)
        log.warning("%s: unloaded (it came from %s)", name, runtime.source)
