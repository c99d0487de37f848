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

import hashlib
import re
from dataclasses import dataclass, field

from mlfs.crash import parse_log

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
    """One read(2) of /dev/kmsg as a Record; None when it is not in the kernel's format."""
    text = raw.decode("utf-8", errors="replace")
    head, sep, rest = text.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 4 or not all(p.isdigit() for p in parts[:3]):
        return None
    prio, seq, ts = int(parts[0]), int(parts[1]), int(parts[2])
    lines = rest.split("\n")
    message = _unescape(lines[0])[:MAX_MESSAGE]
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith(" ") and "=" in line:
            key, _, value = line[1:].partition("=")
            if len(fields) < 16:
                fields[key[:32]] = _unescape(value)[:256]
    return Record(seq=seq, ts_usec=ts, level=prio & 7, facility=prio >> 3,
                  continuation=parts[3] in ("c", "+"), message=message, fields=fields)


def _unescape(text: str) -> str:
    if "\\x" not in text:
        return text
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


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


def signature_id(kind: str, signature: str) -> str:
    """The report's file name: `<kind>-<first 12 hex of sha256(signature)>`."""
    return f"{kind}-{hashlib.sha256(signature.encode()).hexdigest()[:12]}"


@dataclass
class Block:
    """A multi-record report being read: its first record's seq, kind, title and lines."""

    first_seq: int
    kind: str
    title: str
    lines: list[str]
    ended: bool = False


class Blocks:
    """Groups the records of multi-record reports; knows when one ends.

    A block starts at a header record (`Classified.block`) and ends at the kernel's
    ``---[ end trace ... ]---`` marker, at the next header, after `MAX_LINES` records, or
    when `idle` is called with nothing new (a hung-task report has no end marker).
    """

    MAX_LINES = 200

    def __init__(self) -> None:
        self.open: Block | None = None

    def feed(self, seq: int, message: str, classified: Classified
             ) -> tuple[int | None, Block | None]:
        """(block of this record or None, a block that ended with it or before it)."""
        ended = None
        # "Oops: 0000 [#1] SMP" follows the BUG: line that opened the same report
        continues = classified.signature == "Oops" and self.open is not None
        if classified.block and not continues:
            ended = self._close()
            self.open = Block(seq, classified.kind, classified.signature, [message])
            return seq, ended
        current = self.open
        if current is None:
            return None, None
        if classified.kind not in ("other", "panic") and not continues and \
                classified.suppressed == 0:
            return None, self._close()  # an unrelated report ends the block
        current.lines.append(message)
        if _END.match(message.strip()) or len(current.lines) >= self.MAX_LINES:
            return current.first_seq, self._close()
        return current.first_seq, None

    def idle(self) -> Block | None:
        """Nothing arrived for a while: an open block is complete."""
        return self._close()

    def _close(self) -> Block | None:
        block, self.open = self.open, None
        if block is not None:
            block.title = complete_title(block.title, block.kind, block.lines)
            block.ended = True
        return block


# ---- what ships beyond the host -------------------------------------------------------

_HOME = re.compile(r"/home/[^\s/]+")
_COMM_IN = re.compile(r"(segfault in |fault in |trap \w+ in )(.+)$")


def private_masked(text: str) -> str:
    """`text` without what identifies users: command names, paths under /home, addresses.

    Applied to every message and title that leaves the host (the fleet store); the host
    itself keeps the record as the kernel wrote it (readable by root and the group only).
    """
    text = _HOME.sub("/home/USER", text)
    text = re.sub(r"\b0x[0-9a-fA-F]{6,}\b|\b[0-9a-f]{12,16}\b", "ADDR", text)
    text = re.sub(r"^(?P<comm>.+?)\[\d+\]: segfault", "COMM: segfault", text)
    text = re.sub(r"task (.+?):\d+ blocked", "task COMM blocked", text)
    text = re.sub(r"Killed process \d+ \((.+?)\)", "Killed process PID (COMM)", text)
    text = re.sub(r"^(.+?) invoked oom-killer", "COMM invoked oom-killer", text)
    text = re.sub(r"\[(\S+?):\d+\]$", "[COMM]", text)
    return _COMM_IN.sub(lambda m: m.group(1) + "COMM", text)


# ---- similarity: the same bug under titles that differ only in noise -----------------------

#: cosine similarity at or above which a new signature joins a known report of its kind
DUPLICATE_SIMILARITY = 0.6
#: lines of a report's block that go into its text for similarity
SIMILARITY_LINES = 40
_CONSOLE_PREFIX = re.compile(r"^\[\s*\d+\.\d+\]\s*(?:\[\s*[CT]\d+\]\s*)?")


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


class Similarity:
    """TF-IDF (scikit-learn) over report texts: which known report a new one repeats.

    The vocabulary and its inverse document frequencies are learned from the reports
    kept so far (refit when a report is added: at most `MAX_REPORTS` texts), so words
    every report has (`Call`, `Trace`) weigh little and the functions that tell bugs
    apart weigh much.  Word tokens are identifiers (a function's name is one token).
    """

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.ids: list[str] = []

    def add(self, rid: str, text: str) -> None:
        self.texts.append(text)
        self.ids.append(rid)

    def nearest(self, text: str) -> tuple[str | None, float]:
        """(id of the most similar known report, cosine similarity); (None, 0.0) if none.

        Fitted on the known texts and the new one together, so a word only the new one
        has counts (a vocabulary without it would see just the words they share).
        """
        if not self.texts:
            return None, 0.0
        from sklearn.feature_extraction.text import TfidfVectorizer

        vectorizer = TfidfVectorizer(token_pattern=r"[A-Za-z_][A-Za-z0-9_.]+",
                                     lowercase=False, sublinear_tf=True)
        matrix = vectorizer.fit_transform([*self.texts, text])
        scores = (matrix[:-1] @ matrix[-1].T).toarray().ravel()
        best = int(scores.argmax())
        return self.ids[best], float(scores[best])


# ---- reports: one per signature -------------------------------------------------------

#: distinct reports kept per host; beyond it new signatures are only counted
MAX_REPORTS = 512
#: lines of a report's first block kept
MAX_BLOCK_LINES = 200
#: a repeat of a known report is announced at most once per this many seconds
REPEAT_EVENT_SECONDS = 300.0
#: kinds that make a report (a line of `other` does not)
REPORTED_KINDS = frozenset(KINDS) - {"other", "lost"}


@dataclass
class Report:
    """One signature: how often and when it was seen, and its first occurrence whole."""

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

    def as_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "title": self.title, "count": self.count,
                "first_seen": self.first_seen, "last_seen": self.last_seen,
                "release": self.release, "host": self.host, "block": list(self.block)}

    def text(self) -> str:
        """The report file: a header of `key: value` lines, a blank line, the block."""
        import time as _time

        def when(t: float) -> str:
            return _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(t))

        head = [f"title: {self.title}", f"kind: {self.kind}", f"count: {self.count}",
                f"first_seen: {when(self.first_seen)}", f"last_seen: {when(self.last_seen)}",
                f"release: {self.release}", f"host: {self.host}"]
        return "\n".join(head) + "\n\n" + "\n".join(self.block) + "\n"


class Reports:
    """Reports by signature, bounded: `MAX_REPORTS` kept, the rest counted (`overflow`)."""

    def __init__(self, release: str, host: str) -> None:
        self.release = release
        self.host = host
        self.by_id: dict[str, Report] = {}
        self.overflow = 0
        self.similar: dict[str, Similarity] = {}  # per kind
        #: signature id -> the report it was found to repeat (learned similarity)
        self.aliases: dict[str, str] = {}
        #: the last new-or-duplicate decision: (similarity, the report it is nearest to)
        self.last_similarity: tuple[float, str | None] = (0.0, None)

    def seen(self, kind: str, title: str, block: list[str], when: float
             ) -> tuple[Report | None, str]:
        """Count one occurrence; returns (report, status): "new", "duplicate" (a new
        signature the learned similarity puts in a known report), "repeat"
        (rate-limited), "quiet" or "dropped" (over `MAX_REPORTS`)."""
        if kind not in REPORTED_KINDS:
            return None, "quiet"
        rid = signature_id(kind, title)
        rid = self.aliases.get(rid, rid)
        report = self.by_id.get(rid)
        if report is None:
            if len(self.by_id) >= MAX_REPORTS:  # full: counted, not even compared
                self.overflow += 1
                return None, "dropped"
            similar = self.similar.setdefault(kind, Similarity())
            text = similarity_text(title, block)
            nearest, score = similar.nearest(text)
            self.last_similarity = (score, nearest)
            if nearest is not None and score >= DUPLICATE_SIMILARITY:
                self.aliases[rid] = nearest
                report = self.by_id[nearest]
                report.count += 1
                report.last_seen = when
                return report, "duplicate"
            report = Report(rid, kind, title, 0, when, when, self.release, self.host,
                            list(block[:MAX_BLOCK_LINES]), announced=when)
            self.by_id[rid] = report
            similar.add(rid, text)
            report.count = 1
            return report, "new"
        report.count += 1
        report.last_seen = when
        if when - report.announced >= REPEAT_EVENT_SECONDS:
            report.announced = when
            return report, "repeat"
        return report, "quiet"

    def to_json(self) -> list[dict]:
        return [r.as_dict() | {"announced": r.announced} for r in self.by_id.values()]

    def load(self, items: object) -> None:
        """Reports saved by `to_json`; entries that do not fit are skipped."""
        if not isinstance(items, list):
            return
        for item in items[:MAX_REPORTS]:
            try:
                report = Report(str(item["id"]), str(item["kind"]), str(item["title"]),
                                int(item["count"]), float(item["first_seen"]),
                                float(item["last_seen"]), str(item["release"]),
                                str(item["host"]), [str(x) for x in item["block"]][
                                    :MAX_BLOCK_LINES],
                                float(item.get("announced", 0.0)))
            except (KeyError, TypeError, ValueError):
                continue
            if report.kind in REPORTED_KINDS and report.id == signature_id(report.kind,
                                                                         report.title):
                self.by_id[report.id] = report
                self.similar.setdefault(report.kind, Similarity()).add(
                    report.id, similarity_text(report.title, report.block))
