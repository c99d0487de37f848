# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""The table of Linux crash formats: what starts a report and how each kind is titled.

Data, not code: one `CrashKind` per line the kernel prints at the start of a report
(``BUG:``, ``WARNING:``, ``INFO:``, ``general protection fault`` ...), each with its
`TitleFormat`s tried in order by `mlfs.crash.parse`.  The kinds, patterns and title
templates are the facts syzkaller's `pkg/report/linux.go` (Apache-2.0, commit 1e72964b)
records about kernel output, re-expressed here so that mlfs's titles are syzbot's titles:
the same bug seen on a maintainer's dashboard and in a mount is one name.

Patterns are Python regular expressions with five placeholders, expanded by
`mlfs.crash.parse.pattern`:

- ``{{FUNC}}`` a function name followed by ``+`` or ``.`` (a capture group),
- ``{{PC}}`` a ``[<ffffffff81234567>]`` program counter, ``{{ADDR}}`` a hex address,
- ``{{SRC}}`` a ``file.c:123`` location (a capture group), ``{{TASK}}`` up to 100
  characters of task name, which can hold anything.

A template names its arguments by position from 1: first the groups the title pattern
(or the report pattern, when there is one) captured, then one function per `STACK` part
of the format's `Stack`.

The table is assembled here from one module per family (`formats_sanitizers`,
`formats_locking`, `formats_stalls`, `formats_memory`, `formats_oops`, `formats_other`);
its order is part of it.  A line starts the report of the first kind whose header it
contains, and within a kind two formats can match the same report: the one listed
first is meant.  So a family's formats under ``BUG:``, ``WARNING:`` and ``INFO:`` are
listed here piece by piece, in syzkaller's order; `mlfs.crash.schema` is the shape of
an entry.
"""

from __future__ import annotations

from mlfs.crash import formats_locking as locking
from mlfs.crash import formats_memory as memory
from mlfs.crash import formats_oops as oops
from mlfs.crash import formats_other as other
from mlfs.crash import formats_sanitizers as sanitizers
from mlfs.crash import formats_stalls as stalls
from mlfs.crash.schema import STACK, CrashKind, Stack, TitleFormat

__all__ = ["LINUX_CRASH_KINDS", "STACK", "CrashKind", "Stack", "TitleFormat"]

LINUX_CRASH_KINDS: tuple[CrashKind, ...] = (
    # The sanitizers (KASAN, KMSAN, KCSAN, KFENCE), page faults, lock debugging, sleeping in
    # atomic context, leaks: most of what the kernel calls a bug starts "BUG:".
    CrashKind("BUG:", (
        *sanitizers.BUG_SANITIZERS,
        *oops.BUG_PAGE_FAULTS,
        *locking.BUG_SPINLOCK,
        *stalls.BUG_SOFT_LOCKUP,
        *locking.BUG_LOCKS,
        *memory.BUG_MM_STATE,
        *stalls.BUG_WORKQUEUE_LOCKUP,
        *locking.BUG_ATOMIC,
        *memory.BUG_LEAK_AND_GUARD,
        *locking.BUG_WAIT_CONTEXT,
        TitleFormat(
            title=r"BUG:[[:space:]]*(?:\n|$)",
            template="BUG: corrupted",
            corrupted=True,
        ),
    ), suppressions=("ODEBUG:", "Boot_DEBUG:", "xlog_status:", "DEBUG:", "BUG: no syscalls can create resource",)),
    # __warn() (kernel/panic.c) and lockdep's warnings: titled by the function the WARN is in, or
    # by the lock order it saw.
    CrashKind("WARNING:", (
        *oops.WARNING_CHECKERS,
        *locking.WARNING_LOCKDEP_CALLS,
        *memory.WARNING_ALLOC,
        *oops.WARNING_AT,
        *locking.WARNING_LOCKDEP,
        *stalls.WARNING_SUSPICIOUS_RCU,
        *oops.WARNING_BAD_STACK,
        *locking.WARNING_LOCK_BALANCE,
        *oops.WARNING_BAD_STACK_OLD,
        TitleFormat(
            title=r"WARNING:[[:space:]]*(?:\n|$)",
            template="WARNING: corrupted",
            corrupted=True,
        ),
    ), suppressions=("WARNING: /etc/ssh/moduli does not exist, using fixed modulus", "WARNING: workqueue cpumask: online intersect > possible intersect", "WARNING: [Tt]he mand mount option", r"WARNING: Unsupported flag value\(s\) of 0x%x in DT_FLAGS_1", "WARNING: Unprivileged eBPF is enabled with eIBRS", r"WARNING: fbcon: Driver '(.*)' missed to adjust virtual screen size (\((?:\d+)x(?:\d+) vs\. (?:\d+)x(?:\d+)\))", "WARNING: See https.* for mitigation options.", "WARNING: kernel not compiled with CPU_SRSO", r"EXT4-[Ff][Ss](?: \(.*\))?:", "(?i)warning: .* uses (deprecated v2 capabilities|wireless extensions)", r"XFS \(\w+\): WARNING",)),
    # lockdep on older kernels, a task blocked too long (kernel/hung_task.c), an RCU stall
    # (kernel/rcu/tree_stall.h).
    CrashKind("INFO:", (
        *locking.INFO_LOCKDEP,
        *stalls.INFO_RCU_STALL,
        *locking.INFO_NON_STATIC_KEY,
        *stalls.INFO_SUSPICIOUS_RCU,
        *stalls.INFO_HUNG_TASK,
        *memory.INFO_SLAB_DEBUG,
        TitleFormat(
            title=r"INFO:[[:space:]]*(?:\n|$)",
            template="INFO: corrupted",
            corrupted=True,
        ),
    ), suppressions=("INFO: lockdep is turned off", "INFO: Stall ended before state dump start", "INFO: NMI handler", "INFO: recovery required on readonly filesystem", "(handler|interrupt).*took too long", "INFO: sys_.* is not present in /proc/kallsyms", "INFO: no syscalls can create resource", "rmt_storage:INFO:", "_INFO:",)),
    oops.UNABLE_TO_HANDLE,
    oops.GENERAL_PROTECTION_FAULT,
    oops.STACK_SEGMENT,
    other.KERNEL_PANIC,
    oops.DOUBLE_FAULT,
    other.RUST_PANIC,
    oops.KERNEL_BUG,
    oops.KERNEL_BUG_ARM,
    memory.SLUB_DOUBLE_FREE,
    oops.DIVIDE_ERROR,
    oops.DIVIDE_ERROR_OLD,
    oops.INVALID_OPCODE,
    oops.INT3,
    sanitizers.UBSAN,
    other.UNEXPECTED_REBOOT,
    other.NETDEVICE_LEAK,
    other.VFS_CLOSE,
    other.VFS_BUSY_INODES,
    oops.INTERNAL_ERROR,
    oops.UNHANDLED_FAULT,
    oops.ALIGNMENT_TRAP,
    other.TRUSTY_PANIC,
    other.GO_FATAL_ERROR,
    other.SYZFAIL,
    other.SYZFATAL,
    other.GO_PANIC,
)
"""Every kind, in the order a line is tried against them: the first whose header the
line contains starts the report."""
