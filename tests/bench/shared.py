"""What the kernel-log and capture benches share: a sysctl changed for a run and put back,
and the results printed and written the one way.

`printk_devkmsg` exists because a bench that floods /dev/kmsg from one open file needs
`kernel.printk_devkmsg = on` (under `ratelimit`, the default, the kernel drops all but 10
writes per 5 s of one open file), and a machine left at `on` lets any root process flood
the log unannounced: the original value goes back whatever happens inside the block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PRINTK_DEVKMSG = Path("/proc/sys/kernel/printk_devkmsg")
#: the values the kernel accepts (kernel/printk/printk.c, `devkmsg_sysctl_set_loglvl`)
PRINTK_DEVKMSG_VALUES = ("on", "off", "ratelimit")


@contextmanager
def printk_devkmsg(value: str, sysctl: Path = PRINTK_DEVKMSG) -> Iterator[str]:
    """`kernel.printk_devkmsg` set to `value` inside the block, its original value (which
    is yielded) written back on the way out, by an exception too.

    A value the kernel does not take is refused before anything is changed."""
    if value not in PRINTK_DEVKMSG_VALUES:
        raise ValueError(f"printk_devkmsg: {value!r} is not one of {PRINTK_DEVKMSG_VALUES}")
    original = sysctl.read_text().strip()
    sysctl.write_text(value + "\n")
    try:
        yield original
    finally:
        sysctl.write_text(original + "\n")


def emit(results: dict, json_path: str | None) -> dict:
    """`results` printed as JSON, and written to `json_path` when one was given."""
    text = json.dumps(results, indent=1)
    print(text)
    if json_path:
        Path(json_path).write_text(text + "\n")
    return results
