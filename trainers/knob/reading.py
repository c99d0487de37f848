"""The knob trainer's reading side: the mount's attributes, its `events` stream and
the Parquet portions (dataset, feedback) it has not seen yet.

`MountReader` is a part of `worker._Worker` (which holds the state it uses: `sub`,
`mdir`, `learner`, `seen`, `stats`, `log`): it reads and hands over, and decides
nothing about training.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mlfs import client


class MountGone(Exception):
    """The mount or the subsystem disappeared: reconnect from scratch."""


gone = client.gone


class MountReader:
    """Attributes, events and portions, as the worker reads them."""

    # ---- small helpers ----------------------------------------------------
    def warn(self, key: str, msg: str, *args: object) -> None:
        """WARNING once per key every 10 s, DEBUG in between: no floods."""
        now = time.monotonic()
        if now - self.warned.get(key, -1e9) >= 10.0:
            self.warned[key] = now
            self.log.warning(msg, *args)
        else:
            self.log.debug(msg, *args)

    read_attr = staticmethod(client.read_attr)

    def write_attr(self, path: Path, text: str) -> None:
        """One value, one write(2), as sysfs wants; errors raise OSError."""
        client.write_line(path, text)

    def last_error(self) -> str:
        """The proxy's reason for the last refusal (the last line of `errors`)."""
        return client.last_error(self.mdir)

    def check_gone(self, exc: OSError) -> None:
        """Turn 'the mount is gone' into MountGone; 'only the proxy is gone' into a
        re-creation; anything else is left for the caller to log."""
        if not gone(exc):
            return
        try:
            os.stat(self.sub / "info")
        except OSError:
            raise MountGone(str(exc)) from None
        if not self.mdir.is_dir():
            self.log.warning("model proxy %s was destroyed; re-creating it", self.mdir)
            self.ensure_proxy()

    def open_events(self) -> None:
        self.close_events()
        self.events = client.EventStream(self.sub / "events")

    def close_events(self) -> None:
        if self.events is not None:
            self.events.close()
        self.events = None

    # ---- events -----------------------------------------------------------
    def wait_events(self, timeout: float) -> list[dict]:
        """Block in poll() up to `timeout` s; return the whole lines that arrived."""
        assert self.events is not None
        bad = self.events.bad_lines
        events = self.events.read(timeout)
        if self.events.ended:
            raise MountGone("end of file on events")
        if self.events.bad_lines > bad:
            self.log.debug("%d unparsable event lines", self.events.bad_lines - bad)
        if not events and self.events.spurious > 3:
            # readable by poll but nothing to read: a mount without poll support
            # would spin us; fall back to a short wait rather than burn a core
            self.stop.wait(min(timeout, 0.2))
        return events

    def handle(self, events: list[dict]) -> None:
        dataset = feedback = False
        for event in events:
            self.stats["events"] += 1
            if event.get("subsystem") not in (None, self.subsystem):
                continue
            kind = event.get("event")
            ours = event.get("model") == self.model
            if kind == "portion":
                path = str(event.get("path", ""))
                dataset |= path.startswith(f"{self.subsystem}/dataset/") or not path
            elif kind == "feedback" and ours:
                feedback = True
            elif kind == "mode" and ours:
                old, self.mode = self.mode, str(event.get("to", self.mode))
                if old != self.mode:
                    self.log.info("mode %s -> %s (%s)", event.get("from", old), self.mode,
                                  event.get("why", ""))
            elif kind == "state" and ours:
                self.state = str(event.get("to", self.state))
                if self.state in ("stopped", "initialized"):
                    # stopped by someone, or destroyed (rmdir stops first), or a
                    # fresh proxy: housekeeping re-creates and starts it as needed
                    self.log.info("model proxy is %s; it will be started again", self.state)
                    self.start_pending = True
            elif kind == "policy" and ours and event.get("status") in ("failed", "removed"):
                self.log.warning("policy %s by the proxy", event.get("status"))
                self.policy_live = False
            elif kind == "overflow":
                self.stats["overflows"] += 1
                self.log.info("event stream overflowed (%s lost); rescanning", event.get("lost"))
                dataset = feedback = True
        if dataset:
            self.scan_dataset()
        if feedback:
            self.scan_feedback()

    # ---- portions ---------------------------------------------------------
    list_portions = staticmethod(client.list_portions)

    def read_portion(self, path: Path) -> pa.Table | None:
        """A sealed portion, or None when it vanished or is malformed (logged).

        Read by pyarrow from the path, not with `client.read_portion`: that one
        suits small portions read by a short-lived client (one thread, the file's
        bytes in memory); a trainer reads every dataset portion, which may be
        hundreds of MiB, and would then hold the bytes and the table at once.
        """
        try:
            return pq.read_table(path)
        except FileNotFoundError:
            self.log.debug("portion %s vanished before it was read", path)
            return None
        except OSError as exc:
            if gone(exc):
                raise
            self.stats["skipped_portions"] += 1
            self.warn("portion", "skipping portion %s: %s", path, exc)
            return None
        except (pa.ArrowException, ValueError) as exc:
            self.stats["skipped_portions"] += 1
            self.warn("portion", "skipping malformed portion %s: %s", path, exc)
            return None

    @staticmethod
    def prune(seen: set[str], listed: list[str]) -> None:
        """Names are never reused, so names no longer listed can be forgotten."""
        if len(seen) > 4096:
            seen &= set(listed)

    def scan_dataset(self, initial: bool = False) -> None:
        """Read the dataset portions not seen yet, oldest first.

        On a first scan only the newest ones that fill the learner's window are
        read (the rest could not be kept anyway); they are still added oldest
        first, so rows re-align across portion boundaries.
        """
        assert self.learner is not None
        directory = self.sub / "dataset"
        listed = self.list_portions(directory)
        seen = self.seen["dataset"]
        new = [n for n in listed if n not in seen]
        if not new:
            return
        tables: list[tuple[str, pa.Table]] = []
        if initial or len(new) > 64:
            rows = 0
            for name in reversed(new):
                seen.add(name)
                if rows >= self.learner.window:
                    continue
                table = self.read_portion(directory / name)
                if table is not None:
                    tables.append((name, table))
                    rows += table.num_rows
            tables.reverse()
        else:
            for name in new:
                seen.add(name)
                table = self.read_portion(directory / name)
                if table is not None:
                    tables.append((name, table))
        for name, table in tables:
            try:
                self.learner.add_dataset(table)
            except (ValueError, pa.ArrowException, KeyError, TypeError) as exc:
                self.stats["skipped_portions"] += 1
                self.warn("schema", "dataset portion %s does not fit the subsystem: %s",
                          name, exc)
                continue
            self.stats["portions"] += 1
            self.t_last_portion = time.monotonic()
        self.prune(seen, listed)

    def scan_feedback(self) -> None:
        """Read new feedback portions and correct the model with each one."""
        assert self.learner is not None
        directory = self.mdir / "feedback"
        listed = self.list_portions(directory)
        seen = self.seen["feedback"]
        for name in listed:
            if name in seen:
                continue
            seen.add(name)
            table = self.read_portion(directory / name)
            if table is None:
                continue
            self.stats["feedback_portions"] += 1
            try:
                if not self.learner.fitted:
                    self.learner.add_feedback(table)
                    continue
                result = self.learner.correct(table)
            except (ValueError, pa.ArrowException, KeyError, TypeError) as exc:
                self.warn("schema", "feedback portion %s does not fit: %s", name, exc)
                continue
            if result.get("corrected"):
                self.stats["corrections"] += 1
                self.last_correction = result
                self.policy_dirty = self.learner.knob_aware
                self.log.debug("corrected on %d feedback rows: |error| recorded %.4g, "
                               "model %.4g -> %.4g", result["rows"], result["recorded_mae"],
                               result["mae_before"], result["mae_after"])
        self.prune(seen, listed)
