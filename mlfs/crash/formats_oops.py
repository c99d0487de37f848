# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""Oopses, BUG() and WARN(): page faults, traps (#GP, #SS, #DE, #UD, int3, double fault),
``kernel BUG at``, a WARN in a function or a checker, a bad stack, and arm's die()
and faults.

`mlfs.crash.formats` puts them in the table's order.
"""

from __future__ import annotations

from mlfs.crash.schema import (
    CALL_TRACE,
    RIP_FRAME,
    STACK,
    CrashKind,
    Stack,
    TitleFormat,
    warning_stack,
)

#: BUG: page faults and NULL pointer dereferences (x86)
BUG_PAGE_FAULTS = (
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
)


#: WARNING: WARNs of the kernel's checkers (debugobjects, usercopy, kobject, proc, refcount)
WARNING_CHECKERS = (
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
)


#: WARNING: a WARN titled by the function it is in
WARNING_AT = (
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
)


#: WARNING: the unwinder finding a bad stack
WARNING_BAD_STACK = (
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
)


#: WARNING: the unwinder finding a bad stack (older wording)
WARNING_BAD_STACK_OLD = (
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
)


#: arm and arm64's page fault (arch/arm64/mm/fault.c).
UNABLE_TO_HANDLE = CrashKind("Unable to handle kernel", (
    TitleFormat(
        title="Unable to handle kernel (paging request|NULL pointer dereference|access to user memory)",
        template="BUG: unable to handle kernel {1} in {2}",
        alt=("bad-access in {2}",),
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
))


#: x86's #GP (arch/x86/kernel/traps.c): often a wild pointer, KASAN's "probably for non-
#: canonical address".
GENERAL_PROTECTION_FAULT = CrashKind("general protection fault", (
    TitleFormat(
        title="general protection fault.*:",
        template="general protection fault in {1}",
        alt=("bad-access in {1}",),
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
), suppressions=(r"general protection fault .* error:\d+ in ",))


#: x86's #SS, a fault on a bad stack pointer.
STACK_SEGMENT = CrashKind("stack segment: ", (
    TitleFormat(
        title="stack segment: ",
        template="stack segment fault in {1}",
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
))


#: x86's double fault: usually a stack overflow.
DOUBLE_FAULT = CrashKind("PANIC: double fault", (
    TitleFormat(
        title="PANIC: double fault",
        template="PANIC: double fault in {1}",
        stack=Stack(
            parts=(RIP_FRAME,),
        ),
    ),
))


#: BUG() and BUG_ON() on x86 ("kernel BUG at file:line!").
KERNEL_BUG = CrashKind("kernel BUG", (
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
))


#: BUG() on arm.
KERNEL_BUG_ARM = CrashKind("Kernel BUG", (
    TitleFormat(
        title="Kernel BUG (.*)",
        template="kernel BUG {1}",
    ),
))


#: x86's #DE.
DIVIDE_ERROR = CrashKind("divide error:", (
    TitleFormat(
        title="divide error: ",
        template="divide error in {1}",
        stack=Stack(
            parts=(RIP_FRAME,),
        ),
    ),
))


#: x86's #DE on older kernels.
DIVIDE_ERROR_OLD = CrashKind("divide_error:", (
    TitleFormat(
        title="divide_error: ",
        template="divide error in {1}",
        stack=Stack(
            parts=(RIP_FRAME,),
        ),
    ),
))


#: x86's #UD outside BUG().
INVALID_OPCODE = CrashKind("invalid opcode:", (
    TitleFormat(
        title="invalid opcode: ",
        template="invalid opcode in {1}",
        stack=Stack(
            parts=(RIP_FRAME,),
        ),
    ),
))


#: x86's breakpoint trap.
INT3 = CrashKind("int3:", (
    TitleFormat(
        title="int3: ",
        template="int3 in {1}",
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
))


#: arm and arm64's die().
INTERNAL_ERROR = CrashKind("Internal error:", (
    TitleFormat(
        title="Internal error:",
        template="Internal error in {1}",
        alt=("bad-access in {1}",),
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
))


#: arm's fault handler for what it cannot handle.
UNHANDLED_FAULT = CrashKind("Unhandled fault:", (
    TitleFormat(
        title="Unhandled fault:",
        template="Unhandled fault in {1}",
        alt=("bad-access in {1}",),
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
))


#: arm's unaligned access.
ALIGNMENT_TRAP = CrashKind("Alignment trap:", (
    TitleFormat(
        title="Alignment trap:",
        template="Alignment trap in {1}",
        stack=Stack(
            parts=(RIP_FRAME, CALL_TRACE, STACK,),
        ),
    ),
))
