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


LINUX_CRASH_KINDS: tuple[CrashKind, ...] = (
    # The sanitizers (KASAN, KMSAN, KCSAN, KFENCE), page faults, lock debugging, sleeping in
    # atomic context, leaks: most of what the kernel calls a bug starts "BUG:".
    CrashKind("BUG:", (
        TitleFormat(
            title="BUG: KASAN:",
            report=r"BUG: KASAN: ([a-z\-]+) in {{FUNC}}(?:.*\n)+?.*(Read|Write) (?:of size|at addr) (?:[0-9a-f]+)",
            template="KASAN: {1} {3} in {4}",
            alt=("bad-access in {4}",),
            stack=Stack(
                parts=(r"BUG: KASAN: (?:[a-z\-]+) in {{FUNC}}", CALL_TRACE, STACK,),
                skip=("kernel_fault", "tag_check", "mem_abort", "^el1_", "^el1h_",),
            ),
        ),
        TitleFormat(
            title="BUG: KASAN:",
            report="BUG: KASAN: (?:double-free or invalid-free|double-free|invalid-free) in {{FUNC}}",
            template="KASAN: invalid-free in {2}",
            alt=("invalid-free in {2}",),
            stack=Stack(
                parts=(
                    "BUG: KASAN: (?:double-free or invalid-free|double-free|invalid-free) in {{FUNC}}",
                    CALL_TRACE,
                    STACK,
                ),
                skip=("slab_", "kfree", "vunmap", "vfree",),
            ),
        ),
        TitleFormat(
            title=r"BUG: KASAN: ([a-z\-]+) on address(?:.*\n)+?.*(Read|Write) of size ([0-9]+)",
            template="KASAN: {1} {2}",
        ),
        TitleFormat(
            title="BUG: KASAN: (.*)",
            template="KASAN: {1}",
            corrupted=True,
        ),
        TitleFormat(
            title="BUG: KMSAN: kernel-usb-infoleak",
            report="BUG: KMSAN: kernel-usb-infoleak in {{FUNC}}",
            template="KMSAN: kernel-usb-infoleak in {2}",
            alt=("KMSAN origin in {3}",),
            stack=Stack(
                parts=(STACK, "(Local variable .* created at:|Uninit was created at:)", STACK,),
                skip=(
                    "alloc_skb",
                    "usb_submit_urb",
                    "usb_start_wait_urb",
                    "usb_bulk_msg",
                    "usb_interrupt_msg",
                    "usb_control_msg",
                ),
            ),
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: KMSAN:",
            report=r"BUG: KMSAN: ([a-z\-]+) in {{FUNC}}",
            template="KMSAN: {1} in {3}",
            alt=("bad-access in {3}",),
            stack=Stack(
                parts=(STACK, "(Local variable .* created at:|Uninit was created at:)", STACK,),
                skip=(
                    "alloc_skb",
                    "netlink_ack",
                    "netlink_rcv_skb",
                    "_encrypt$",
                    "^(?:crypto|cipher|drbg|rng)_",
                ),
            ),
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: KCSAN: data-race",
            report="BUG: KCSAN: (.*)",
            template="KCSAN: {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: KCSAN:",
            report="BUG: KCSAN: (.*)",
            template="KCSAN: {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: KFENCE: (use-after-free|out-of-bounds) (read|write) in {{FUNC}}",
            template="KFENCE: {1} {2} in {4}",
            alt=("bad-access in {4}",),
            stack=Stack(
                parts=(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}", STACK,),
            ),
        ),
        TitleFormat(
            title="BUG: KFENCE: invalid free in {{FUNC}}",
            template="KFENCE: invalid free in {2}",
            alt=("invalid-free in {2}",),
            stack=Stack(
                parts=(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}", STACK,),
            ),
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: KFENCE: invalid (read|write) in {{FUNC}}",
            template="KFENCE: invalid {1} in {3}",
            alt=("bad-access in {3}",),
            stack=Stack(
                parts=(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}", STACK,),
            ),
        ),
        TitleFormat(
            title="BUG: KFENCE: memory corruption in {{FUNC}}",
            template="KFENCE: memory corruption in {2}",
            stack=Stack(
                parts=(r"BUG: KFENCE: (?:[a-z\- ]+) in {{FUNC}}", STACK,),
            ),
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: (?:unable to handle kernel paging request|unable to handle page fault for address|Unable to handle kernel data access)",
            template="BUG: unable to handle kernel paging request in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title="BUG: (?:unable to handle kernel NULL pointer dereference|kernel NULL pointer dereference|Kernel NULL pointer dereference)",
            template="BUG: unable to handle kernel NULL pointer dereference in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title="BUG: (?:unable to handle kernel|Unable to handle kernel)",
            template="BUG: unable to handle kernel",
            corrupted=True,
        ),
        TitleFormat(
            title="BUG: (spinlock|rwlock) (lockup suspected|already unlocked|recursion|cpu recursion|bad magic|wrong owner|wrong CPU|trylock failure on UP)",
            template="BUG: {1} {2} in {3}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("spin_", "_lock", "_unlock",),
            ),
        ),
        TitleFormat(
            title="BUG: soft lockup",
            template="BUG: soft lockup in {1}",
            alt=("stall in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
                pick="stall",
            ),
        ),
        TitleFormat(
            title="BUG: .*still has locks held!",
            report=r"BUG: .*still has locks held!(?:.*\n)+?.*{{PC}} +{{FUNC}}",
            template="BUG: still has locks held in {1}",
        ),
        TitleFormat(
            title="BUG: scheduling while atomic",
            template="BUG: scheduling while atomic in {1}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("schedule",),
            ),
        ),
        TitleFormat(
            title="BUG: lock held when returning to user space",
            report=r"BUG: lock held when returning to user space(?:.*\n)+?.*leaving the kernel with locks still held(?:.*\n)+?.*at: (?:{{PC}} +)?{{FUNC}}",
            template="BUG: lock held when returning to user space in {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: bad unlock balance detected!",
            template="BUG: bad unlock balance in {1}",
            stack=Stack(
                parts=("{{PC}} +{{FUNC}}", CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title="BUG: held lock freed!",
            report=r"BUG: held lock freed!(?:.*\n)+?.*{{PC}} +{{FUNC}}",
            template="BUG: held lock freed in {1}",
        ),
        TitleFormat(
            title="BUG: Bad rss-counter state",
            template="BUG: Bad rss-counter state",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: non-zero nr_ptes on freeing mm",
            template="BUG: non-zero nr_ptes on freeing mm",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: non-zero nr_pmds on freeing mm",
            template="BUG: non-zero nr_pmds on freeing mm",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: Dentry .* still in use",
            report=r"BUG: Dentry .* still in use \([0-9]+\) \[(unmount) of ([^\]]+)\]",
            template="BUG: Dentry still in use in {1}",
            alt=("BUG: Dentry still in use [{1} of {2}]",),
        ),
        TitleFormat(
            title="BUG: Bad page (state|cache)",
            template="BUG: Bad page {1} in {2}",
            stack=Stack(
                parts=("page last allocated", STACK,),
                skip=(
                    "(free|put|get|update|release)_page",
                    "free_unref",
                    "^_*folio",
                    "truncate_inode_pages",
                    "page_frag_free",
                    "alloc",
                    "vmap",
                    "page_owner",
                ),
            ),
        ),
        TitleFormat(
            title="BUG: Bad page map",
            template="BUG: Bad page map",
        ),
        TitleFormat(
            title="BUG: workqueue lockup",
            template="BUG: workqueue lockup",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: sleeping function called from invalid context at (.*)",
            template="BUG: sleeping function called from invalid context in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title=r"BUG: using ([a-z_]+)\(\) in preemptible",
            template="BUG: using {1}() in preemptible code in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("dump_stack", "preemption", "preempt", "debug_", "processor_id", "this_cpu",),
            ),
        ),
        TitleFormat(
            title="BUG: workqueue leaked lock or atomic",
            report=r"BUG: workqueue leaked lock or atomic(?:.*\n)+?.*last function: ([a-zA-Z0-9_]+)\n",
            template="BUG: workqueue leaked lock or atomic in {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="BUG: memory leak",
            template="memory leak in {1}",
            stack=Stack(
                parts=(r"backtrace(?: \(crc [[:xdigit:]]*\))?:", STACK,),
                skip=(
                    "kmemleak",
                    "mmap",
                    "kmem",
                    "slab",
                    "alloc",
                    "create_object",
                    "idr_get",
                    "list_lru_init",
                    "kasprintf",
                    "kvasprintf",
                    "pcpu_create",
                    "strdup",
                    "strndup",
                    "memdup",
                ),
            ),
        ),
        TitleFormat(
            title="BUG: .*stack guard page was hit at",
            template="BUG: stack guard page was hit in {1}",
            alt=("stack-overflow in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
                pick="stall",
            ),
        ),
        TitleFormat(
            title="BUG: Invalid wait context",
            template="WARNING: locking bug in {1}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("lock_sock", "release_sock",),
            ),
        ),
        TitleFormat(
            title=r"BUG:[[:space:]]*(?:\n|$)",
            template="BUG: corrupted",
            corrupted=True,
        ),
    ), suppressions=("ODEBUG:", "Boot_DEBUG:", "xlog_status:", "DEBUG:", "BUG: no syscalls can create resource",)),
    # __warn() (kernel/panic.c) and lockdep's warnings: titled by the function the WARN is in, or
    # by the lock order it saw.
    CrashKind("WARNING:", (
        TitleFormat(
            title=r"WARNING: .*lib/debugobjects\.c.* (?:debug_print|debug_check|at)",
            template="WARNING: ODEBUG bug in {1}",
            stack=warning_stack("debug_", "rcu", "hrtimer_", "timer_", "work_", "percpu_", "vunmap", "vfree", "__free_", "debug_check", "kobject_"),
        ),
        TitleFormat(
            title=r"WARNING: .*mm/usercopy\.c.* (?:usercopy_warn|at)",
            template="WARNING: bad usercopy in {1}",
            stack=warning_stack("usercopy", "__check"),
        ),
        TitleFormat(
            title=r"WARNING: .*lib/kobject\.c.* (?:kobject_|at)",
            template="WARNING: kobject bug in {1}",
            stack=warning_stack("kobject_"),
        ),
        TitleFormat(
            title=r"WARNING: .*fs/proc/generic\.c.* (?:proc_register|at)",
            template="WARNING: proc registration bug in {1}",
            stack=warning_stack("proc_"),
        ),
        TitleFormat(
            title=r"WARNING: .*lib/refcount\.c.* (?:refcount_|at)",
            template="WARNING: refcount bug in {1}",
            stack=warning_stack("refcount", "kobject_"),
        ),
        TitleFormat(
            title=r"WARNING: .*kernel/locking/lockdep\.c.*lock_",
            template="WARNING: locking bug in {1}",
            stack=warning_stack("lock_sock", "release_sock"),
        ),
        TitleFormat(
            title="WARNING: .*still has locks held!",
            report=r"WARNING: .*still has locks held!(?:.*\n)+?.*at: {{FUNC}}",
            template="WARNING: still has locks held in {1}",
        ),
        TitleFormat(
            title="WARNING: Nested lock was not taken",
            template="WARNING: nested lock was not taken in {1}",
            stack=warning_stack(),
        ),
        TitleFormat(
            title="WARNING: lock held when returning to user space",
            report=r"WARNING: lock held when returning to user space(?:.*\n)+?.*leaving the kernel with locks still held(?:.*\n)+?.*at: (?:{{PC}} +)?{{FUNC}}",
            template="WARNING: lock held when returning to user space in {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title=r"WARNING: .*mm/.*\.c.* k?.?malloc",
            template="WARNING: kmalloc bug in {1}",
            stack=warning_stack("kmalloc", "krealloc", "slab", "kmem"),
        ),
        TitleFormat(
            title="WARNING: .*mm/vmalloc.c.*__vmalloc_node",
            template="WARNING: zero-size vmalloc in {1}",
            stack=warning_stack(),
        ),
        TitleFormat(
            title="WARNING: .* usb_submit_urb",
            template="WARNING in {1}/usb_submit_urb",
            stack=warning_stack("usb_submit_urb", "usb_start_wait_urb", "usb_bulk_msg", "usb_interrupt_msg", "usb_control_msg"),
        ),
        TitleFormat(
            title=r"WARNING: {{SRC}} at 0x\d+, CPU#\d+",
            template="WARNING in {2}",
            stack=warning_stack(),
        ),
        TitleFormat(
            title="WARNING: .* at {{SRC}} {{FUNC}}",
            template="WARNING in {3}",
            stack=warning_stack(),
        ),
        TitleFormat(
            title="WARNING: {{SRC}} at {{FUNC}}",
            template="WARNING in {3}",
            stack=warning_stack(),
        ),
        TitleFormat(
            title=r"WARNING: \[.*\] {{SRC}} at {{FUNC}}.*",
            template="WARNING in {3}",
            stack=warning_stack(),
        ),
        TitleFormat(
            title="WARNING: possible circular locking dependency detected",
            report=r"WARNING: possible circular locking dependency detected(?:.*\n)+?.*is trying to acquire lock",
            template="possible deadlock in {1}",
            stack=Stack(
                parts=("at: (?:{{PC}} +)?{{FUNC}}", "at: (?:{{PC}} +)?{{FUNC}}", STACK,),
                skip=(
                    "process_one_work",
                    "flush_workqueue",
                    "drain_workqueue",
                    "destroy_workqueue",
                ),
            ),
        ),
        TitleFormat(
            title="WARNING: possible irq lock inversion dependency detected",
            report=r"WARNING: possible irq lock inversion dependency detected(?:.*\n)+?.*just changed the state of lock(?:.*\n)+?.*at: (?:{{PC}} +)?{{FUNC}}",
            template="possible deadlock in {1}",
        ),
        TitleFormat(
            title="WARNING: .*-safe -> .*-unsafe lock order detected",
            template="possible deadlock in {1}",
            stack=Stack(
                parts=("which became (?:.*) at:", STACK,),
            ),
        ),
        TitleFormat(
            title="WARNING: possible recursive locking detected",
            report=r"WARNING: possible recursive locking detected(?:.*\n)+?.*is trying to acquire lock(?:.*\n)+?.*at: (?:{{PC}} +)?{{FUNC}}",
            template="possible deadlock in {1}",
        ),
        TitleFormat(
            title="WARNING: inconsistent lock state",
            report=r"WARNING: inconsistent lock state(?:.*\n)+?.*takes(?:.*\n)+?.*at: (?:{{PC}} +)?{{FUNC}}",
            template="inconsistent lock state in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title="WARNING: suspicious RCU usage",
            report="WARNING: suspicious RCU usage(?:.*\n)+?.*?{{SRC}}",
            template="WARNING: suspicious RCU usage in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("rcu", "kmem", "slab",),
            ),
        ),
        TitleFormat(
            title="WARNING: kernel stack regs at [0-9a-f]+ in [^ ]* has bad '([^']+)' value",
            template="WARNING: kernel stack regs has bad '{1}' value",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="WARNING: kernel stack frame pointer at [0-9a-f]+ in [^ ]* has bad value",
            template="WARNING: kernel stack frame pointer has bad value",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="WARNING: bad unlock balance detected!",
            template="WARNING: bad unlock balance in {1}",
            stack=Stack(
                parts=("{{PC}} +{{FUNC}}", CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title="WARNING: held lock freed!",
            report=r"WARNING: held lock freed!(?:.*\n)+?.*at:(?: {{PC}})? +{{FUNC}}",
            template="WARNING: held lock freed in {1}",
        ),
        TitleFormat(
            title="WARNING: kernel stack regs .* has bad 'bp' value",
            template="WARNING: kernel stack regs has bad value",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="WARNING: kernel stack frame pointer .* has bad value",
            template="WARNING: kernel stack regs has bad value",
            no_stack_trace=True,
        ),
        TitleFormat(
            title=r"WARNING:[[:space:]]*(?:\n|$)",
            template="WARNING: corrupted",
            corrupted=True,
        ),
    ), suppressions=("WARNING: /etc/ssh/moduli does not exist, using fixed modulus", "WARNING: workqueue cpumask: online intersect > possible intersect", "WARNING: [Tt]he mand mount option", r"WARNING: Unsupported flag value\(s\) of 0x%x in DT_FLAGS_1", "WARNING: Unprivileged eBPF is enabled with eIBRS", r"WARNING: fbcon: Driver '(.*)' missed to adjust virtual screen size (\((?:\d+)x(?:\d+) vs\. (?:\d+)x(?:\d+)\))", "WARNING: See https.* for mitigation options.", "WARNING: kernel not compiled with CPU_SRSO", r"EXT4-[Ff][Ss](?: \(.*\))?:", "(?i)warning: .* uses (deprecated v2 capabilities|wireless extensions)", r"XFS \(\w+\): WARNING",)),
    # lockdep on older kernels, a task blocked too long (kernel/hung_task.c), an RCU stall
    # (kernel/rcu/tree_stall.h).
    CrashKind("INFO:", (
        TitleFormat(
            title="INFO: possible circular locking dependency detected",
            report=r"INFO: possible circular locking dependency detected \](?:.*\n)+?.*is trying to acquire lock(?:.*\n)+?.*at: {{PC}} +{{FUNC}}",
            template="possible deadlock in {1}",
        ),
        TitleFormat(
            title="INFO: possible irq lock inversion dependency detected",
            report=r"INFO: possible irq lock inversion dependency detected \](?:.*\n)+?.*just changed the state of lock(?:.*\n)+?.*at: {{PC}} +{{FUNC}}",
            template="possible deadlock in {1}",
        ),
        TitleFormat(
            title="INFO: SOFTIRQ-safe -> SOFTIRQ-unsafe lock order detected",
            report=r"INFO: SOFTIRQ-safe -> SOFTIRQ-unsafe lock order detected \](?:.*\n)+?.*is trying to acquire(?:.*\n)+?.*at: {{PC}} +{{FUNC}}",
            template="possible deadlock in {1}",
        ),
        TitleFormat(
            title="INFO: possible recursive locking detected",
            report=r"INFO: possible recursive locking detected \](?:.*\n)+?.*is trying to acquire lock(?:.*\n)+?.*at: {{PC}} +{{FUNC}}",
            template="possible deadlock in {1}",
        ),
        TitleFormat(
            title="INFO: inconsistent lock state",
            report=r"INFO: inconsistent lock state \](?:.*\n)+?.*takes(?:.*\n)+?.*at: {{PC}} +{{FUNC}}",
            template="inconsistent lock state in {1}",
        ),
        TitleFormat(
            title="INFO: rcu_(?:preempt|sched|bh|tasks) (?:self-)?detected(?: expedited)? stall",
            template="INFO: rcu detected stall in {1}",
            alt=("stall in {1}",),
            stack=Stack(
                parts=("apic_timer_interrupt", RIP_FRAME, STACK,),
                parts2=("(?:apic_timer_interrupt|Exception stack|el1h_64_irq)", STACK,),
                skip=("apic_timer_interrupt", "rcu",),
                pick="stall",
            ),
        ),
        TitleFormat(
            title="INFO: trying to register non-static key",
            template="INFO: trying to register non-static key in {1}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("stack", "lock", "IRQ",),
            ),
        ),
        TitleFormat(
            title="INFO: suspicious RCU usage",
            report="INFO: suspicious RCU usage(?:.*\n)+?.*?{{SRC}}",
            template="INFO: suspicious RCU usage in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("rcu", "kmem", "slab",),
            ),
        ),
        TitleFormat(
            title="INFO: task {{TASK}} blocked (?:in I/O wait )?for more than [0-9]+ seconds",
            template="INFO: task hung in {1}",
            alt=("hang in {1}",),
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                pick="hung_task",
            ),
        ),
        TitleFormat(
            title="INFO: task {{TASK}} can't die for more than .* seconds",
            template="INFO: task can't die in {1}",
            alt=("hang in {1}",),
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("schedule",),
            ),
        ),
        TitleFormat(
            title="INFO: (Freed|Allocated) in (.*)",
            template="INFO: {1} in {2}",
            corrupted=True,
        ),
        TitleFormat(
            title=r"INFO:[[:space:]]*(?:\n|$)",
            template="INFO: corrupted",
            corrupted=True,
        ),
    ), suppressions=("INFO: lockdep is turned off", "INFO: Stall ended before state dump start", "INFO: NMI handler", "INFO: recovery required on readonly filesystem", "(handler|interrupt).*took too long", "INFO: sys_.* is not present in /proc/kallsyms", "INFO: no syscalls can create resource", "rmt_storage:INFO:", "_INFO:",)),
    # arm and arm64's page fault (arch/arm64/mm/fault.c).
    CrashKind("Unable to handle kernel", (
        TitleFormat(
            title="Unable to handle kernel (paging request|NULL pointer dereference|access to user memory)",
            template="BUG: unable to handle kernel {1} in {2}",
            alt=("bad-access in {2}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    )),
    # x86's #GP (arch/x86/kernel/traps.c): often a wild pointer, KASAN's "probably for non-
    # canonical address".
    CrashKind("general protection fault", (
        TitleFormat(
            title="general protection fault.*:",
            template="general protection fault in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    ), suppressions=(r"general protection fault .* error:\d+ in ",)),
    # x86's #SS, a fault on a bad stack pointer.
    CrashKind("stack segment: ", (
        TitleFormat(
            title="stack segment: ",
            template="stack segment fault in {1}",
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    )),
    # panic() (kernel/panic.c): a title of its own only when no report came before it.
    CrashKind("Kernel panic", (
        TitleFormat(
            title="Kernel panic - not syncing: stack-protector:",
            report="Kernel panic - not syncing: stack-protector: Kernel stack is corrupted in: {{FUNC}}",
            template="kernel panic: stack is corrupted in {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="Kernel panic - not syncing: stack-protector:",
            report="Kernel panic - not syncing: stack-protector: Kernel stack is corrupted in: [a-f0-9]+",
            template="kernel panic: stack is corrupted in {1}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("stack_chk",),
            ),
        ),
        TitleFormat(
            title="Kernel panic - not syncing: corrupted stack end",
            report="Kernel panic - not syncing: corrupted stack end detected inside scheduler",
            template="kernel panic: corrupted stack end in {1}",
            alt=("stack-overflow in {1}",),
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("schedule", "retint_kernel",),
                pick="stall",
            ),
        ),
        TitleFormat(
            title="Kernel panic - not syncing: kernel stack overflow",
            template="kernel stack overflow in {1}",
            alt=("stack-overflow in {1}",),
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("bad_stack",),
                pick="stall",
            ),
        ),
        TitleFormat(
            title="Kernel panic - not syncing: Attempted to kill init!",
            template="kernel panic: Attempted to kill init!",
        ),
        TitleFormat(
            title="Kernel panic - not syncing: Couldn't open N_TTY ldisc for [^ ]+ --- error -[0-9]+",
            template="kernel panic: Couldn't open N_TTY ldisc",
        ),
        TitleFormat(
            title="Kernel panic - not syncing: Fatal exception",
            template="kernel panic: Fatal exception",
            corrupted=True,
        ),
        TitleFormat(
            title="Kernel panic - not syncing: panic_on_warn set",
            template="kernel panic: panic_on_warn set",
            corrupted=True,
        ),
        TitleFormat(
            title="Kernel panic - not syncing: hung_task: blocked tasks",
            template="kernel panic: hung_task: blocked tasks",
            corrupted=True,
        ),
        TitleFormat(
            title="Kernel panic - not syncing: (.*)",
            template="kernel panic: {1}",
        ),
    )),
    # x86's double fault: usually a stack overflow.
    CrashKind("PANIC: double fault", (
        TitleFormat(
            title="PANIC: double fault",
            template="PANIC: double fault in {1}",
            stack=Stack(
                parts=(RIP_FRAME,),
            ),
        ),
    )),
    # A Rust panic in kernel code (overflow checks, unwrap).
    CrashKind("rust_kernel: panicked", (
        TitleFormat(
            title="rust_kernel: panicked",
            report="rust_kernel: panicked at [^\n]*?\n(.+?)\n",
            template="{1} in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("__rustc::rust_begin_unwind",),
            ),
        ),
    )),
    # BUG() and BUG_ON() on x86 ("kernel BUG at file:line!").
    CrashKind("kernel BUG", (
        TitleFormat(
            title="kernel BUG at mm/usercopy.c",
            template="BUG: bad usercopy in {1}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("usercopy", "__check",),
            ),
        ),
        TitleFormat(
            title="kernel BUG at lib/list_debug.c",
            template="BUG: corrupted list in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
            ),
        ),
        TitleFormat(
            title="kernel BUG at (.*)",
            template="kernel BUG in {2}",
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
                skip=("^skb_",),
            ),
        ),
    )),
    # BUG() on arm.
    CrashKind("Kernel BUG", (
        TitleFormat(
            title="Kernel BUG (.*)",
            template="kernel BUG {1}",
        ),
    )),
    # SLUB's consistency checks (mm/slub.c).
    CrashKind("BUG kmalloc-", (
        TitleFormat(
            title="BUG kmalloc-.*: Object already free",
            template="BUG: Object already free",
        ),
    )),
    # x86's #DE.
    CrashKind("divide error:", (
        TitleFormat(
            title="divide error: ",
            template="divide error in {1}",
            stack=Stack(
                parts=(RIP_FRAME,),
            ),
        ),
    )),
    # x86's #DE on older kernels.
    CrashKind("divide_error:", (
        TitleFormat(
            title="divide_error: ",
            template="divide error in {1}",
            stack=Stack(
                parts=(RIP_FRAME,),
            ),
        ),
    )),
    # x86's #UD outside BUG().
    CrashKind("invalid opcode:", (
        TitleFormat(
            title="invalid opcode: ",
            template="invalid opcode in {1}",
            stack=Stack(
                parts=(RIP_FRAME,),
            ),
        ),
    )),
    # x86's breakpoint trap.
    CrashKind("int3:", (
        TitleFormat(
            title="int3: ",
            template="int3 in {1}",
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    )),
    # The undefined-behaviour sanitizer (lib/ubsan.c).
    CrashKind("UBSAN:", (
        TitleFormat(
            title="UBSAN:",
            report="UBSAN: Undefined behaviour in",
            template="UBSAN: undefined-behaviour in {1}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("ubsan", "overflow",),
            ),
        ),
        TitleFormat(
            title="UBSAN: array-index-out-of-bounds in",
            template="UBSAN: array-index-out-of-bounds in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("ubsan", "overflow",),
            ),
        ),
        TitleFormat(
            title="UBSAN:",
            report="UBSAN: (.*?) in",
            template="UBSAN: {1} in {2}",
            stack=Stack(
                parts=(CALL_TRACE, STACK,),
                skip=("ubsan", "overflow",),
            ),
        ),
    )),
    # A reboot nobody asked for: the machine crashed without a word.
    CrashKind("Booting the kernel.", (
        TitleFormat(
            title="^Booting the kernel",
            template="unexpected kernel reboot",
            no_stack_trace=True,
        ),
    ), suppressions=("Parsing ELF|Decompressing Linux|Unknown parameter '",)),
    # A network device whose references never drop (net/core/dev.c).
    CrashKind("unregister_netdevice: waiting for", (
        TitleFormat(
            title="unregister_netdevice: waiting for (?:.*) to become free",
            template="unregister_netdevice: waiting for DEV to become free",
            no_stack_trace=True,
        ),
    )),
    # A file closed more times than opened (fs/open.c).
    CrashKind("VFS: Close: file count is 0", (
        TitleFormat(
            title="VFS: Close: file count is 0",
            template="VFS: Close: file count is zero (use-after-free)",
            no_stack_trace=True,
        ),
    )),
    # Inodes still in use after their file system went (fs/super.c).
    CrashKind("VFS: Busy inodes after unmount", (
        TitleFormat(
            title="VFS: Busy inodes after unmount",
            template="VFS: Busy inodes after unmount (use-after-free)",
            no_stack_trace=True,
        ),
    )),
    # arm and arm64's die().
    CrashKind("Internal error:", (
        TitleFormat(
            title="Internal error:",
            template="Internal error in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    )),
    # arm's fault handler for what it cannot handle.
    CrashKind("Unhandled fault:", (
        TitleFormat(
            title="Unhandled fault:",
            template="Unhandled fault in {1}",
            alt=("bad-access in {1}",),
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    )),
    # arm's unaligned access.
    CrashKind("Alignment trap:", (
        TitleFormat(
            title="Alignment trap:",
            template="Alignment trap in {1}",
            stack=Stack(
                parts=(RIP_FRAME, CALL_TRACE, STACK,),
            ),
        ),
    )),
    # The Trusty TEE's own panics, printed into the kernel log on Android.
    CrashKind("trusty: panic", (
        TitleFormat(
            title="trusty: panic.* ASSERT FAILED",
            report=r"trusty: panic \(.*?\):(?: DEBUG)? ASSERT FAILED at \(.*?\): (.+)",
            template="trusty: ASSERT FAILED: {1}",
            no_stack_trace=True,
        ),
        TitleFormat(
            title="trusty: panic.* ASSERT FAILED.*: *(.*)",
            template="trusty: ASSERT FAILED: {1}",
            corrupted=True,
        ),
        TitleFormat(
            title="trusty: panic",
            report=r"trusty: panic \(.*?\): (.+)",
            template="trusty: panic: {1}",
            no_stack_trace=True,
        ),
    )),
    # A Go runtime's fatal error (syzkaller's own tools, gVisor).
    CrashKind("fatal error:", (
        TitleFormat(title="fatal error:", template="go runtime error", no_stack_trace=True),
    ), suppressions=("ALSA", "fatal error: cannot create timer")),
    # Printed by syzkaller itself: the executor's fail(), log.Fatal, a Go panic.
    CrashKind("SYZFAIL:", (
        TitleFormat(title="SYZFAIL:(.*)", template="SYZFAIL:{1}", no_stack_trace=True),
    )),
    CrashKind("SYZFATAL:", (
        TitleFormat(title="SYZFATAL:(.*)()", template="SYZFATAL:{1}", alt=("SYZFATAL{2}",),
                    no_stack_trace=True),
    )),
    CrashKind("panic:", (
        TitleFormat(title="panic: Sentry detected .* stuck task",
                    template="panic: Sentry detected stuck tasks", no_stack_trace=True),
        TitleFormat(title="panic:(.*)", template="panic:{1}", no_stack_trace=True),
    ), suppressions=("_panic:", "xlog_status:", r"ddb\.onpanic:", "evtlog_status:")),
)
"""Every kind, in the order a line is tried against them: the first whose header the
line contains starts the report."""
