"""Start-up and shutdown of one mount: init, serve, seal, restore, unmount.

Order matters (docs/fuse-notes.md): nothing touches the mountpoint between
`pyfuse3.init()` and `main()`; the readiness pipe is non-inheritable so the
auto_unmount helper does not keep it open; SIGTERM/SIGINT seal open rows and
call `pyfuse3.terminate()`; blocked event readers are woken with end of file.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyfuse3
import trio

import mlfs.backends
from mlfs.abi import split_core_settings
from mlfs.backends import (
    SettingError,
    check_entry,
    create_subsystems,
    describe_backends,
    listing_text,
)
from mlfs.base import statedir
from mlfs.base.errors import error_line
from mlfs.core.mount import metrics
from mlfs.core.mount.control import Control
from mlfs.core.mount.exchange import Exchange
from mlfs.core.mount.loading import Loader
from mlfs.core.mount.runtime import LOADED

from . import __version__, runfile
from .config import Config
from .fs.operations import Operations
from .http import serve_metrics

log = logging.getLogger("mlfs.daemon")


def clean_stale_mount(mountpoint: Path) -> None:
    """A crashed daemon leaves 'Transport endpoint is not connected': clear it."""
    try:
        os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            log.warning("%s: stale mount from a crash; unmounting it", mountpoint)
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        else:
            raise


def is_mounted(mountpoint: Path) -> bool:
    """True when a FUSE filesystem is mounted right on `mountpoint`.

    Only FUSE mounts count: in a container the mountpoint is often itself a
    bind mount, which mlfs mounts over as any FUSE filesystem would.
    """
    target = os.path.realpath(mountpoint)
    fstype = None
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) > 4 and parts[4].encode().decode("unicode_escape") == target:
                    fstype = rest.split()[0] if rest.split() else ""
    except OSError:
        pass
    return fstype is not None and fstype.startswith("fuse")


#: how long a mount left by a killed daemon may take to go: its auto_unmount helper
#: (fusermount3) unmounts it only once it has seen the daemon die
STALE_MOUNT_SECONDS = 3.0


def still_mounted(mountpoint: Path) -> bool:
    """Whether `mountpoint` is mounted after a stale mount was cleared, or one being
    unmounted by a killed daemon's helper had `STALE_MOUNT_SECONDS` to go
    (tests/mount/test_records.py met that helper mid-way, right after a SIGKILL)."""
    deadline = time.monotonic() + STALE_MOUNT_SECONDS
    while True:
        clean_stale_mount(mountpoint)
        if not is_mounted(mountpoint) or time.monotonic() > deadline:
            return is_mounted(mountpoint)
        time.sleep(0.1)


def _group_id(name: str) -> int:
    if not name:
        return 0
    import grp

    return grp.getgrnam(name).gr_gid


def journal_stderr() -> bool:
    """True when stderr is the journal: $JOURNAL_STREAM names its device and inode."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class _JournalFormatter(logging.Formatter):
    """`<priority>name: message`: journald reads the sd-daemon(3) prefix as the level."""

    PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
                logging.DEBUG: 7}

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prefix = f"<{self.PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(prefix + line for line in text.splitlines())


def setup_logging(state_dir: Path, foreground: bool) -> None:
    """Log once: to stderr alone when a systemd service runs us in the foreground
    (stderr is its journal, or wherever StandardError= points), else to
    STATE/mlfs.log (and stderr when in the foreground).  Under systemd a second
    copy in mlfs.log would be unrotated and duplicate what journalctl -u keeps."""
    level = os.environ.get("MLFS_LOG_LEVEL", "INFO")
    if journal_stderr() or (foreground and os.environ.get("INVOCATION_ID")):
        handler = logging.StreamHandler()
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s") if journal_stderr()
                             else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=level, handlers=[handler], force=True)
        return
    handlers: list[logging.Handler] = [logging.FileHandler(state_dir / "mlfs.log")]
    if foreground:
        handlers.append(logging.StreamHandler())
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers, force=True)


#: $NOTIFY_SOCKET, taken out of the environment at start so no child inherits it
_notify_socket: str | None = None


def sd_notify(state: str) -> bool:
    """Tell the service manager `state` (sd_notify(3): READY=1, STOPPING=1, STATUS=...).

    One datagram on the AF_UNIX socket systemd names in $NOTIFY_SOCKET (a path,
    or an abstract name written with a leading @).  With `Type=notify` systemd
    starts dependents (trainers) only after READY=1, so readiness means the
    mount answers, without a poll.  A no-op outside systemd; never fatal.
    """
    address = _notify_socket
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as exc:
        log.warning("sd_notify %r failed: %s", state.split("\n")[0], exc.strerror or exc)
        return False


def configured_actions(entries) -> dict[str, dict]:
    """Subsystem name -> its action settings, from root's configuration file only."""
    actions = {}
    for entry in entries:
        core, _ = split_core_settings(entry)
        if core:
            for name in check_entry(entry):
                actions[name] = core
    return actions


def keep_info(exchange: Exchange) -> None:
    """Every subsystem's info.json (`SubsystemRuntime.keep_info`)."""
    for runtime in exchange.runtimes.values():
        runtime.keep_info()


#: the descriptors the daemon asks for (soft RLIMIT_NOFILE, up to the hard limit)
WANTED_FILES = 65536


def raise_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit; returns the soft limit in force.

    The soft limit is 1,024 under systemd and most shells, while the hard
    limit is far higher (systemd: 524,288): what every file server does.
    Readers are bounded per uid ([mount] handles_per_uid) and portions share
    one descriptor or mapping per portion, so this is headroom for the
    state directory's own files, not a licence for readers.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = WANTED_FILES if hard == resource.RLIM_INFINITY else min(hard, WANTED_FILES)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    return soft


def serve(mountpoint: Path, config: Config, state_dir: Path, ready_fd: int | None = None) -> int:
    """Mount and serve until unmounted or signalled; returns an exit code."""
    global _notify_socket
    raise_file_limit()
    _notify_socket = os.environ.pop("NOTIFY_SOCKET", None)
    global _watchdog_seconds
    _watchdog_seconds = watchdog_interval(os.environ.pop("WATCHDOG_USEC", None),
                                          os.environ.pop("WATCHDOG_PID", None))
    if ready_fd is not None:
        os.set_inheritable(ready_fd, False)
    state_dir.mkdir(parents=True, exist_ok=True)
    if still_mounted(mountpoint):
        log.error("%s is already mounted", mountpoint)
        return 1
    other = statedir.live_daemon(state_dir)
    if other is not None:
        log.error("%s: in use by the mlfs daemon %d", state_dir, other)
        return 2
    try:
        statedir.upgrade(state_dir)  # before anything reads the directory
    except statedir.FormatError as exc:
        log.error("%s", exc)
        return 2
    try:
        subsystems = create_subsystems(config.subsystems, state_dir)
    except SettingError as exc:  # e.g. a plugin's subsystem the core cannot serve
        log.error("configuration: %s", exc)
        return 2
    exchange = Exchange(config, state_dir, subsystems, backends=mlfs.backends,
                        actions=configured_actions(config.subsystems))
    loader = Loader(exchange)
    loaded, problems = loader.build_remembered({s.name for s in subsystems})
    exchange.add(loaded, LOADED)
    for problem in problems:  # shown in MOUNT/errors as a refused root command is
        exchange.root_errors.append(error_line("loaded.json", problem, "(at mount)"))
    control = Control(exchange, loader)
    backends, problems = describe_backends()
    for problem in problems:
        log.warning("%s", problem)  # a plugin that fails to import never stops the mount
    keep_info(exchange)
    ops = Operations(control, version_text=f"mlfs {__version__}\n",
                     metrics=lambda: metrics.render(exchange, loader, ops.latency),
                     gid=_group_id(config.mount.group),
                     backends_text=listing_text(backends))
    options = set(pyfuse3.default_options)
    options |= {"fsname=mlfs", "subtype=mlfs", "auto_unmount"}
    if config.mount.allow_other:
        options.add("allow_other")
    pid_path = state_dir / statedir.PID_FILE
    statedir.write_pid(state_dir)
    try:  # resolved now, before mounting: afterwards the path is served by this process
        run_pid = runfile.write(os.path.realpath(mountpoint), str(mountpoint), state_dir)
    except OSError as exc:
        run_pid = None
        log.warning("no pid file under %s (%s): `mlfs umount` will unmount without "
                    "waiting for this daemon", runfile.run_dir(), exc.strerror or exc)
    pyfuse3.init(ops, str(mountpoint), options)
    unmounted = False
    try:
        trio.run(_serve, exchange, ops, config, ready_fd)
        pyfuse3.close(unmount=True)
        unmounted = True
    except BaseException:
        log.exception("the mount failed")
        raise
    finally:
        if not unmounted:
            pyfuse3.close(unmount=True)
        exchange.close()
        pid_path.unlink(missing_ok=True)
        if run_pid is not None:
            runfile.remove(run_pid)
        log.info("%s: unmounted", mountpoint)
    return 0


async def _serve(exchange: Exchange, ops: Operations, config: Config,
                 ready_fd: int | None) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(exchange.run)
        if config.mount.metrics_port:  # listening before `mlfs mount` returns
            await nursery.start(serve_metrics,
                                lambda: metrics.render(exchange, ops.control.loader,
                                                       ops.latency),
                                config.mount.metrics_address, config.mount.metrics_port)
        nursery.start_soon(_on_signals, exchange, ops)
        nursery.start_soon(_announce_ready, ready_fd, exchange)
        if _watchdog_seconds:
            nursery.start_soon(_watchdog, exchange, _watchdog_seconds)
        await pyfuse3.main(min_tasks=8, max_tasks=config.mount.max_tasks)
        # unmounted from outside (fusermount3 -u): seal what is pending
        sd_notify("STOPPING=1")
        ops.stop()
        await exchange.seal_all()
        nursery.cancel_scope.cancel()


async def _announce_ready(ready_fd: int | None, exchange: Exchange) -> None:
    await trio.sleep(0)  # pyfuse3.main is running by now
    log.info("serving (pid %d)", os.getpid())
    if ready_fd is not None:
        os.write(ready_fd, b"ok\n")
        os.close(ready_fd)
    sd_notify(f"READY=1\nSTATUS=serving {len(exchange.runtimes)} subsystem(s)\n"
              f"MAINPID={os.getpid()}")


#: seconds between two WATCHDOG=1 (half of systemd's WatchdogSec=), None: no watchdog
_watchdog_seconds: float | None = None


def watchdog_interval(usec: str | None, pid: str | None) -> float | None:
    """The ping interval systemd asks for ($WATCHDOG_USEC, for this pid), or None."""
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None


def wedged(exchange: Exchange, interval: float) -> str | None:
    """Which subsystem's ticks stopped advancing (None: every one is alive).

    A tick is late past three tick periods, or two watchdog intervals if that is
    longer: an hourly subsystem is late only after three hours, a held tick (the state
    directory refusing writes) still counts as one.
    """
    now = time.monotonic()
    for runtime in exchange.runtimes.values():
        if runtime.unloading:
            continue
        allowed = max(3 * runtime.subsystem.tick_seconds, 2 * interval)
        if now - runtime.last_tick_at > allowed:
            return f"{runtime.name}: no tick for {now - runtime.last_tick_at:.0f} s"
    return None


async def _watchdog(exchange: Exchange, interval: float) -> None:
    """WATCHDOG=1 while the trio loop answers (this task runs) and every subsystem ticks.

    Nothing is sent while a subsystem's ticks are stuck (a backend's step that never
    returns): systemd then restarts the service after WatchdogSec=, and the ledger puts
    the knobs back at the next start.  With no subsystem the loop's own life is enough.
    """
    reported = None
    while True:
        stuck = wedged(exchange, interval)
        if stuck is None:
            sd_notify("WATCHDOG=1")
        elif stuck != reported:
            log.error("watchdog: %s; no WATCHDOG=1 until it ticks again", stuck)
        reported = stuck
        await trio.sleep(interval)


async def _on_signals(exchange: Exchange, ops: Operations) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:  # as the docs say: not a stop, not a reload
                log.warning("SIGHUP ignored: the configuration is read at mount; change "
                            "subsystems at run time with load/unload on MOUNT/control, or "
                            "restart the service")
                continue
            log.info("signal %d: sealing and unmounting", signum)
            sd_notify("STOPPING=1")
            ops.stop()
            with trio.move_on_after(30):
                await exchange.seal_all()
            pyfuse3.terminate()
            return
