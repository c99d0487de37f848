"""A real Dask cluster for the fleet tests: a `dask scheduler` and `dask worker`
processes on 127.0.0.1, started and ended by their PIDs.

The scheduler and workers unpickle mlfs's functions, so they run with this checkout on
PYTHONPATH, as a real cluster needs mlfs installed on every worker (docs/fleet.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.harness import REPO, wait_for

DASK = str(Path(sys.executable).with_name("dask"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def scheduler_command(port: int) -> list[str]:
    return [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]


def worker_command(address: str, *extra: str) -> list[str]:
    return [DASK, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
            "--host", "127.0.0.1", *extra]


def end_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each by its PID, newest first; SIGKILL what has not ended 20 s later."""
    import signal

    for proc in reversed(procs):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def dask_cluster(directory: Path, workers: int = 2) -> Iterator[str]:
    """A scheduler and `workers` workers, their output in `directory`/dask.log; yields
    the scheduler's address once every worker has registered."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    log = open(directory / "dask.log", "ab")  # noqa: SIM115  (closed in finally)
    try:
        procs.append(subprocess.Popen(scheduler_command(port), stdout=log, stderr=log,
                                      cwd=REPO, env=cluster_env()))
        for _ in range(workers):
            procs.append(subprocess.Popen(worker_command(address), stdout=log, stderr=log,
                                          cwd=REPO, env=cluster_env()))
        wait_for(lambda: (directory / "dask.log").read_text().count(
            "Register worker") >= workers, timeout=60, what="the workers registered")
        yield address
    finally:
        end_processes(procs)
        log.close()
