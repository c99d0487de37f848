"""What leaves the host with `mlfs fleet push`: the kernel's words, never a user's.

tests/data/kmsg-private/records.txt holds kernel log records that carry private data
(the red team's 16 records of K14, then more: audit, OOM, USB, Wi-Fi, NFS, CIFS,
Bluetooth); secrets.txt the strings of which nothing may survive.  Masking is an
allow-list (`mlfs.kmsg.private_masked`), so a record format nobody thought of ships
as WORD placeholders, not as the user's text."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from mlfs.fleet.host import shipped_table
from mlfs.kmsg import classify, private_masked

DATA = Path(__file__).resolve().parent.parent / "data" / "kmsg-private"
RECORDS = [line for line in (DATA / "records.txt").read_text().splitlines()
           if line and not line.startswith("#")]
SECRETS = [line for line in (DATA / "secrets.txt").read_text().splitlines() if line]
HOST = {"host_id": "h-0123456789ab", "host_name": "alice-laptop.acme-corp.internal",
        "kernel_release": "6.18.44", "machine": "x86_64", "mlfs_version": "0"}


@pytest.mark.parametrize("record", RECORDS, ids=[r[:40] for r in RECORDS])
def test_no_private_string_survives_the_mask(record):
    shipped = private_masked(record)
    assert [s for s in SECRETS if s in shipped] == [], shipped


def test_nothing_private_survives_a_push_and_the_host_ships_as_its_id():
    rows = pa.table({
        "message": RECORDS,
        "signature": [classify(r).signature for r in RECORDS],
        "dict_device": ["+usb:1-1"] * len(RECORDS),
        "seq": list(range(len(RECORDS))),
    })
    shipped = shipped_table(rows, HOST, private=True)
    text = repr(shipped.to_pylist())
    assert [s for s in SECRETS + ["alice-laptop"] if s in text] == []
    assert set(shipped.column("host_name").to_pylist()) == {HOST["host_id"]}
    # a subsystem that is not private ships as it is
    assert shipped_table(rows, HOST, private=False).column("message").to_pylist() == RECORDS


def test_the_kernels_words_and_symbols_ship_as_they_are():
    """The allow-list keeps what a maintainer needs: kinds, functions, files, devices."""
    for message in ("WARNING: CPU: 0 PID: 1 at fs/ext4/inode.c:123 ext4_writepages+0x1/0x2",
                    "I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0",
                    "Call Trace:", " jbd2_journal_commit_transaction+0x10/0x20",
                    "BUG: KASAN: slab-out-of-bounds in memcmp"):
        shipped = private_masked(message)
        assert "WORD" not in shipped and "PATH" not in shipped, shipped
    assert private_masked("WARNING: CPU: 0 PID: 1 at fs/ext4/inode.c:123 f+0x1/0x2") == \
        "WARNING: CPU: 0 PID: PID at fs/ext4/inode.c:123 f+0x1/0x2"
