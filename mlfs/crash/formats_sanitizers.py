# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""The sanitizers' reports: KASAN, KMSAN, KCSAN and KFENCE (``BUG:``) and UBSAN.

Titled by what was accessed wrongly and in which function (`mlfs.crash.formats` puts
them in the table's order).
"""

from __future__ import annotations

from mlfs.crash.schema import CALL_TRACE, STACK, CrashKind, Stack, TitleFormat

#: BUG: KASAN, KMSAN, KCSAN and KFENCE reports
BUG_SANITIZERS = (
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
)


#: The undefined-behaviour sanitizer (lib/ubsan.c).
UBSAN = CrashKind("UBSAN:", (
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
))
