"""Durable files for the daemon, the fleet and the installer: the rule lives in the ABI.

The one way to write and read files someone else may also write (`write_durably`,
`read_bounded`, `set_aside`, ...) is defined in `mlfs.abi.durable`, the lowest layer,
so that a backend keeping a ledger of kernel originals follows it through the ABI
alone; the shared base offers the same functions (the same objects) to the rest of
mlfs under this name.
"""

from mlfs.abi.durable import (
    DAMAGED_SUFFIX,
    TMP_SUFFIX,
    NotRegular,
    TooLarge,
    UnsafePath,
    fdatasync_file,
    fsync_dir,
    log,
    open_dir,
    open_regular,
    open_regular_at,
    read_bounded,
    set_aside,
    write_at,
    write_durably,
)

__all__ = ["DAMAGED_SUFFIX", "TMP_SUFFIX", "NotRegular", "TooLarge", "UnsafePath",
           "fdatasync_file", "fsync_dir", "log", "open_dir", "open_regular", "open_regular_at",
           "read_bounded", "set_aside", "write_at", "write_durably"]
