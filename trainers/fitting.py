"""Fits bounded by a deadline, run where they cannot starve the trainer's own loop.

Why a child process.  A predictor's fit on a million drive-days took 40 s on a quiet
2-core machine (reading 3 s, window features 12 s, the feature matrix 12 s, LightGBM
10 s) and over a minute beside two busy loops.  Run in a thread of the trainer, the
fit held the trainer past `mlfs train --max-seconds` (the thread had to be joined:
72 s for `--max-seconds 25`) and, on a loaded machine, the loop that uploads the
policy again every keep-alive interval fell silent long enough for the proxy to pin
the model to emergency.  In a child process the trainer's loop shares no interpreter
with the fit, and a fit still running at the trainer's deadline is simply ended
(`FitProcess.cancel`, SIGKILL by its pid).

Why a deadline inside the fit as well.  Killing a fit wastes it; the fit is told its
deadline instead and stops boosting there (`stop_at`, a LightGBM callback: the trees
grown so far are a valid, shorter model).  A callback only runs between boosting
rounds, so the work before the first round (reading rows, window features, the
matrix, LightGBM's Dataset) is bounded by a row budget (`row_budget`): the rows a fit
may read, from the rate the previous fit measured.  The kill is the backstop for the
rest (a first fit with no rate yet on a machine slower than guessed).

`time.monotonic()` is CLOCK_MONOTONIC on Linux, one clock for every process of the
machine: a deadline is passed to the child as a monotonic instant.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import lightgbm as lgb

#: the rows the first fit reads, before any rate is measured: about 2 s of reading and
#: window features on a quiet 2-core machine (80k rows/s measured on sim.disks), 5 s
#: beside a busy loop per core
FIRST_FIT_ROWS = 200_000
#: the share of a fit's time its rows' assembly (reading, window features) may take;
#: the rest is boosting, which `stop_at` bounds
ASSEMBLY_SHARE = 0.4
#: fewer rows than this are not worth a fit (a budget never goes below it)
MIN_FIT_ROWS = 20_000
#: modules LightGBM imports when it finds them, which a fit never uses: marked absent in
#: the child.  Importing the predictor trainer took 1.23 s of CPU with them, 0.48 s
#: without (11 s and 4.9 s of wall time on a 2-core machine at load 14).  Not pandas:
#: pyarrow's pandas shim fails on a module marked absent
UNUSED_IN_CHILD = ("sklearn", "dask", "distributed", "matplotlib", "graphviz")


def stop_at(deadline: float) -> Callable[[Any], None]:
    """A LightGBM callback ending training at `deadline` (a monotonic instant), keeping
    the rounds done: `lgb.train` returns a booster of that many trees."""

    def callback(env: Any) -> None:
        if time.monotonic() >= deadline:
            raise lgb.callback.EarlyStopException(env.iteration, env.evaluation_result_list or [])

    callback.order = 40  # type: ignore[attr-defined]  # after LightGBM's own callbacks
    return callback


def row_budget(rows_per_second: float | None, seconds: float, most: int) -> int:
    """The rows a fit with `seconds` to go may read: ASSEMBLY_SHARE of its time at the rate
    the previous fit measured (FIRST_FIT_ROWS without one), within [MIN_FIT_ROWS, most]."""
    if rows_per_second is None:
        budget = FIRST_FIT_ROWS
    else:
        budget = int(rows_per_second * ASSEMBLY_SHARE * max(seconds, 0.0))
    return max(MIN_FIT_ROWS, min(most, budget))


class FitProcess:
    """One child process that runs `function(request)` for each `submit` and sends the
    result back.  It is started on the first submit and kept for the next ones, so
    LightGBM and pyarrow are imported once; `cancel` kills it (a fit past its deadline)
    and the next submit starts a new one.

    The child is a fresh interpreter (`python -c`, the request and result pickled over
    two pipes), not `multiprocessing`: a fork would copy the trainer's threads' locks,
    and multiprocessing's spawn runs the parent's main script again in the child,
    which an unguarded script (a user's, a test's) turns into a second trainer.
    `function` is named by its module and name, so it must be a module's top level.
    The kernel kills the child when the thread that started it ends (PR_SET_PDEATHSIG),
    so start, use and close one from the same thread."""

    def __init__(self, function: Callable[[dict], dict]) -> None:
        self.target = f"{function.__module__}:{function.__qualname__}"
        self._process: subprocess.Popen | None = None
        self._requests: Connection | None = None
        self._results: Connection | None = None
        self.busy = False

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the child now, before a request: its interpreter and imports (seconds on
        a loaded machine) then overlap the trainer's set-up instead of the first fit."""
        if self._process is None or self._process.poll() is not None:
            self._reap()
            self._start()

    def submit(self, request: dict) -> None:
        """Start `function(request)` in the child (one at a time)."""
        if self.busy:
            raise RuntimeError("a fit is already running")
        self.start()
        assert self._requests is not None
        try:
            self._requests.send(request)
        except OSError:  # it died meanwhile: `result` says so
            pass
        self.busy = True

    def result(self, timeout: float = 0.0) -> dict | None:
        """The running request's result once it is there (None before); a child that died
        meanwhile gives {"error": ...}."""
        if not self.busy or self._results is None:
            return None
        try:
            if not self._results.poll(timeout):
                return None
            out = self._results.recv()
        except (EOFError, OSError):
            self._reap()
            return {"error": "the fit's process ended without an answer"}
        self.busy = False
        return out

    def cancel(self) -> None:
        """End the running request now: the child is killed by its pid and reaped."""
        self._reap()

    close = cancel

    def _start(self) -> None:
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        code = (f"import sys; sys.modules.update(dict.fromkeys({UNUSED_IN_CHILD!r})); "
                f"from mlfs.trainers.fitting import serve; "
                f"serve({request_r}, {result_w}, {self.target!r})")
        try:
            self._process = subprocess.Popen([sys.executable, "-c", code],
                                             pass_fds=(request_r, result_w),
                                             stdin=subprocess.DEVNULL)
        finally:
            os.close(request_r)
            os.close(result_w)
        self._requests = Connection(request_w, readable=False)
        self._results = Connection(result_r, writable=False)

    def _reap(self) -> None:
        if self._process is not None:
            self._process.kill()  # by its pid; a no-op once it is reaped
            self._process.wait()
        for conn in (self._requests, self._results):
            if conn is not None:
                conn.close()
        self._process = self._requests = self._results = None
        self.busy = False


def serve(requests_fd: int, results_fd: int, target: str) -> None:
    """The child's loop: one answer per request until the trainer closes the pipe.  An
    exception is an answer too (the trainer logs it and tries again later)."""
    import importlib
    import traceback

    _end_with_parent()
    module, name = target.split(":")
    function = getattr(importlib.import_module(module), name)
    requests = Connection(requests_fd, writable=False)
    results = Connection(results_fd, readable=False)
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return
        try:
            out = function(request)
        except Exception as exc:  # a fit must never end the trainer: reported, retried
            out = {"error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()}
        try:
            results.send(out)
        except OSError:  # the trainer is gone
            return


def _end_with_parent() -> None:
    """Have the kernel kill this child when the trainer that started it dies (even by
    SIGKILL, which runs no clean-up): a fit must not outlive its trainer."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1  # noqa: N806  (linux/prctl.h)
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)
