"""The policy a model runs: built from policy.txt, replaced by an upload, dropped when it fails.

An upload is verified and loaded once in a check process (`check`, any thread)
before `install` puts it in place on the trio thread: policy.txt is written
durably first, so a restart runs what the writer was told is installed.  At
start-up the saved file is verified again (`restore`); one that fails is set
aside, never run.  A policy that fails or runs over its budget while running is
dropped (`drop`) and its file set aside for a look.  Each change is an event.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path

from mlfs.base.clock import rfc3339
from mlfs.base.durable import set_aside, write_durably
from mlfs.base.errors import Refused
from mlfs.base.verifier import verify

from .model_files import read_back
from .policy import Policy, check_in_subprocess

log = logging.getLogger("mlfs.proxy")


class InstalledPolicy:
    """One model's policy slot (`ModelProxy.installed`)."""

    def __init__(self, path: Path, build: Callable[[bytes], Policy],
                 errors: collections.deque[str], who: str,
                 publish: Callable[..., object]) -> None:
        self.path = path
        #: text -> a runnable policy for this model (a predictor builds its own kind)
        self.build = build
        self.errors = errors
        self.who = who
        self.publish = publish
        self.policy: Policy | None = None
        #: when it was installed: a recommendation accepted earlier yields to it
        self.loaded_ns = 0

    def text(self) -> bytes:
        return self.policy.text if self.policy else b""

    def _set(self, policy: Policy | None) -> None:
        self.policy = policy
        self.loaded_ns = time.monotonic_ns()

    def restore(self) -> list[tuple[Path, str]]:
        """Run the saved policy again, verified as an upload is; the damaged files found."""
        text, damaged = read_back(self.path)
        if not text:
            return damaged
        try:
            self._set(self.build(text))
        except Refused as exc:
            return [(self.path, exc.reason)]
        except Exception as exc:  # LightGBM refused what the verifier let through
            return [(self.path, f"does not load: {str(exc)[:200]}")]
        return []

    def check(self, text: bytes) -> Policy:
        """Verify, load once in a check process, and build the Policy (any thread).

        The verifier runs first, so garbage is refused without starting a
        process; the check process and `Policy` run it again before their
        LightGBM sees the text.

        The text of the policy in force is that policy: a trainer's keep-alive uploads
        it again every few seconds, and a check process (a new interpreter importing
        LightGBM) took 5-15 s on a loaded 2-core machine, so the proxy heard the trainer
        only that late and pinned the model to emergency as silent while the trainer
        kept it alive (issue 55).  What was checked and runs is not checked again.
        """
        running = self.policy
        if running is not None and text == running.text:
            return running
        verify(text)
        check_in_subprocess(text)
        return self.build(text)

    def install(self, text: bytes, policy: Policy | None = None) -> None:
        """Put `policy` (built from `text`) in place; empty text removes the policy."""
        if not text:
            self.policy = None
            self.path.unlink(missing_ok=True)
            self.publish(status="removed", reason="emptied by a write")
            return
        if policy is None:
            policy = self.build(text)
        write_durably(self.path, text)
        self._set(policy)
        self.publish(status="loaded", trees=policy.verified.trees)

    def drop(self, reason: str) -> None:
        """A running policy failed or ran over budget: drop it, keep the file for a look."""
        self.policy = None
        log.error("%s: policy removed: %s", self.who, reason)
        self.errors.append(f"{rfc3339()} policy removed: {reason}")
        if self.path.exists():
            set_aside(self.path, f"{self.who}: removed: {reason}")
        self.publish(status="removed", reason=reason)
