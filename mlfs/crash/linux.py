"""The kernel-log rules: where a Linux report starts and ends in a console log, its lines.

A console log interleaves CPUs and tasks; with CONFIG_PRINTK_CALLER every line says which
(``[  12.345][ T1234] ...``), and a report is the lines of the context that started it.
Frames the unwinder is unsure of (``? f+0x1/0x2``) are dropped; a panic that follows a
report (panic_on_warn) is cut once the report has enough lines; a second report cuts the
first unless contexts tell them apart.  `parse_log` applies these rules, then
`mlfs.crash.parse.describe` the table's formats, then the kernel's corruption checks,
and names the guilty source file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from mlfs.crash.formats import LINUX_CRASH_KINDS, CrashKind, TitleFormat
from mlfs.crash.parse import (
    StackRules,
    describe,
    matches_any,
    normalise_title,
    pattern,
)
from mlfs.crash.skip import FRAMES_TO_SKIP, GUILTY_FILES_TO_SKIP, GUILTY_LINES_TO_SKIP

_RISCV_STACK_START = r"status: [0-9a-f]{16} badaddr: [0-9a-f]{16} cause: [0-9a-f]{16}"

LINUX_STACKS = StackRules(
    starts=(
        r"Call (?:T|t)race", r"Allocated:", r"Allocated by task [0-9]+:", r"Freed:",
        r"Freed by task [0-9]+:",
        r"[^k] backtrace(?: \(crc [[:xdigit:]]*\))?:",  # not "stack backtrace:"
        r"Backtrace:", r"Uninit was stored to memory at",
        _RISCV_STACK_START,  # riscv's show_regs() from the kernel prints no header
    ),
    frames=(
        r"^ *(?:{{PC}} ){0,2}{{FUNC}}",
        # arm: "[<pc>] (f) from [<pc>] (caller+0x..)": the callee is only in LR otherwise
        r"^ *{{PC}} \(([a-zA-Z0-9_.]+)\) from {{PC}} \({{FUNC}}",
    ),
    skip=FRAMES_TO_SKIP,
    # fault injection prints its own stack, often inside a report's
    corrupting_lines=(r"^( \[\<?(?:0x)?[0-9a-f]+\>?\])? should_fail(slab)?(\.[a-z0-9.]+)?\+0x",),
)
"""How Linux prints stacks (where one starts, a frame line, frames to skip)."""

_CONSOLE_PREFIX = re.compile(r"^(?:\*\* [0-9]+ printk messages dropped \*\* )?(?:.* login: )?"
                             r"(?:\<[0-9]+\>)?\[ *[0-9]+\.[0-9]+\](\[ *(?:C|T)[0-9]+\])? ")
_TASK_CONTEXT = re.compile(r"\[ *T[0-9]+\]")
_CPU_CONTEXT = re.compile(r"\[ *C[0-9]+\]")
_QUESTIONABLE_FRAME = re.compile(r"(\[\<[0-9a-f]+\>\])? \? ")
_REPLAYED = "** replaying previous printk message **"
CONSOLE = "console"  # a timestamp but no caller: every line is one context

NOT_A_NEW_REPORT = ("invalid opcode: 0000", "Kernel panic - not syncing",
                    "unregister_netdevice: waiting for", "PANIC: double fault", "Internal error:")
"""Headers that appear inside another report (a BUG's trap line, the panic after it)."""

INFO_WITH_STACK = ("vmalloc: allocation failure:", "FAULT_INJECTION: forcing a failure",
                   "FAULT_FLAG_ALLOW_RETRY missing")
"""Not bugs, but they print a stack: one inside a report may have cut it."""

CORRUPTED_TITLES = (r"\[ *[0-9]+\.[0-9]+\]",)
"""A timestamp inside a title: another line was printed into the middle of it."""

_VM_HANGUP = "serialport: VM disconnected."
_PANICKED = "Kernel panic - not syncing"


@dataclass
class Report:
    """One crash report: its title as syzbot gives it and what else a maintainer needs."""

    title: str
    corrupted: bool
    corrupted_reason: str = ""
    alt_titles: list[str] = field(default_factory=list)
    text: str = ""
    guilty_file: str = ""
    panicked: bool = False


def _starts(line: str, kind: CrashKind) -> bool:
    return kind.header in line and not matches_any(line, kind.suppressions)


def _context(line: str) -> str:
    m = _CONSOLE_PREFIX.match(line)
    if m is None:
        return ""
    return m.group(1) or CONSOLE


def _strip(line: str, context: str) -> tuple[str, bool]:
    """The line without its console prefix, and whether it is an unreliable frame."""
    if not context:
        return line, False
    line = line[line.find("] ") + 2:]
    if "<EOI>" not in line:
        if _QUESTIONABLE_FRAME.search(line):
            return line[line.find(" ? ") + 2:], True
        if line.endswith(" (unreliable)"):  # powerpc's "?"
            return line[:-13], True
    return line, False


def _first_report(lines: list[str]) -> tuple[CrashKind, int] | None:
    for index, line in enumerate(lines):
        for kind in LINUX_CRASH_KINDS:
            if _starts(line, kind) and not _replayed(lines, index):
                return kind, index
    return None


def _replayed(lines: list[str], index: int) -> bool:
    return index + 1 < len(lines) and _REPLAYED in lines[index + 1]


def _min_lines(header_line: str) -> int:
    # KMSAN reports have no "Call Trace" and fewer lines before a panic_on_kmsan panic
    return 16 if "BUG: KMSAN:" in header_line else 22


@dataclass
class _Extract:
    report: list[str] = field(default_factory=list)
    until_second: int = 0  # lines of `report` before a second report began
    prefix: list[str] = field(default_factory=list)
    last_header: int = 0  # index of the last line that starts any report


def _extract(lines: list[str], start: int, context: str) -> _Extract:
    """The lines of the report that starts at `start`, in its own context."""
    max_prefix = 50 if _TASK_CONTEXT.search(context) else 5
    out = _Extract(last_header=start)
    second = None
    text_lines = 0
    skip_rest = cpu_traceback = False
    for index, line in enumerate(lines):
        line_context = _context(line)
        stripped, questionable = _strip(line, line_context)
        if index < start:
            if line_context == context and stripped and not questionable:
                out.prefix = (out.prefix + [stripped])[-max_prefix:]
            continue
        is_header = index == start
        for kind in LINUX_CRASH_KINDS:
            if not _starts(line, kind):
                if not is_header and second is None and any(p in line for p in INFO_WITH_STACK):
                    second = index
                continue
            if _replayed(lines, index):
                continue
            out.last_header = index
            if not is_header and second is None and not any(p in line for p in NOT_A_NEW_REPORT):
                second = index
        if not is_header and (questionable or line_context != context and (
                not cpu_traceback or not _CPU_CONTEXT.search(line_context))):
            continue
        text_lines += 1
        skip_line = skip_rest
        if "Disabling lock debugging due to kernel taint" in line:
            skip_line = True
        elif "Sending NMI from CPU" in line:
            cpu_traceback = True  # all CPUs' backtraces belong to the report
        elif ("Kernel panic - not syncing" in line or
              "WARNING: possible circular locking dependency detected" in line) and \
                text_lines > _min_lines(lines[start]):
            skip_rest = skip_line = True  # the panic_on_warn tail, or a report's lockdep echo
        if not is_header and skip_line:
            continue
        out.report.append(stripped)
        if second is None or context not in ("", CONSOLE):
            out.until_second = len(out.report)
    return out


def parse_log(log: str) -> Report | None:
    """The first crash report in a console log, titled as syzbot titles it; None if none."""
    log = log.replace("\r", "")
    lines = log.split("\n")
    if lines[-1] == "":  # the newline ending the last line starts no line of its own
        lines.pop()
    found = _first_report(lines)
    if found is None:
        return None
    kind, start = found
    context = _context(lines[start])
    ex = _extract(lines, start, context)
    report = "".join(line + "\n" for line in ex.report)
    desc = describe("".join(line + "\n" for line in ex.report[:ex.until_second]), kind,
                    LINUX_STACKS)
    if not desc.title:
        report = "\n".join(lines[start:ex.last_header + 1])
        desc = describe(report, kind, LINUX_STACKS)
    corrupted = desc.corrupted
    if not corrupted:
        corrupted = _corruption(desc.title, report, desc.format)
    if _VM_HANGUP in log:
        corrupted = corrupted or "console hung up"
    return Report(title=normalise_title(desc.title), corrupted=bool(corrupted),
                  corrupted_reason=corrupted,
                  alt_titles=[normalise_title(t) for t in desc.alt_titles],
                  text=report, guilty_file=guilty_file(desc.title, report),
                  panicked=_PANICKED in log)


def _corruption(title: str, report: str, fmt: TitleFormat | None) -> str:
    """Why a titled report is incomplete: a stack header with no frames, or no stack."""
    if matches_any(title, CORRUPTED_TITLES):
        return "title matches corrupted regexp"
    if fmt is None or fmt.no_stack_trace:
        return ""
    has_stack = False
    for start in LINUX_STACKS.starts:
        m = pattern(start).search(report)
        if m is None:
            continue
        following = report[m.start():].split("\n")
        if len(following) < 4:
            return "call trace is missed"
        framed = False
        for line in following[1:16]:
            if matches_any(line, LINUX_STACKS.starts):
                break
            if "(stack is not available)" in line or matches_any(line, LINUX_STACKS.frames):
                framed = has_stack = True
                break
        if start != _RISCV_STACK_START and not framed:
            return "no frames in a stack trace"
    return "" if has_stack else "no stack trace in report"


_SOURCE_END = re.compile(r"[a-zA-Z0-9_\-]\.[ch]:[0-9]")
_PATH_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./")
_DEEPER_PATH = re.compile(r"^/[a-zA-Z0-9_\-\./]+/[a-zA-Z0-9_\-]+\.(c|h)$")
_RCU_INTERRUPT_ENDS = ("apic_timer_interrupt+0x", "el1h_64_irq+0x", "Exception stack")


def guilty_file(title: str, report: str) -> str:
    """The source file to blame: the first not in `GUILTY_FILES_TO_SKIP`, then deeper.

    A stall's stack starts in the timer interrupt that caught it; its guilty file is
    looked for from where the interrupt was entered.
    """
    if title.startswith("INFO: rcu detected stall"):
        for marker in _RCU_INTERRUPT_ENDS:
            pos = report.find(marker)
            if pos != -1:
                found = _guilty_file(report[pos:])
                if found:
                    return found
    return _guilty_file(report)


def _source_file(line: str) -> str | None:
    """The first `path/file.c` of a `path/file.c:123` in `line`.

    Found from the ``.c:123`` back to where the path starts: the one pattern for the
    whole (``[\\w./-]*\\w+\\.c:\\d+``) backtracks quadratically on a long run of path
    characters, and a console line can be thousands of them (a hex dump).
    """
    for m in _SOURCE_END.finditer(line):
        start = m.start()
        while start > 0 and line[start - 1] in _PATH_CHARS:
            start -= 1
        return line[start:m.start() + 3]
    return None


def _skipped_file(path: str, line: str) -> bool:
    return any(re.search(p, path) for p in GUILTY_FILES_TO_SKIP) or \
        re.search(GUILTY_LINES_TO_SKIP, line) is not None


def _guilty_file(report: str) -> str:
    lines = iter(report.split("\n"))
    guilty = ""
    for line in lines:
        path = _source_file(line)
        if path is None:
            continue
        guilty = guilty or path
        if _skipped_file(path, line):
            continue
        guilty = os.path.normpath(path)
        break
    # a file deeper in the same directory, lower in the stack, is more specific
    deepest = os.path.dirname(guilty)
    for line in lines:
        path = _source_file(line)
        if path is None or _skipped_file(path, line):
            continue
        clean = os.path.normpath(path)
        if clean.startswith(deepest) and _DEEPER_PATH.match(clean[len(deepest):]):
            guilty = clean
            deepest = os.path.dirname(guilty)
    return guilty
