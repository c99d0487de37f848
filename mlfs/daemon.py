"""Start-up and shutdown of one mount: init, serve, seal, restore, unmount.

Order matters (FUSE-NOTES): nothing touches the mountpoint between
`pyfuse3.init()` and `main()`; the readiness pipe is non-inheritable so the
auto_unmount helper does not keep it open; SIGTERM/SIGINT seal open rows and
call `pyfuse3.terminate()`; blocked event readers are woken with end of file.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
from pathlib import Path

import pyfuse3
import trio

from mlfs.backends import SettingError, create_subsystems, describe_backends, listing_text

from . import __version__
from .config import Config
from .core import metrics, statedir
from .core.exchange import Exchange
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


def _group_id(name: str) -> int:
    if not name:
        return 0
    import grp

    return grp.getgrnam(name).gr_gid


def setup_logging(state_dir: Path, foreground: bool) -> None:
    handlers: list[logging.Handler] = [logging.FileHandler(state_dir / "mlfs.log")]
    if foreground:
        handlers.append(logging.StreamHandler())
    logging.basicConfig(level=os.environ.get("MLFS_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers, force=True)


def serve(mountpoint: Path, config: Config, state_dir: Path, ready_fd: int | None = None) -> int:
    """Mount and serve until unmounted or signalled; returns an exit code."""
    if ready_fd is not None:
        os.set_inheritable(ready_fd, False)
    state_dir.mkdir(parents=True, exist_ok=True)
    clean_stale_mount(mountpoint)
    if is_mounted(mountpoint):
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
    exchange = Exchange(config, state_dir, subsystems)
    backends, problems = describe_backends()
    for problem in problems:
        log.warning("%s", problem)  # a plugin that fails to import never stops the mount
    ops = Operations(exchange, version_text=f"mlfs {__version__}\n",
                     metrics=lambda: metrics.render(exchange),
                     gid=_group_id(config.mount.group),
                     backends_text=listing_text(backends))
    options = set(pyfuse3.default_options)
    options |= {"fsname=mlfs", "subtype=mlfs", "auto_unmount"}
    if config.mount.allow_other:
        options.add("allow_other")
    pid_path = state_dir / statedir.PID_FILE
    statedir.write_pid(state_dir)
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
        log.info("%s: unmounted", mountpoint)
    return 0


async def _serve(exchange: Exchange, ops: Operations, config: Config,
                 ready_fd: int | None) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(exchange.run)
        if config.mount.metrics_port:  # listening before `mlfs mount` returns
            await nursery.start(serve_metrics, lambda: metrics.render(exchange),
                                config.mount.metrics_address, config.mount.metrics_port)
        nursery.start_soon(_on_signals, exchange, ops)
        nursery.start_soon(_announce_ready, ready_fd)
        await pyfuse3.main(min_tasks=8, max_tasks=config.mount.max_tasks)
        # unmounted from outside (fusermount3 -u): seal what is pending
        ops.stop()
        await exchange.seal_all()
        nursery.cancel_scope.cancel()


async def _announce_ready(ready_fd: int | None) -> None:
    await trio.sleep(0)  # pyfuse3.main is running by now
    log.info("serving (pid %d)", os.getpid())
    if ready_fd is not None:
        os.write(ready_fd, b"ok\n")
        os.close(ready_fd)


async def _on_signals(exchange: Exchange, ops: Operations) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal %d: sealing and unmounting", signum)
            ops.stop()
            with trio.move_on_after(30):
                await exchange.seal_all()
            pyfuse3.terminate()
            return
