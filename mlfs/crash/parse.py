"""The generic parser: a report's title, alternative titles and corruption from its format.

Nothing here knows Linux: the kinds and their formats come from `mlfs.crash.formats`, the
frame rules from a `StackRules` (Linux's are in `mlfs.crash.linux`).  Given the text of
one report, `describe` picks the format whose title pattern matches earliest, fills its
template with what the patterns captured and the guilty frames, and says why the report
is corrupted if it is; `normalise_title` then masks what differs between two hits of
the same bug (addresses, numbers, executor ids), as syzbot's dashboard does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mlfs.crash.schema import STACK, CrashKind, Stack, TitleFormat
from mlfs.crash.skip import (
    FRAME_PREFIXES_TO_STRIP,
    HUNG_TASK_ANCHOR_FRAMES,
    HUNG_TASK_FRAMES_TO_SKIP,
    STALL_ANCHOR_FRAMES,
)
from mlfs.crash.symbols import demangle

_PLACEHOLDERS = {
    "{{ADDR}}": r"0x[0-9a-f]+",
    "{{PC}}": r"\[\<?(?:0x)?[0-9a-f]+\>?\]",
    "{{FUNC}}": r"([a-zA-Z0-9_]+)(?:\.|\+)",
    "{{SRC}}": r"([a-zA-Z0-9-_/.]+\.[a-z]+:[0-9]+)",
    "{{TASK}}": r"[\s\S]{0,100}?",
    "[[:xdigit:]]": "[0-9a-fA-F]",  # POSIX classes, which Python lacks
    "[[:space:]]": r"\s",
}


@functools.cache
def pattern(text: str) -> re.Pattern[str]:
    """A table pattern compiled, its placeholders expanded (cached: the table is fixed)."""
    for name, expansion in _PLACEHOLDERS.items():
        text = text.replace(name, expansion)
    return re.compile(text)


def matches_any(line: str, patterns: Sequence[str]) -> bool:
    return any(pattern(p).search(line) for p in patterns)


@dataclass(frozen=True)
class StackRules:
    """How an OS prints stacks: where one starts, what a frame line is, what to ignore."""

    starts: tuple[str, ...]
    frames: tuple[str, ...]
    skip: tuple[str, ...]
    corrupting_lines: tuple[str, ...] = ()


@dataclass
class Description:
    """What `describe` makes of a report; `format` is None when no format matched."""

    title: str = ""
    corrupted: str = ""
    alt_titles: list[str] = field(default_factory=list)
    format: TitleFormat | None = None


NO_FRAMES = "extracted no frames"


def describe(report: str, kind: CrashKind, rules: StackRules) -> Description:
    """Title `report` by the first format of `kind` whose title pattern matches earliest.

    A later format only replaces an earlier one by matching earlier in the text: two
    formats can match the same report ("BUG: KASAN:" and "BUG: KASAN: (.*)") and the
    table's order says which is meant.  When a title pattern matches but no format's
    report pattern does, the header line itself is the title and the report is corrupted.
    """
    out = Description()
    start = len(report)
    matched_title = False
    for fmt in kind.formats:
        m = pattern(fmt.title).search(report)
        if m is None or m.start() > start or (m.start() == start and out.title):
            continue
        if m.start() < start:
            out, start = Description(), m.start()
        matched_title = True
        if fmt.report is not None:
            m = pattern(fmt.report).search(report)
            if m is None:
                continue
        args = [g or "" for g in m.groups()]
        out.corrupted = ""
        if fmt.stack is not None:
            frames, ok = guilty_frames(report[m.start():], fmt.stack, rules)
            args += frames
            if not ok:
                out.corrupted = NO_FRAMES
        out.title = _fill(fmt.template, args)
        out.alt_titles = list(dict.fromkeys(_fill(a, args) for a in fmt.alt))
        out.format = fmt
    if not out.title:
        if matched_title:
            out.corrupted = "matched title but not report regexp"
        pos = report.find(kind.header)
        if pos == -1:
            return out
        end = report.find("\n", pos)
        out.title = report[pos:end if end != -1 else len(report)]
    if not out.corrupted and out.format is not None and out.format.corrupted:
        out.corrupted = "report format is marked as corrupted"
    return out


def _fill(template: str, args: list[str]) -> str:
    try:
        return template.format("", *args)
    except IndexError:  # a template naming a group its pattern lacks: the table's bug
        return template


def guilty_frames(text: str, stack: Stack, rules: StackRules) -> tuple[list[str], bool]:
    """One guilty function per `STACK` part of `stack` (or after its last part).

    False when some part found no frame that is not skipped: the report is cut, or its
    stack is all machinery, and its title says "corrupted" in that place.
    """
    skip = re.compile("|".join(rules.skip + stack.skip))
    frames, ok = _walk(text, stack.parts, skip, stack.pick, rules)
    if ok or not stack.parts2:
        return frames, ok
    return _walk(text, stack.parts2, skip, stack.pick, rules)


def _walk(text: str, parts: tuple[str, ...], skip: re.Pattern[str], pick: str | None,
          rules: StackRules) -> tuple[list[str], bool]:
    lines = iter(text.split("\n"))
    candidates: list[str] = []
    found: list[str] = []
    ok = True
    stacks = 0
    index = 0
    while True:
        if index == len(parts) or (parts[index] == STACK and stacks > 0):
            frame = _choose(candidates, pick)
            if not frame:
                frame, ok = "corrupted", False
            found.append(frame)
            candidates = []
        if index == len(parts):
            return found, ok
        part = parts[index]
        if part == STACK:
            stacks += 1
            following = pattern(parts[index + 1]) if index + 1 < len(parts) else None
            for line in lines:
                if matches_any(line, rules.corrupting_lines):
                    ok = False
                    break
                if matches_any(line, rules.starts):
                    break
                if following is not None:
                    m = following.search(line)
                    if m:
                        _add_frames(candidates, m, skip)
                        index += 1
                        break
                for frame_re in rules.frames:
                    m = pattern(frame_re).search(line)
                    if m:
                        _add_frames(candidates, m, skip)
                        break
        else:
            part_re = pattern(part)
            for line in lines:
                if matches_any(line, rules.corrupting_lines):
                    ok = False
                    break
                m = part_re.search(line)
                if m:
                    _add_frames(candidates, m, skip)
                    break
        index += 1


def _add_frames(candidates: list[str], m: re.Match[str], skip: re.Pattern[str]) -> None:
    for frame in m.groups():
        if frame and not skip.search(frame := demangle(frame)):
            candidates.append(frame)


def strip_prefix(frame: str) -> str:
    """`__x64_sys_bind` -> `sys_bind`: the shortest name any one prefix removal gives."""
    shortest = frame
    for prefix in FRAME_PREFIXES_TO_STRIP:
        if frame.startswith(prefix) and len(frame) - len(prefix) < len(shortest):
            shortest = frame[len(prefix):]
    return shortest


def _choose(candidates: list[str], pick: str | None) -> str:
    if not candidates:
        return ""
    frames = [strip_prefix(f) for f in candidates]
    if pick is None:
        return frames[0]
    return FRAME_PICKERS[pick](frames)


def stall_frame(frames: list[str]) -> str:
    """The frame just above the first anchor: the syscall or work item that loops."""
    previous = frames[0]
    for frame in frames:
        if matches_any(frame, STALL_ANCHOR_FRAMES):
            return "smp_call_function" if "smp_call_function" in frame else previous
        previous = frame
    return ""


def hung_task_frame(frames: list[str]) -> str:
    """The anchor a victim waits on (rtnl, RCU), else the first frame not a wait primitive."""
    for frame in frames:
        for anchor, name in HUNG_TASK_ANCHOR_FRAMES.items():
            if anchor in frame:
                return name or frame
    for frame in frames:
        if not any(s in frame for s in HUNG_TASK_FRAMES_TO_SKIP):
            return frame
    return ""


FRAME_PICKERS: dict[str, Callable[[list[str]], str]] = {
    "stall": stall_frame,
    "hung_task": hung_task_frame,
}
"""`Stack.pick` names: rules choosing the guilty frame among all, not the first."""


_TITLE_MASKS: tuple[tuple[str, str], ...] = (
    (r"syz-executor\.?[0-9]+((/|:)[0-9]+)?", "syz-executor"),
    (r"syzkaller[0-9]+((/|:)[0-9]+)?", "syzkaller"),
    (r"([^a-zA-Z0-9])(?:0x)?[0-9a-f]{6,}", r"\1ADDR"),
    (r"([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})", "IP"),
    (r"(\.\w+)(:[0-9]+)+", r"\1:LINE"),
    (r"([a-zA-Z][a-zA-Z0-9_.]+)\+0x[0-9a-z]+/0x[0-9a-z]+", r"\1"),
    (r"CPU#[0-9]+", "CPU"),
    (r"(\W)(\d+)(\W|$)", r"\1NUM\3"),
    (r"(\d+){7,}", "NUM"),
)
"""What varies between two hits of one bug, in the order masked: executor ids,
addresses, IPs, line numbers, offsets, CPUs, then any number left (a number inside a
name, cfg80211, stays)."""

MAX_TITLE = 120


def normalise_title(title: str) -> str:
    """`title` with `_TITLE_MASKS` applied until stable, printable, spaces collapsed."""
    for mask, replacement in _TITLE_MASKS:
        compiled = re.compile(mask)
        while True:
            masked = compiled.sub(replacement, title)
            if masked == title:
                break
            title = masked
    out: list[str] = []
    previous = " "
    for ch in title[:MAX_TITLE]:
        if ch == "\t":
            ch = " "
        elif not " " <= ch <= "~":
            continue
        if ch == " " and previous == " ":
            continue
        out.append(ch)
        previous = ch
    return "".join(out).strip()
