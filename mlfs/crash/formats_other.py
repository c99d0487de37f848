# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""Panics and the rest: panic() and Rust panics, a reboot nobody asked for, references
of a net device or an inode never dropped, Trusty's panics, and the failures of
syzkaller's own tools.

`mlfs.crash.formats` puts them in the table's order.
"""

from __future__ import annotations

from mlfs.crash.schema import CALL_TRACE, STACK, CrashKind, Stack, TitleFormat

#: panic() (kernel/panic.c): a title of its own only when no report came before it.
KERNEL_PANIC = CrashKind("Kernel panic", (
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
))


#: A Rust panic in kernel code (overflow checks, unwrap).
RUST_PANIC = CrashKind("rust_kernel: panicked", (
    TitleFormat(
        title="rust_kernel: panicked",
        report="rust_kernel: panicked at [^\n]*?\n(.+?)\n",
        template="{1} in {2}",
        stack=Stack(
            parts=(CALL_TRACE, STACK,),
            skip=("__rustc::rust_begin_unwind",),
        ),
    ),
))


#: A reboot nobody asked for: the machine crashed without a word.
UNEXPECTED_REBOOT = CrashKind("Booting the kernel.", (
    TitleFormat(
        title="^Booting the kernel",
        template="unexpected kernel reboot",
        no_stack_trace=True,
    ),
), suppressions=("Parsing ELF|Decompressing Linux|Unknown parameter '",))


#: A network device whose references never drop (net/core/dev.c).
NETDEVICE_LEAK = CrashKind("unregister_netdevice: waiting for", (
    TitleFormat(
        title="unregister_netdevice: waiting for (?:.*) to become free",
        template="unregister_netdevice: waiting for DEV to become free",
        no_stack_trace=True,
    ),
))


#: A file closed more times than opened (fs/open.c).
VFS_CLOSE = CrashKind("VFS: Close: file count is 0", (
    TitleFormat(
        title="VFS: Close: file count is 0",
        template="VFS: Close: file count is zero (use-after-free)",
        no_stack_trace=True,
    ),
))


#: Inodes still in use after their file system went (fs/super.c).
VFS_BUSY_INODES = CrashKind("VFS: Busy inodes after unmount", (
    TitleFormat(
        title="VFS: Busy inodes after unmount",
        template="VFS: Busy inodes after unmount (use-after-free)",
        no_stack_trace=True,
    ),
))


#: The Trusty TEE's own panics, printed into the kernel log on Android.
TRUSTY_PANIC = CrashKind("trusty: panic", (
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
))


#: A Go runtime's fatal error (syzkaller's own tools, gVisor).
GO_FATAL_ERROR = CrashKind("fatal error:", (
    TitleFormat(title="fatal error:", template="go runtime error", no_stack_trace=True),
), suppressions=("ALSA", "fatal error: cannot create timer"))


#: Printed by syzkaller itself: the executor's fail() ...
SYZFAIL = CrashKind("SYZFAIL:", (
    TitleFormat(title="SYZFAIL:(.*)", template="SYZFAIL:{1}", no_stack_trace=True),
))


#: ... its log.Fatal ...
SYZFATAL = CrashKind("SYZFATAL:", (
    TitleFormat(title="SYZFATAL:(.*)()", template="SYZFATAL:{1}", alt=("SYZFATAL{2}",),
                no_stack_trace=True),
))


#: ... and a Go panic (gVisor's Sentry's stuck tasks among them).
GO_PANIC = CrashKind("panic:", (
    TitleFormat(title="panic: Sentry detected .* stuck task",
                template="panic: Sentry detected stuck tasks", no_stack_trace=True),
    TitleFormat(title="panic:(.*)", template="panic:{1}", no_stack_trace=True),
), suppressions=("_panic:", "xlog_status:", r"ddb\.onpanic:", "evtlog_status:"))
