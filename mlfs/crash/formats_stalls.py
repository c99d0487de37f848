# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""Stalls: soft lockups, workqueue lockups, RCU stalls and suspicious RCU usage, tasks
hung (kernel/watchdog.c, kernel/workqueue.c, kernel/rcu/, kernel/hung_task.c).

Titled by the function looping or waiting (`mlfs.crash.formats` puts them in the
table's order).
"""

from __future__ import annotations

from mlfs.crash.schema import CALL_TRACE, RIP_FRAME, STACK, Stack, TitleFormat

#: BUG: a CPU stuck in the kernel (kernel/watchdog.c)
BUG_SOFT_LOCKUP = (
    TitleFormat(
        title="BUG: soft lockup",
        template="BUG: soft lockup in {1}",
        alt=("stall in {1}",),
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
            pick="stall",
        ),
    ),
)


#: BUG: a workqueue pool stuck (kernel/workqueue.c)
BUG_WORKQUEUE_LOCKUP = (
    TitleFormat(
        title="BUG: workqueue lockup",
        template="BUG: workqueue lockup",
        no_stack_trace=True,
    ),
)


#: WARNING: RCU used outside its rules (lockdep's RCU checks)
WARNING_SUSPICIOUS_RCU = (
    TitleFormat(
        title="WARNING: suspicious RCU usage",
        report="WARNING: suspicious RCU usage(?:.*\n)+?.*?{{SRC}}",
        template="WARNING: suspicious RCU usage in {2}",
        stack=Stack(
            parts=(CALL_TRACE, STACK,),
            skip=("rcu", "kmem", "slab",),
        ),
    ),
)


#: INFO: an RCU stall (kernel/rcu/tree_stall.h)
INFO_RCU_STALL = (
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
)


#: INFO: RCU used outside its rules (older kernels)
INFO_SUSPICIOUS_RCU = (
    TitleFormat(
        title="INFO: suspicious RCU usage",
        report="INFO: suspicious RCU usage(?:.*\n)+?.*?{{SRC}}",
        template="INFO: suspicious RCU usage in {2}",
        stack=Stack(
            parts=(CALL_TRACE, STACK,),
            skip=("rcu", "kmem", "slab",),
        ),
    ),
)


#: INFO: a task blocked too long (kernel/hung_task.c)
INFO_HUNG_TASK = (
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
)
