# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""The shape of an entry of the crash table (`mlfs.crash.formats`): a kind of report,
the formats that title it, and where a format's guilty function is in the stack.
"""

from __future__ import annotations

from dataclasses import dataclass

# "Parse a stack trace from here": a `Stack` part that is not a pattern.
STACK = "<stack trace>"

# The faulting instruction: x86's "RIP: 0010:f+0x1/0x2", arm's "pc : f+0x..", ppc's "NIP".
RIP_FRAME = r"(?:IP|NIP|pc |PC is at):? (?:(?:[0-9]+:)?(?:{{PC}} +){0,2}{{FUNC}}|(?:[0-9]+:)?0x[0-9a-f]+|(?:[0-9]+:)?{{PC}} +\[< *\(null\)>\] +\(null\)|[0-9]+: +\(null\))"
CALL_TRACE = r"(?:Call (?:T|t)race:)|(?:Backtrace:)"


@dataclass(frozen=True)
class Stack:
    """Where a format's guilty function is: parts matched one after another.

    A part is a pattern (advances to the first line matching it; its groups, if any,
    are candidate frames) or `STACK` (every frame line up to the next stack start).
    When `parts` finds no frame, `parts2` is tried.  `skip` adds to
    `mlfs.crash.skip.FRAMES_TO_SKIP` for this format only; `pick` names a rule that
    chooses among the frames instead of taking the first ("stall": a representative
    caller of a looping region, "hung_task": the waiter, not the wait primitive).
    """

    parts: tuple[str, ...]
    parts2: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    pick: str | None = None


@dataclass(frozen=True)
class TitleFormat:
    """One way a kind of report is titled.

    `title` must match for the format to apply (the earliest match in the report wins);
    if `report` is given it must match too, else the report is corrupted (the header was
    printed but not the lines that make the title).  `no_stack_trace` exempts the format
    from the rule that a report has frames; `corrupted` marks a format that only
    matches reports whose telling part is missing.
    """

    title: str
    template: str
    report: str | None = None
    alt: tuple[str, ...] = ()
    stack: Stack | None = None
    no_stack_trace: bool = False
    corrupted: bool = False


@dataclass(frozen=True)
class CrashKind:
    """The reports a line containing `header` starts, unless it matches a suppression."""

    header: str
    formats: tuple[TitleFormat, ...]
    suppressions: tuple[str, ...] = ()


def warning_stack(*skip: str) -> Stack:
    """Newer kernels trap on WARN (the stack follows "RIP:"), older ones print a trace."""
    return Stack(parts=(r"(?:" + RIP_FRAME + r"|--- interrupt: [0-9]+ at {{FUNC}})", STACK),
                 parts2=(CALL_TRACE, STACK), skip=skip)
