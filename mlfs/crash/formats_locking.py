# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""Lock debugging and waiting where one must not: lockdep, spinlock debugging,
sleeping in atomic context, locks held or freed wrongly.

Titled by the rule broken and the function (`mlfs.crash.formats` puts them in the
table's order).
"""

from __future__ import annotations

from mlfs.crash.schema import CALL_TRACE, STACK, Stack, TitleFormat, warning_stack

#: BUG: spinlock and rwlock debugging
BUG_SPINLOCK = (
    TitleFormat(
        title="BUG: (spinlock|rwlock) (lockup suspected|already unlocked|recursion|cpu recursion|bad magic|wrong owner|wrong CPU|trylock failure on UP)",
        template="BUG: {1} {2} in {3}",
        stack=Stack(
            parts=(CALL_TRACE, STACK,),
            skip=("spin_", "_lock", "_unlock",),
        ),
    ),
)


#: BUG: locks held, unbalanced or freed where they must not be
BUG_LOCKS = (
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
)


#: BUG: sleeping or per-CPU access in atomic context, a work item leaking a lock
BUG_ATOMIC = (
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
)


#: BUG: lockdep's wait-context check
BUG_WAIT_CONTEXT = (
    TitleFormat(
        title="BUG: Invalid wait context",
        template="WARNING: locking bug in {1}",
        stack=Stack(
            parts=(CALL_TRACE, STACK,),
            skip=("lock_sock", "release_sock",),
        ),
    ),
)


#: WARNING: lockdep's WARNs and lock state at return to user space
WARNING_LOCKDEP_CALLS = (
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
)


#: WARNING: lockdep's reports of lock order and state
WARNING_LOCKDEP = (
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
)


#: WARNING: a lock released more than taken, or freed while held
WARNING_LOCK_BALANCE = (
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
)


#: INFO: lockdep on older kernels
INFO_LOCKDEP = (
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
)


#: INFO: a lock whose key lockdep cannot track
INFO_NON_STATIC_KEY = (
    TitleFormat(
        title="INFO: trying to register non-static key",
        template="INFO: trying to register non-static key in {1}",
        stack=Stack(
            parts=(CALL_TRACE, STACK,),
            skip=("stack", "lock", "IRQ",),
        ),
    ),
)
