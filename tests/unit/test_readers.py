"""The limits on events readers (core/mount/readers.py) and their [mount] settings."""

from __future__ import annotations

import errno

import pytest

from mlfs.base.errors import Refused
from mlfs.config import MountConfig, parse_config
from mlfs.core.mount.readers import FREE_TASKS, ReaderAccounts

LIMITS = MountConfig(max_tasks=64, events_streams_per_uid=3, events_streams=5,
                     events_blocked_reads_per_uid=2, events_blocked_reads=3,
                     handles_per_uid=2, handles=3)


def refused(fn, *args) -> int:
    with pytest.raises(Refused) as caught:
        fn(*args)
    assert caught.value.reason
    return caught.value.errno


def test_streams_per_uid_then_for_all_others_root_unlimited():
    accounts = ReaderAccounts(LIMITS)
    for _ in range(3):
        accounts.open_stream(1000)
    assert refused(accounts.open_stream, 1000) == errno.EMFILE
    accounts.open_stream(1001)
    accounts.open_stream(1001)
    assert refused(accounts.open_stream, 1002) == errno.ENFILE
    for _ in range(100):
        accounts.open_stream(0)
    accounts.close_stream(1000)
    accounts.open_stream(1002)
    assert accounts.stats().streams == 105
    assert accounts.stats().refused_opens == 2


def test_other_files_per_uid_then_for_all_others_root_unlimited_and_apart_from_streams():
    accounts = ReaderAccounts(LIMITS)
    accounts.open_handle(1000)
    accounts.open_handle(1000)
    assert refused(accounts.open_handle, 1000) == errno.EMFILE
    accounts.open_handle(1001)
    assert refused(accounts.open_handle, 1002) == errno.ENFILE
    for _ in range(100):
        accounts.open_handle(0)
    accounts.open_stream(1002), accounts.open_stream(1002)  # counted apart
    accounts.close_handle(1000)
    accounts.open_handle(1002)
    assert (accounts.refused_handles, accounts.refused_opens) == (2, 0)


def test_blocked_reads_per_uid_then_for_all_others_then_the_last_free_tasks():
    accounts = ReaderAccounts(LIMITS)
    accounts.start_wait(1000)
    accounts.start_wait(1000)
    assert refused(accounts.start_wait, 1000) == errno.EAGAIN
    accounts.start_wait(1001)
    assert refused(accounts.start_wait, 1002) == errno.EAGAIN, "all others: 3"
    for _ in range(64 - FREE_TASKS - 3):  # root may take the rest but the last free tasks
        accounts.start_wait(0)
    assert refused(accounts.start_wait, 0) == errno.EAGAIN
    accounts.end_wait(1000)
    accounts.start_wait(1002)  # the last task before the free ones
    assert refused(accounts.start_wait, 1000) == errno.EAGAIN, "no task left but the free"
    accounts.end_wait(0)
    assert refused(accounts.start_wait, 1000) == errno.EAGAIN, "all others: 3 again"
    stats = accounts.stats()
    assert (stats.blocked_reads, stats.refused_reads) == (64 - FREE_TASKS - 1, 5)


@pytest.mark.parametrize("mount", [
    "max_tasks = 8",
    "events_blocked_reads = 500",  # more than max_tasks - 2 * FREE_TASKS
    "events_blocked_reads_per_uid = 300",  # more than events_blocked_reads
    "events_streams_per_uid = 0",
    "events_streams = 10",  # fewer than events_streams_per_uid
])
def test_limits_out_of_range_are_refused_with_the_setting_named(mount):
    with pytest.raises(ValueError, match=mount.split()[0].split("_per_uid")[0]):
        parse_config(f"[mount]\n{mount}\n", "test")
