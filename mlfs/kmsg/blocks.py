"""Crash reports assembled from the kernel log's records, across ticks.

A crash report spans many records (header, registers, ``Call Trace:``, frames,
``---[ end trace <id> ]---``) that may arrive over several ticks; `Blocks` groups them
and, once a block is complete, titles it as syzbot does (`mlfs.kmsg.kinds.complete_title`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlfs.kmsg.kinds import Classified, complete_title

_END = re.compile(r"^---\[ end (?:trace|Kernel panic)")


@dataclass
class Block:
    """A multi-record report being read: its first record's seq, kind, title and lines,
    and the records' own times (wall clock, seconds) of its first and last line."""

    first_seq: int
    kind: str
    title: str
    lines: list[str]
    ended: bool = False
    first_seen: float = 0.0
    last_seen: float = 0.0
    #: when (the reader's monotonic clock) the block last got a line: what `quiet` measures
    fed_at: float = 0.0
    #: "kernel" or "user": who wrote the header (`Reports.seen`'s `origin`)
    origin: str = "kernel"


class Blocks:
    """Groups the records of multi-record reports; knows when one ends.

    A block starts at a header record (`Classified.block`) and ends at the kernel's
    ``---[ end trace ... ]---`` marker, at the next header or report, after `MAX_LINES`
    records, or when nothing was added to it for `QUIET_SECONDS` (`quiet`): a hung-task,
    RCU-stall or lockup report has no end marker.  The quiet interval is measured in time,
    not in ticks: with a 0.1 s tick an idle tick is no evidence that a report is complete
    (the kernel prints a block from one context, but a WARNING followed 0.5 s later by its
    registers was lost to "an idle tick ends the block" in red team K7).
    """

    MAX_LINES = 200
    #: seconds without a new line after which an open block is complete
    QUIET_SECONDS = 2.0

    def __init__(self) -> None:
        self.open: Block | None = None

    def feed(self, seq: int, message: str, classified: Classified, when: float = 0.0,
             now: float = 0.0, origin: str = "kernel") -> tuple[int | None, Block | None]:
        """(block of this record or None, a block that ended with it or before it).

        `when`: the record's own wall-clock time; `now`: the reader's monotonic clock."""
        ended = None
        # "Oops: 0000 [#1] SMP" follows the BUG: line that opened the same report
        continues = classified.signature == "Oops" and self.open is not None
        if classified.block and not continues:
            ended = self._close()
            self.open = Block(seq, classified.kind, classified.signature, [message],
                              first_seen=when, last_seen=when, fed_at=now, origin=origin)
            return seq, ended
        current = self.open
        if current is None:
            return None, None
        if classified.kind not in ("other", "panic") and not continues and \
                classified.suppressed == 0:
            return None, self._close()  # an unrelated report ends the block
        current.lines.append(message)
        current.last_seen, current.fed_at = when, now
        if _END.match(message.strip()) or len(current.lines) >= self.MAX_LINES:
            return current.first_seq, self._close()
        return current.first_seq, None

    def quiet(self, now: float, seconds: float | None = None) -> Block | None:
        """The open block, closed, if nothing was added to it for `seconds` by `now`."""
        seconds = self.QUIET_SECONDS if seconds is None else seconds
        if self.open is not None and now - self.open.fed_at >= seconds:
            return self._close()
        return None

    def idle(self) -> Block | None:
        """The open block, closed now (the end of the input: a test, a shutdown)."""
        return self._close()

    def _close(self) -> Block | None:
        block, self.open = self.open, None
        if block is not None:
            block.title = complete_title(block.title, block.kind, block.lines)
            block.ended = True
        return block
