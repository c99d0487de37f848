"""The kernel's log, read the way the kernel writes it: records, kinds, devices, titles.

One place for every rule about the kernel log, so the `linux.kmsg` backend, the reports
built from its rows and the predictors counting device errors agree on what a record
says.  Pure Python, FUSE-free and cheap to import (backends import it; see
docs/kernel-log.md).

Records.  A read(2) of /dev/kmsg returns one record
(Documentation/ABI/testing/dev-kmsg): ``PRIORITY,SEQ,TS_USEC,FLAGS[,...];MESSAGE`` where
PRIORITY is ``facility << 3 | level``, SEQ the record's 64-bit sequence number (it
restarts at boot), TS_USEC the monotonic time of the record in microseconds, FLAGS ``-``
or ``c``/``+`` (continuation), then continuation lines `` KEY=value`` (the dictionary:
``SUBSYSTEM=block``, ``DEVICE=b7:3``).  Non-printable bytes of the message arrive
escaped as ``\\xNN``.

Kinds and devices come from the formats in the kernel's own sources:
- block layer (block/blk-core.c, `blk_print_req_error`): ``<status> error, dev <disk>,
  sector <n> op 0x..:(<OP>) ...``, where <status> is a `blk_errors` name (``I/O``,
  ``critical space allocation``, ``critical medium``, ``timeout``, ...); older kernels
  prefix ``blk_update_request: `` or ``print_req_error: ``;
- buffer heads (fs/buffer.c): ``Buffer I/O error on dev <bdev>, logical block <n>, lost
  async page write`` (or ``... async page read``, ``lost sync page write``);
- file systems: ``EXT4-fs error (device <d>): <func>:<line>: ...``, ``EXT4-fs warning
  (device <d>): ext4_end_bio:<line>: I/O error <n> writing to inode ...`` (fs/ext4),
  ``XFS (<d>): metadata I/O error ...`` (fs/xfs), ``BTRFS error (device <d>): ...``;
- SCSI (``sd H:C:T:L: [sdX] ...``), NVMe (``nvme0n1: I/O Cmd(0x2) @ LBA ..., I/O Error``,
  ``nvme nvme0: I/O 7 QID 2 timeout``) and libata (``ata1.00: failed command: ...``);
- the crash reports syzbot parses (pkg/report/linux.go): ``WARNING: CPU: n PID: n at
  <file>:<line> <func>+0x../0x..``, ``BUG: unable to handle page fault``, ``BUG: kernel
  NULL pointer dereference``, ``general protection fault``, ``kernel BUG at <file>:<n>!``,
  ``BUG: KASAN: <what> in <func>``, ``Kernel panic - not syncing: ...``, ``INFO: task
  <comm>:<pid> blocked for more than <n> seconds.``, ``watchdog: BUG: soft lockup -
  CPU#n stuck for ns!``, ``rcu: INFO: rcu_preempt detected stalls``, ``Out of memory:
  Killed process``, ``<comm> invoked oom-killer``, ``<comm>[<pid>]: segfault at ...``;
- ``<func>: <n> callbacks suppressed`` (lib/ratelimit.c): messages the kernel dropped.

Signatures are titles in the spirit of syzbot's: the report's kind and where it
happened (``WARNING in ext4_foo``, ``INFO: task hung in jbd2_log_wait_commit``), with
numbers, addresses, pids and device minors masked, so one bug on a thousand machines is
one title.  A crash report spans many records (header, registers, ``Call Trace:``,
frames, ``---[ end trace <id> ]---``); `Blocks` groups them and, once the block is
complete, titles it as syzbot does by `mlfs.crash`'s table of crash formats.
"""

from __future__ import annotations

import collections
import hashlib
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from mlfs.crash import parse_log
from mlfs.kmsg import words as kernel_words

KINDS = ("io_error", "fs_error", "oops", "bug", "warning", "panic", "hung_task",
         "soft_lockup", "rcu_stall", "oom_kill", "segfault", "lost", "other")
#: syslog facility numbers (the kernel's records are 0; `user` is 1)
FACILITY_KERNEL, FACILITY_USER = 0, 1
#: the longest message kept in a row (the kernel's own limit is about 1 KiB)
MAX_MESSAGE = 2048

#: block/blk-core.c `blk_errors` names (old and new kernels)
BLOCK_STATUS = ("operation not supported", "timeout", "critical space allocation",
                "recoverable transport", "critical target", "critical nexus",
                "reservation conflict", "critical medium", "protection", "kernel resource",
                "device resource", "nonblocking retry", "device offline", "dm internal retry",
                "open zones exceeded", "active zones exceeded", "duration limit exceeded",
                "invalid", "I/O", "zone resource")


@dataclass
class Record:
    """One /dev/kmsg record."""

    seq: int
    ts_usec: int
    level: int
    facility: int
    continuation: bool
    message: str
    fields: dict[str, str] = field(default_factory=dict)


def parse_record(raw: bytes) -> Record | None:
    """One read(2) of /dev/kmsg as a Record; None when it is not in the kernel's format.

    The kernel escapes every byte below 0x20 (but tab) and from 0x7f up as ``\\xNN``; those
    are bytes of the UTF-8 the writer meant, so they are unescaped as bytes and the result
    decoded as UTF-8 (an invalid sequence stays visible as ``\\xNN``): ``é`` comes back as
    ``é``, not as the two characters of mojibake a per-byte ``chr`` made (red team K3).
    Control characters are restored too (the message is the kernel's); what prints a
    title or a report escapes them (`printable`).
    """
    head, sep, rest = raw.partition(b";")
    if not sep:
        return None
    parts = head.decode("ascii", errors="replace").split(",")
    if len(parts) < 4 or not all(p.isdigit() for p in parts[:3]):
        return None
    prio, seq, ts = int(parts[0]), int(parts[1]), int(parts[2])
    lines = rest.split(b"\n")
    message = _unescape(lines[0])[:MAX_MESSAGE]
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith(b" ") and b"=" in line:
            key, _, value = line[1:].partition(b"=")
            if len(fields) < 16:
                fields[_unescape(key)[:32]] = _unescape(value)[:256]
    return Record(seq=seq, ts_usec=ts, level=prio & 7, facility=prio >> 3,
                  continuation=parts[3] in ("c", "+"), message=message, fields=fields)


_ESCAPED = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(data: bytes) -> str:
    if b"\\x" in data:
        data = _ESCAPED.sub(lambda m: bytes((int(m.group(1), 16),)), data)
    return data.decode("utf-8", errors="backslashreplace")


#: C0 and C1 controls, DEL, and the bidirectional overrides that reorder what a terminal
#: shows (a title is printed by `mlfs reports`; a raw ESC there sets the terminal's title
#: or clears its screen: red team K2)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with control characters escaped as the kernel escapes them (``\\x1b``), as
    dmesg prints them: safe to print on a terminal."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                       else f"\\u{ord(m.group()):04x}"), text)


# ---- kinds, devices, titles -----------------------------------------------------------

_STATUS = "|".join(re.escape(s) for s in sorted(BLOCK_STATUS, key=len, reverse=True))
_BLOCK = re.compile(rf"^(?:\w+: )?(?P<status>{_STATUS}) error, dev (?P<dev>[^\s,]+), sector")
_BUFFER = re.compile(r"^Buffer I/O error on dev (?P<dev>[^\s,]+), logical block \d+, "
                     r"(?P<what>.*)$")
_FS = re.compile(r"^(?P<fs>EXT[234]-fs|BTRFS|F2FS-fs|GFS2|JBD2) ?(?P<sev>error|warning|"
                 r"critical|emerg)? ?\((?:device )?(?P<dev>[^\s():]+)\)(?::)? ?(?P<rest>.*)$")
_XFS = re.compile(r"^XFS \((?P<dev>[^\s()]+)\): (?P<rest>.*)$")
_SCSI = re.compile(r"^sd \d+:\d+:\d+:\d+: \[(?P<dev>\w+)\] (?P<rest>.*)$")
_NVME_NS = re.compile(r"^(?P<dev>nvme\d+n\d+): (?P<rest>.*I/O Error.*)$")
_NVME_CTRL = re.compile(r"^nvme (?P<dev>nvme\d+): (?P<rest>I/O \d+ QID \d+ timeout.*)$")
_ATA = re.compile(r"^(?P<port>ata\d+(?:\.\d+)?): (?P<rest>failed command|exception Emask|"
                  r"status: |error: |hard resetting link|SError:)")
_WARNING = re.compile(r"^WARNING: (?:CPU: \d+ PID: \d+ at |at )(?P<file>\S+?)(?::\d+)? "
                      r"(?P<func>[\w.]+)\+0x")
_WARNING_OTHER = re.compile(r"^WARNING: (?P<what>.+)$")
_KASAN = re.compile(r"^BUG: (?P<tool>KASAN|KCSAN|KFENCE|KMSAN|UBSAN): (?P<what>[\w\- ]+?) "
                    r"in (?P<func>[\w.]+)")
_PAGE_FAULT = re.compile(r"^BUG: (?:unable to handle (?:page fault|kernel paging request)|"
                         r"kernel NULL pointer dereference)")
_GPF = re.compile(r"^general protection fault")
_OOPS = re.compile(r"^Oops: ")
_KERNEL_BUG = re.compile(r"^kernel BUG at (?P<file>[^:\s]+):\d+!")
_BUG_OTHER = re.compile(r"^BUG: (?P<what>.+)$")
_PANIC = re.compile(r"^Kernel panic - not syncing: (?P<what>.*)$")
_HUNG = re.compile(r"^INFO: task .+:\d+ blocked for more than \d+ seconds")
_SOFT = re.compile(r"^(?:watchdog: )?BUG: soft lockup - CPU#\d+ stuck for \d+s!")
_HARD = re.compile(r"^(?:watchdog: )?Watchdog detected hard LOCKUP on cpu \d+")
_RCU = re.compile(r"^(?:rcu: )?INFO: rcu_\w+ (?:detected stalls|self-detected stall)")
_OOM = re.compile(r"^(?:Out of memory(?: and no killable processes)?:|Memory cgroup out of "
                  r"memory:|oom-kill:|.+ invoked oom-killer:|oom_reaper:)")
_SEGV = re.compile(r"^(?P<comm>.+?)\[\d+\]: segfault at ")
_TRAP = re.compile(r"^traps: (?P<comm>.+?)\[\d+\] (?P<what>general protection fault|"
                   r"trap \w+)")
_SUPPRESSED = re.compile(r"^(?P<func>[\w.]+): (?P<n>\d+) callbacks suppressed$")
_RIP = re.compile(r"^(?:RIP|pc|PC is at|IP): (?:[0-9a-f]{4}:)?\s*(?:\[<[0-9a-f]+>\] )?"
                  r"(?P<func>[\w.]+)\+0x")
_FRAME = re.compile(r"^\s*(?:\[<[0-9a-f]+>\] )?(?:\? )?(?P<func>[\w.]+)\+0x[0-9a-f]+/0x")
_END = re.compile(r"^---\[ end (?:trace|Kernel panic)")


@dataclass(frozen=True)
class Classified:
    """What one message says: its kind, the block device it is about, its title.

    `block` is True for the first record of a multi-record report (a WARNING, an Oops,
    a hung task...), whose title may be completed by later records (`Blocks`).
    """

    kind: str
    device: str | None
    signature: str
    block: bool = False
    suppressed: int = 0


def mask(text: str) -> str:
    """Numbers, addresses, pids and device minors masked: what varies between machines."""
    text = re.sub(r"\+0x[0-9a-f]+/0x[0-9a-f]+", "", text)
    text = re.sub(r"\b0x[0-9a-fA-F]+\b", "ADDR", text)
    text = re.sub(r"\b[0-9a-f]{12,16}\b", "ADDR", text)
    text = re.sub(r"\[\d+\]", "", text)
    text = re.sub(r"(tag|CPU|cpu)#\d+", r"\1#N", text)
    text = mask_device(text)
    text = re.sub(r"(?<![\w#])\d+(?:\.\d+)?(?![\w#])", "NUM", text)
    return re.sub(r"\s+", " ", text).strip()


def mask_device(text: str) -> str:
    """Device names with their numbers masked: loop3 -> loop#, sdb1 -> sd#, nvme0n1 -> nvme#n#."""
    text = re.sub(r"\b(loop|md|dm-|nbd|zram|ram|mmcblk|sr)\d+(p\d+)?\b",
                  lambda m: m.group(1) + "#", text)
    text = re.sub(r"\b(sd|vd|hd|xvd)[a-z]{1,3}\d*\b", lambda m: m.group(1) + "#", text)
    return re.sub(r"\bnvme\d+(n\d+)?(p\d+)?\b", lambda m: "nvme#" + ("n#" if m.group(1) else ""),
                  text)


def classify(message: str) -> Classified:
    """The kind, device and (provisional, for a block) title of one message."""
    m = _BLOCK.match(message)
    if m:
        dev = m.group("dev")
        return Classified("io_error", dev, f"{m.group('status')} error on {mask_device(dev)}")
    m = _BUFFER.match(message)
    if m:
        dev = m.group("dev")
        return Classified("io_error", dev,
                          f"Buffer I/O error on {mask_device(dev)}, {mask(m.group('what'))}")
    m = _FS.match(message)
    if m:
        dev, rest = m.group("dev"), m.group("rest")
        func = rest.split(":", 1)[0] if re.match(r"^[\w.]+:", rest) else None
        title = f"{m.group('fs')} {m.group('sev')}" if m.group("sev") else m.group("fs")
        if "I/O error" in rest:
            return Classified("io_error", dev, f"{title}: I/O error on {mask_device(dev)}"
                              + (f" in {func}" if func else ""))
        if m.group("sev") in ("error", "critical", "emerg"):
            return Classified("fs_error", dev, f"{title} in {func}" if func
                              else f"{title}: {mask(rest)[:80]}")
        return Classified("other", dev, f"{title}: {mask(rest)[:80]}")
    m = _XFS.match(message)
    if m:
        dev, rest = m.group("dev"), m.group("rest")
        if "I/O error" in rest:
            return Classified("io_error", dev, "XFS: " + mask(rest)[:80])
        if re.search(r"Corruption|Internal error|corrupt|Shutting down", rest):
            return Classified("fs_error", dev, "XFS: " + mask(rest)[:80])
        return Classified("other", dev, "XFS: " + mask(rest)[:80])
    for pattern in (_SCSI, _NVME_NS, _NVME_CTRL):
        m = pattern.match(message)
        if m and re.search(r"FAILED|error|Error|timeout|Sense Key|Medium Error", m.group("rest")):
            dev = m.group("dev")
            return Classified("io_error", dev, f"{mask(m.group('rest'))[:80]} on "
                              f"{mask_device(dev)}")
    m = _ATA.match(message)
    if m:
        return Classified("io_error", None, f"ata: {m.group('rest')}")
    m = _SUPPRESSED.match(message)
    if m:
        return Classified("other", None, f"callbacks suppressed in {m.group('func')}",
                          suppressed=int(m.group("n")))
    m = _WARNING.match(message)
    if m:
        return Classified("warning", None, f"WARNING in {m.group('func')}", block=True)
    m = _KASAN.match(message)
    if m:
        return Classified("bug", None, f"{m.group('tool')}: {m.group('what')} in "
                          f"{m.group('func')}", block=True)
    if _SOFT.match(message):
        return Classified("soft_lockup", None, "BUG: soft lockup", block=True)
    if _HARD.match(message):
        return Classified("soft_lockup", None, "BUG: hard lockup", block=True)
    if _PAGE_FAULT.match(message):
        title = ("BUG: kernel NULL pointer dereference" if "NULL pointer" in message
                 else "BUG: unable to handle kernel paging request")
        return Classified("oops", None, title, block=True)
    if _GPF.match(message):
        return Classified("oops", None, "general protection fault", block=True)
    if _OOPS.match(message):
        return Classified("oops", None, "Oops", block=True)
    m = _KERNEL_BUG.match(message)
    if m:
        return Classified("bug", None, f"kernel BUG at {m.group('file')}", block=True)
    m = _PANIC.match(message)
    if m:
        return Classified("panic", None, "Kernel panic - not syncing: "
                          + mask(m.group("what"))[:80])
    if _HUNG.match(message):
        return Classified("hung_task", None, "INFO: task hung", block=True)
    if _RCU.match(message):
        return Classified("rcu_stall", None, "INFO: rcu detected stall", block=True)
    if _OOM.match(message):
        return Classified("oom_kill", None, "oom-kill")
    m = _SEGV.match(message)
    if m:
        return Classified("segfault", None, f"segfault in {m.group('comm')[:32]}")
    m = _TRAP.match(message)
    if m:
        return Classified("segfault", None, f"{m.group('what')} in {m.group('comm')[:32]}")
    m = _BUG_OTHER.match(message)
    if m:
        return Classified("bug", None, "BUG: " + mask(m.group("what"))[:80], block=True)
    m = _WARNING_OTHER.match(message)
    if m:
        return Classified("warning", None, "WARNING: " + mask(m.group("what"))[:80], block=True)
    return Classified("other", None, mask(message)[:120])


def complete_title(title: str, kind: str, lines: list[str]) -> str:
    """A block's title as syzbot gives it (`mlfs.crash`), or its provisional one.

    The block's records are a report's lines without console prefixes.  A block the
    crash table has no format for keeps `title`, and so does one cut before its stack
    (syzbot's "... in corrupted"): a header alone still says what its own line says.
    """
    report = parse_log("\n".join(lines))
    if report is None or report.title.endswith(" in corrupted"):
        return title
    return report.title


def guilty_file(lines: list[str]) -> str:
    """The source file to blame for a block (syzkaller's `guilty` rule, `mlfs.crash`), or
    "" where the block names none: what a maintainer routes the report by."""
    report = parse_log("\n".join(lines))
    return (report.guilty_file or "") if report is not None else ""


def signature_id(kind: str, signature: str) -> str:
    """The report's file name: `<kind>-<first 12 hex of sha256(signature)>`."""
    return f"{kind}-{hashlib.sha256(signature.encode()).hexdigest()[:12]}"


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


# ---- what ships beyond the host -------------------------------------------------------
#
# An allow-list, not a deny-list (red team K14: the deny-list shipped `Comm: alicejob`,
# `UID: 1000 PID: 4242`, audit paths, IP and MAC addresses, SSIDs, USB serial numbers, NFS
# server names, memcg paths with uids...).  First the places where the kernel's formats put
# something of a user become typed placeholders (COMM, PID, UID, IP, MAC, PATH, SERIAL,
# HOST, NAME); then every remaining word ships only if it is a word of the kernel's own
# messages (`mlfs.kmsg.words`), a kernel symbol (a frame, a snake_case identifier), a
# kernel source path, a block device or a placeholder; any other word becomes WORD.

PLACEHOLDERS = frozenset({"COMM", "PID", "UID", "IP", "MAC", "PATH", "SERIAL", "HOST",
                          "NAME", "WORD", "ADDR", "NUM"})
_IN_CONTEXT: list[tuple[re.Pattern[str], str]] = [
    # a quoted value after a key of audit/AppArmor/SELinux: name="/srv/x" comm="job"
    (re.compile(r'\b(name|exe|path|cwd|root|dev|profile|scontext|tcontext|comm|cmd|'
                r'proctitle|subj|laddr|faddr|saddr|daddr|src|dst|hostname|addr)="[^"]*"'),
     "QUOTED"),
    (re.compile(r"\b(?:[0-9a-fA-F]{2}[:-]){5}[0-9a-fA-F]{2}\b"), "MAC"),
    (re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?(?![\w.])"), "IP"),
    # IPv6 (two colons at least; a PCI address 0000:00:19.0 is not one)
    # (NUM: a title the host already masked with `mask`)
    (re.compile(r"(?<![\w:.])(?:[0-9a-fA-F]|NUM){0,8}(?::(?:[0-9a-fA-F]|NUM){0,8}){2,7}"
                r"(?![\w:.])"), "IP"),
]
_COMM_PATTERNS = [
    # `CPU: 0 UID: 1000 PID: 4242 Comm: alicejob Tainted: ...` (show_regs, dump_stack)
    re.compile(r"(?P<k>\bComm: )(?P<v>.+?)(?= (?:Not tainted|Tainted:)|$)"),
    re.compile(r"(?P<k>\b(?:comm|task)[=: ]\"?)(?P<v>[^\",\s]+)"),
    re.compile(r"(?P<k>\bcomm )(?P<v>[^:\s]+)(?=:)"),                     # ext4: comm X:
    re.compile(r"(?P<k>^(?:traps: )?)(?P<v>\S.*?)(?=\[\d+\][: ])"),      # X[4242]: segfault
    re.compile(r"(?P<k>\bKilled process PID \()(?P<v>[^)]*)(?=\))"),
    re.compile(r"(?P<k>^)(?P<v>.+?)(?= invoked oom-killer)"),
    re.compile(r"(?P<k>\btask )(?P<v>.+?)(?=:\d+ blocked)"),
    re.compile(r"(?P<k>\[)(?P<v>[^\]\s:]+)(?=:\d+\]$)"),                 # [comm:4242]
    re.compile(r"(?P<k>\bin )(?P<v>[^\s\[]+)(?=\[[0-9a-fA-F]+\+)"),     # error 4 in X[7f..+
    re.compile(r"(?P<k>(?:segfault|fault|trap \w+) in )(?P<v>.+)$"),    # a title
    # the OOM killer's task table: [  pid  ]   uid  tgid total_vm rss ... name
    re.compile(r"(?P<k>^\[\s*\d+\]\s+\d+\s+\d+(?:\s+-?\d+){3,7}\s+)(?P<v>\S.*)$"),
]
_ID_PATTERNS = [
    (re.compile(r"(?P<k>\bKilled process )\d+"), "PID"),
    (re.compile(r"(?P<k>(?:COMM|^\S+)\[)\d+(?=\])"), "PID"),
    (re.compile(r"(?P<k>\[COMM:)\d+(?=\]$)"), "PID"),
    (re.compile(r"(?P<k>^\[)\s*\d+\]\s+\d+\s+\d+(?=\s)"), "PID] UID PID"),
    (re.compile(r"\b(?P<k>(?:[ap]?pid|tgid|ppid|sid|PID|TGID|pgid)[=:] ?)\d+"), "PID"),
    (re.compile(r"\b(?P<k>(?:[aefos]?uid|fsuid|[efos]?gid|fsgid|ouid|ogid|UID|GID)"
                r"[=:] ?)\d+"), "UID"),
    (re.compile(r"(?P<k>\buser-)\d+(?=\.slice)"), "UID"),
    (re.compile(r"(?P<k>\bSerialNumber: ?).*$"), "SERIAL"),
    (re.compile(r"(?P<k>\b(?:Product|Manufacturer|SSID|ssid|bssid|BSSID|label)[=:] ?)"
                r"(?:'[^']*'|\"[^\"]*\"|.*?)(?=,|$)"), "NAME"),
    (re.compile(r"(?P<k>\bserver )\S+"), "HOST"),
]
_PATH = re.compile(r"(?<![\w.])(?:/[^\s,;:'\"()\[\]]*)+")
#: kernel source trees: `mm/slub.c`, `fs/ext4/inode.c:123` ship as they are
_KERNEL_PATH = re.compile(r"^(?:arch|block|certs|crypto|drivers|fs|include|init|io_uring|"
                          r"ipc|kernel|lib|mm|net|rust|samples|security|sound|virt)/"
                          r"[\w/.+-]+$")
_DEVICE = re.compile(r"^(?:(?:sd|vd|hd|xvd)[a-z]{1,3}\d*|nvme\d+(?:n\d+)?(?:p\d+)?|"
                     r"loop\d+|dm-\d+|md\d+|nbd\d+|zram\d+|mmcblk\d+(?:p\d+)?|sr\d+|"
                     r"ata\d+(?:\.\d+)?|sd#|loop#|nvme#(?:n#)?)$")
_SYMBOL = re.compile(r"^[A-Za-z_][\w.]*\+0x[0-9a-f]+(?:/0x[0-9a-f]+)?$")
_SNAKE = re.compile(r"^_*[a-z][a-z0-9]*(?:_+[a-z0-9]+)+(?:\.(?:isra|constprop|part|cold|"
                    r"llvm)(?:\.\d+)?)*$")
#: a title of the kernel's own kinds ends with the kernel function it names
_KERNEL_TITLE = re.compile(r"^(?P<head>(?:WARNING|BUG|KASAN|KMSAN|KCSAN|KFENCE|UBSAN|INFO|"
                           r"general protection fault|kernel BUG|Oops)\b.* in )"
                           r"(?P<func>[A-Za-z_][\w.]*)$")
_UPPER_SNAKE = re.compile(r"^_*[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
#: network interfaces, Bluetooth and USB ports, kernel releases: the machine's, not a user's
_MACHINE = re.compile(r"^(?:(?:eth|wlan|wlp\w*|enp\w*|eno|ens|lo|br|bond|veth|virbr|tun|"
                      r"tap|hci|can|ib)\d*|\d+-\d+(?:\.\d+)*|\d+\.\d+[\w.+~-]*)$")
_HOSTLIKE = re.compile(r"^[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+$")
_WORDISH = re.compile(r"[^\s=,;:()\[\]{}<>\"'|]+")
_NUMBER = re.compile(r"^(?:0x)?[0-9a-fA-F]+$|^[+-]?\d+(?:\.\d+)?[a-zA-Z%]{0,3}$|^#\d+$")


def _word(m: re.Match[str]) -> str:
    token = m.group()
    core = token.strip(".!?-'`")
    if not core:
        return token
    if core in PLACEHOLDERS or _NUMBER.match(core):
        if re.fullmatch(r"(?:0x)?[0-9a-fA-F]{12,}", core):
            return token.replace(core, "ADDR")
        return token
    if len(core) == 1 or core.lower() in kernel_words.WORDS or _SNAKE.match(core) or \
            _SYMBOL.match(core) or _DEVICE.match(core) or _KERNEL_PATH.match(core) or \
            _UPPER_SNAKE.match(core) or _MACHINE.match(core):
        return token
    if all(part.lower() in kernel_words.WORDS or part in PLACEHOLDERS or
           _NUMBER.match(part) or _DEVICE.match(part)
           or len(part) == 1 for part in re.split(r"[-/+.#]", core) if part):
        return token  # total-vm, EXT4-fs, 0010:..., nvme0n1p1/...
    if _HOSTLIKE.match(core) and re.search(r"[A-Za-z]", core):
        return token.replace(core, "HOST")
    return token.replace(core, "WORD")


def private_masked(text: str) -> str:
    """`text` as it may leave the host: its skeleton in the kernel's own words, with every
    other word replaced by a typed placeholder (COMM, PID, UID, IP, MAC, PATH, SERIAL,
    HOST, NAME, WORD).  Applied to every message, title and device that leaves the host
    (the fleet store); the host itself keeps the record as the kernel wrote it (readable
    by root and the group only).  An allow-list: a word nobody thought of is not shipped.
    """
    text = printable(text)
    for pattern, kind in _IN_CONTEXT:
        if kind == "QUOTED":
            text = pattern.sub(lambda m: m.group(1) + '="' + (
                "COMM" if m.group(1) in ("comm", "cmd", "proctitle") else
                "IP" if m.group(1) in ("laddr", "faddr", "saddr", "daddr", "src", "dst",
                                      "addr") else
                "HOST" if m.group(1) == "hostname" else
                "NAME" if m.group(1) in ("profile", "subj", "scontext", "tcontext") else
                "PATH") + '"', text)
        else:
            text = pattern.sub(kind, text)
    text = _ID_PATTERNS[0][0].sub(r"\g<k>PID", text)  # before `Killed process PID (COMM)`
    for pattern in _COMM_PATTERNS:
        text = pattern.sub(lambda m: m.group("k") + "COMM", text)
    for pattern, kind in _ID_PATTERNS[1:]:
        text = pattern.sub(lambda m, kind=kind: m.group("k") + kind, text)
    text = _PATH.sub("PATH", text)  # absolute: a user's file (kernel sources are relative)
    m = _KERNEL_TITLE.match(text)  # `KASAN: ... in memcmp`: the function is the kernel's
    if m:
        return _WORDISH.sub(_word, m.group("head")) + m.group("func")
    return _WORDISH.sub(_word, text)


# ---- similarity: the same bug under titles that differ only in noise -----------------------

#: cosine similarity at or above which a new signature joins a known report of its kind.
#: With syzkaller-exact titles the signature does most of the work: on syzkaller's corpus
#: (tests/bench/kmsg_dedup.py) signature or >= 0.6 merged different bugs (precision 0.83),
#: >= 0.8 gives precision 0.94, recall 0.97 (F1 0.95) on same-title pairs and still joins a
#: title that differs only by a compiler suffix (`.cold`, tests/unit/test_kernel_log.py)
DUPLICATE_SIMILARITY = 0.8
#: lines of a report's block that go into its text for similarity
SIMILARITY_LINES = 40
#: hashed feature columns (the hashing trick: no vocabulary to grow or refit)
SIMILARITY_FEATURES = 1 << 16
#: tokens of one text kept (a title and `SIMILARITY_LINES` frames fit)
SIMILARITY_TOKENS = 64
_CONSOLE_PREFIX = re.compile(r"^\[\s*\d+\.\d+\]\s*(?:\[\s*[CT]\d+\]\s*)?")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]+")


def similarity_text(title: str, lines: list[str]) -> str:
    """What two reports are compared on: the title and the functions of the first block,
    masked (addresses, numbers, offsets, device minors) and without console prefixes."""
    words = [title]
    for line in lines[:SIMILARITY_LINES]:
        line = _CONSOLE_PREFIX.sub("", line)
        frame = _FRAME.match(line) or _RIP.match(line.strip())
        if frame:
            words.append(frame.group("func"))
    return mask(" ".join(words))


def hashed_terms(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(feature columns, sublinear term frequencies) of `text`: identifiers hashed (crc32,
    stable across runs and hosts) into `SIMILARITY_FEATURES` columns."""
    counts: dict[int, int] = {}
    for token in _TOKEN.findall(text)[:SIMILARITY_TOKENS]:
        column = zlib.crc32(token.encode()) & (SIMILARITY_FEATURES - 1)
        counts[column] = counts.get(column, 0) + 1
    columns = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    tf = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
    return columns, tf


class Similarity:
    """TF-IDF over the reports kept of one kind, by the hashing trick: which known report a
    new one repeats, at a cost bounded by the reports kept, never by the reports seen.

    The inverse document frequencies are those of the reports kept now (document
    frequencies are counted as reports come and go), so words every report has (`Call`,
    `Trace`) weigh little and the functions that tell bugs apart weigh much.  Why not
    scikit-learn's TfidfVectorizer: it had to be refit on every kept text for each new
    signature, so a storm of 3,000 distinct titles held the GIL for 22 s against the
    trio thread and the kill switch (red team K11).  Here a new text costs one pass over
    a fixed-size array of the kept reports' terms (`capacity` × `SIMILARITY_TOKENS`).
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self.df = np.zeros(SIMILARITY_FEATURES, dtype=np.float64)
        self._columns = np.zeros((0, SIMILARITY_TOKENS), dtype=np.int32)
        self._tf = np.zeros((0, SIMILARITY_TOKENS), dtype=np.float32)
        self._slot: dict[str, int] = {}
        self._ids: list[str | None] = []
        self._free: list[int] = []
        #: the most terms any text added so far has (columns past it are all empty)
        self._width = 1

    def __len__(self) -> int:
        return len(self._slot)

    def add(self, rid: str, text: str) -> None:
        if rid in self._slot:
            return
        if not self._free and len(self._ids) >= self.capacity:
            return  # the caller evicts first; a full index never grows
        columns, tf = hashed_terms(text)
        if not self._free:  # grow by doubling up to `capacity`
            old = len(self._ids)
            size = min(self.capacity, max(16, old * 2))
            self._columns = np.resize(self._columns, (size, SIMILARITY_TOKENS))
            self._tf = np.resize(self._tf, (size, SIMILARITY_TOKENS))
            self._tf[old:] = 0.0
            self._ids.extend([None] * (size - old))
            self._free.extend(range(size - 1, old - 1, -1))
        slot = self._free.pop()
        self._columns[slot] = 0
        self._tf[slot] = 0.0
        self._columns[slot, :len(columns)] = columns
        self._tf[slot, :len(tf)] = tf
        self.df[columns] += 1.0
        self._width = max(self._width, len(columns))
        self._slot[rid] = slot
        self._ids[slot] = rid

    def remove(self, rid: str) -> None:
        slot = self._slot.pop(rid, None)
        if slot is None:
            return
        used = self._tf[slot] > 0
        self.df[self._columns[slot][used]] -= 1.0
        self._tf[slot] = 0.0
        self._ids[slot] = None
        self._free.append(slot)

    def nearest(self, text: str) -> tuple[str | None, float]:
        """(id of the most similar known report, cosine similarity); (None, 0.0) if none.

        The frequencies count the new text too (as a fit on the known texts and the new
        one would), so a word only the new one has weighs as much as a rare word."""
        if not self._slot:
            return None, 0.0
        columns, tf = hashed_terms(text)
        if not len(columns):
            return None, 0.0
        n = len(self._slot) + 1
        query = np.zeros(SIMILARITY_FEATURES, dtype=np.float64)
        q_idf = np.log((1.0 + n) / (2.0 + self.df[columns])) + 1.0
        q = tf * q_idf
        q /= np.linalg.norm(q)
        query[columns] = q
        rows = self._columns[:len(self._ids), :self._width]
        in_query = (query[rows] != 0.0)
        idf = np.log((1.0 + n) / (1.0 + self.df[rows] + in_query)) + 1.0
        weights = self._tf[:len(self._ids), :self._width] * idf
        norms = np.sqrt((weights * weights).sum(axis=1))
        norms[norms == 0.0] = 1.0
        scores = (weights * query[rows]).sum(axis=1) / norms
        best = int(scores.argmax())
        if self._ids[best] is None:
            return None, 0.0
        return self._ids[best], float(scores[best])


# ---- reports: one per signature -------------------------------------------------------

#: reports of what the kernel wrote about itself: its own failures, which no user can
#: cause at will
KERNEL_KINDS = frozenset({"io_error", "fs_error", "oops", "bug", "warning", "panic",
                          "hung_task", "soft_lockup", "rcu_stall"})
#: reports any user can trigger at will (a process renaming itself and dereferencing
#: NULL every 0.2 s filled every slot in four minutes: red team K12)
USER_KINDS = frozenset({"segfault", "oom_kill"})
#: reports kept per class: a class full gives way within itself (its least recent
#: report goes, counted in `Reports.evicted`), never at the other's expense
BUDGETS = {"kernel": 384, "user": 128}
#: distinct reports kept per host
MAX_REPORTS = sum(BUDGETS.values())
#: signatures remembered as repeats of a kept report (each a short string pair)
MAX_ALIASES = 4 * MAX_REPORTS
#: lines of a report's first block kept
MAX_BLOCK_LINES = 200
#: a repeat of a known report is announced at most once per this many seconds
REPEAT_EVENT_SECONDS = 300.0
#: kinds that make a report (a line of `other` does not)
REPORTED_KINDS = frozenset(KINDS) - {"other", "lost"}


def report_class(kind: str, origin: str = "kernel") -> str:
    """The budget a report draws on: "kernel" for the kernel's own failures written by the
    kernel (facility 0), "user" for kinds users trigger and for whatever user space wrote
    into /dev/kmsg (the kernel gives such records facility `user`)."""
    return "kernel" if kind in KERNEL_KINDS and origin == "kernel" else "user"


@dataclass
class Report:
    """One signature: how often and when it was seen, and its first occurrence whole.

    `first_seen` and `last_seen` are the records' own times (wall clock, seconds), not
    the times mlfs read them."""

    id: str
    kind: str
    title: str
    count: int
    first_seen: float
    last_seen: float
    release: str
    host: str
    block: list[str]
    announced: float = 0.0
    budget: str = "kernel"
    #: the source file to blame (`guilty_file`), "" when the block names none
    guilty_file: str = ""

    def as_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "title": self.title, "count": self.count,
                "first_seen": self.first_seen, "last_seen": self.last_seen,
                "release": self.release, "host": self.host, "block": list(self.block),
                "budget": self.budget, "guilty_file": self.guilty_file}

    def text(self) -> str:
        """The report file: a header of `key: value` lines, a blank line, the block.

        Control characters are escaped (`printable`): `cat` of a report must not drive
        the reader's terminal."""
        import time as _time

        def when(t: float) -> str:
            return _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(t))

        head = [f"title: {printable(self.title)}", f"kind: {self.kind}",
                f"count: {self.count}", f"first_seen: {when(self.first_seen)}",
                f"last_seen: {when(self.last_seen)}", f"release: {self.release}",
                f"host: {printable(self.host)}"]
        if self.guilty_file:
            head.append(f"guilty_file: {printable(self.guilty_file)}")
        return "\n".join(head) + "\n\n" + "\n".join(printable(line) for line in self.block) \
            + "\n"

    @classmethod
    def from_text(cls, rid: str, text: str) -> Report:
        """The report a report file (`text()`) holds: the one reading of the one format,
        kept beside its writer (`mlfs reports` reads the mount's files through it)."""
        import calendar
        import time as _time

        head, _, block = text.partition("\n\n")
        fields = dict(line.partition(": ")[::2] for line in head.splitlines())

        def when(value: str) -> float:
            return float(calendar.timegm(_time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))

        count = fields.get("count", "0")
        return cls(rid, fields.get("kind", ""), fields.get("title", ""),
                   int(count) if count.isdigit() else 0, when(fields["first_seen"]),
                   when(fields["last_seen"]), fields.get("release", ""),
                   fields.get("host", ""), block.splitlines(),
                   guilty_file=fields.get("guilty_file", ""))


class Reports:
    """Reports by signature, bounded per class (`BUDGETS`): a new report in a full class
    evicts that class's least recently seen report (counted in `evicted`).

    The host's rule and the fleet's are this one class: `mlfs fleet reports` feeds every
    host's shipped occurrences through `seen` (with budgets for a fleet), so a bug is one
    report on a host and one line on the dashboard by the same signature and similarity."""

    def __init__(self, release: str, host: str, budgets: dict[str, int] | None = None) -> None:
        self.release = release
        self.host = host
        self.budgets = dict(BUDGETS if budgets is None else budgets)
        self.by_id: dict[str, Report] = {}
        #: per class, report ids from least to most recently seen
        self._recent: dict[str, collections.OrderedDict[str, None]] = {
            name: collections.OrderedDict() for name in BUDGETS}
        #: per class, reports that gave way to a newer one
        self.evicted: dict[str, int] = dict.fromkeys(BUDGETS, 0)
        self.similar: dict[str, Similarity] = {}  # per kind
        #: signature id -> the report it was found to repeat (bounded: `MAX_ALIASES`)
        self.aliases: collections.OrderedDict[str, str] = collections.OrderedDict()
        #: the last new-or-duplicate decision: (similarity, the report it is nearest to)
        self.last_similarity: tuple[float, str | None] = (0.0, None)

    @property
    def overflow(self) -> int:
        """Reports evicted so far, all classes."""
        return sum(self.evicted.values())

    def _similarity(self, kind: str) -> Similarity:
        similar = self.similar.get(kind)
        if similar is None:  # both classes may hold a kind (root writing a WARNING)
            similar = self.similar[kind] = Similarity(sum(self.budgets.values()))
        return similar

    def _touch(self, report: Report, when: float) -> None:
        report.count += 1
        report.first_seen = min(report.first_seen, when)
        report.last_seen = max(report.last_seen, when)
        self._recent[report.budget].move_to_end(report.id)

    def _evict(self, budget: str) -> None:
        rid, _ = self._recent[budget].popitem(last=False)
        report = self.by_id.pop(rid)
        self._similarity(report.kind).remove(rid)
        self.evicted[budget] += 1

    def _keep(self, report: Report, text: str) -> None:
        recent = self._recent[report.budget]
        while len(recent) >= self.budgets[report.budget]:
            self._evict(report.budget)
        self.by_id[report.id] = report
        recent[report.id] = None
        similar = self._similarity(report.kind)
        similar.add(report.id, text)

    def seen(self, kind: str, title: str, block: list[str], when: float,
             origin: str = "kernel") -> tuple[Report | None, str]:
        """Count one occurrence at `when` (the record's own time); returns (report,
        status): "new", "duplicate" (a new signature the learned similarity puts in a
        known report), "repeat" (rate-limited) or "quiet".  `origin` is "kernel" for a
        record the kernel wrote (facility 0), "user" for one user space wrote."""
        if kind not in REPORTED_KINDS:
            return None, "quiet"
        title = printable(title)
        rid = signature_id(kind, title)
        target = self.aliases.get(rid)
        if target is not None:
            if target in self.by_id:
                self.aliases.move_to_end(rid)
                rid = target
            else:  # its report gave way: the signature starts afresh
                del self.aliases[rid]
        report = self.by_id.get(rid)
        if report is None:
            similar = self._similarity(kind)
            text = similarity_text(title, block)
            nearest, score = similar.nearest(text)
            self.last_similarity = (score, nearest)
            if nearest is not None and score >= DUPLICATE_SIMILARITY:
                self.aliases[rid] = nearest
                if len(self.aliases) > MAX_ALIASES:
                    self.aliases.popitem(last=False)
                report = self.by_id[nearest]
                self._touch(report, when)
                return report, "duplicate"
            report = Report(rid, kind, title, 1, when, when, self.release, self.host,
                            list(block[:MAX_BLOCK_LINES]), announced=when,
                            budget=report_class(kind, origin), guilty_file=guilty_file(block))
            self._keep(report, text)
            return report, "new"
        self._touch(report, when)
        if when - report.announced >= REPEAT_EVENT_SECONDS:
            report.announced = when
            return report, "repeat"
        return report, "quiet"

    def to_json(self) -> list[dict]:
        return [r.as_dict() | {"announced": r.announced} for r in self.by_id.values()]

    def load(self, items: object) -> None:
        """Reports saved by `to_json`; entries that do not fit are skipped, and each class
        keeps its budget's most recent ones."""
        if not isinstance(items, list):
            return
        loaded = []
        for item in items[:4 * MAX_REPORTS]:
            try:
                report = Report(str(item["id"]), str(item["kind"]), printable(str(item["title"])),
                                int(item["count"]), float(item["first_seen"]),
                                float(item["last_seen"]), str(item["release"]),
                                str(item["host"]), [str(x) for x in item["block"]][
                                    :MAX_BLOCK_LINES],
                                float(item.get("announced", 0.0)))
                budget = str(item.get("budget", report_class(report.kind)))
                report.guilty_file = printable(str(item.get("guilty_file", "")))[:256]
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            report.budget = budget if budget in BUDGETS else report_class(report.kind)
            if report.kind in REPORTED_KINDS and report.id == signature_id(report.kind,
                                                                         report.title):
                loaded.append(report)
        for report in sorted(loaded, key=lambda r: r.last_seen):
            if report.id not in self.by_id:
                self._keep(report, similarity_text(report.title, report.block))
