"""What one kernel-log message says: its kind, the block device it is about, its title.

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

import re
from dataclasses import dataclass

from mlfs.crash import parse_log

KINDS = ("io_error", "fs_error", "oops", "bug", "warning", "panic", "hung_task",
         "soft_lockup", "rcu_stall", "oom_kill", "segfault", "lost", "other")

#: block/blk-core.c `blk_errors` names (old and new kernels)
BLOCK_STATUS = ("operation not supported", "timeout", "critical space allocation",
                "recoverable transport", "critical target", "critical nexus",
                "reservation conflict", "critical medium", "protection", "kernel resource",
                "device resource", "nonblocking retry", "device offline", "dm internal retry",
                "open zones exceeded", "active zones exceeded", "duration limit exceeded",
                "invalid", "I/O", "zone resource")


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
