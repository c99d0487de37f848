# ruff: noqa: E501 -- the patterns are the kernel's own lines; cut, they would not read as such
"""Memory management's own checks: bad page and mm state, leaks, the stack guard page,
allocation warnings, SLUB's and slab debugging's reports.

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

#: BUG: an mm, dentry or page in a bad state
BUG_MM_STATE = (
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
)


#: BUG: kmemleak's leaks and the stack guard page hit
BUG_LEAK_AND_GUARD = (
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
)


#: WARNING: allocation warnings (mm/)
WARNING_ALLOC = (
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
)


#: INFO: slab debugging's allocation and free traces
INFO_SLAB_DEBUG = (
    TitleFormat(
        title="INFO: (Freed|Allocated) in (.*)",
        template="INFO: {1} in {2}",
        corrupted=True,
    ),
)


#: SLUB's consistency checks (mm/slub.c).
SLUB_DOUBLE_FREE = CrashKind("BUG kmalloc-", (
    TitleFormat(
        title="BUG kmalloc-.*: Object already free",
        template="BUG: Object already free",
    ),
))
