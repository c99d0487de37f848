"""The kernel log's rules: records parsed, kinds, devices and titles from the kernel's formats."""

from pathlib import Path

import pytest

from mlfs.kernel_log import (
    DUPLICATE_SIMILARITY,
    MAX_REPORTS,
    Blocks,
    Reports,
    classify,
    mask,
    parse_record,
    private_masked,
    signature_id,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "kmsg"
FORMATS = [line.split("\t") for line in (DATA / "formats.tsv").read_text().splitlines()]


@pytest.mark.parametrize("kind, device, signature, message", FORMATS,
                         ids=[f[3][:40] for f in FORMATS])
def test_each_kernel_format_gives_its_kind_device_and_title(kind, device, signature, message):
    found = classify(message)
    assert (found.kind, found.device or "-", found.signature) == (kind, device, signature)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.block")))
def test_a_multi_record_report_gets_its_function_when_it_ends(name):
    title, *lines = (DATA / name).read_text().splitlines()
    blocks = Blocks()
    ended = None
    for seq, line in enumerate(lines):
        first, done = blocks.feed(seq, line, classify(line))
        assert first == 0  # every line belongs to the block the header opened
        ended = done or ended
    ended = ended or blocks.idle()
    assert ended.title == title and ended.first_seq == 0 and len(ended.lines) == len(lines)


def test_a_dev_kmsg_record_with_its_dictionary_is_parsed():
    record = parse_record(b"3,1234,5678901,-,caller=T1;I/O error, dev loop0, sector 8 op 0x0"
                          b":(READ)\n SUBSYSTEM=block\n DEVICE=+block:loop0\n")
    assert (record.seq, record.ts_usec, record.level, record.facility) == (1234, 5678901, 3, 0)
    assert record.fields == {"SUBSYSTEM": "block", "DEVICE": "+block:loop0"}
    assert not record.continuation
    assert parse_record(b"14,9,10,c;hello \\x1b[0m").message == "hello \x1b[0m"
    assert parse_record(b"not a record") is None


def test_titles_mask_what_varies_between_machines():
    assert mask("lost 12 pages at 0xffff888012345678 on loop3 [1234]") == \
        "lost NUM pages at ADDR on loop#"
    assert classify("I/O error, dev loop7, sector 1 op 0x0:(READ)").signature == \
        classify("I/O error, dev loop12, sector 99 op 0x1:(WRITE)").signature


def test_reports_are_bounded_and_repeats_rate_limited():
    reports = Reports("6.1.0", "host")
    report, status = reports.seen("warning", "WARNING in f", ["WARNING: ..."], 100.0)
    assert status == "new" and report.id == signature_id("warning", "WARNING in f")
    assert reports.seen("warning", "WARNING in f", [], 110.0)[1] == "quiet"
    assert reports.seen("warning", "WARNING in f", [], 1000.0)[1] == "repeat"
    assert report.count == 3 and report.first_seen == 100.0 and report.last_seen == 1000.0
    for i in range(MAX_REPORTS + 10):
        reports.seen("segfault", f"segfault in cmd{i}", [], 1.0)
    assert len(reports.by_id) == MAX_REPORTS and reports.overflow == 11
    assert reports.seen("other", "random: crng init done", [], 1.0) == (None, "quiet")


def test_a_title_that_differs_only_in_noise_joins_the_known_report():
    trace = ["Call Trace:", " ext4_writepages+0x1/0x2", " do_writepages+0x3/0x4",
             " __writeback_single_inode+0x5/0x6", " writeback_sb_inodes+0x7/0x8"]
    reports = Reports("6.1.0", "host")
    first, status = reports.seen("warning", "WARNING in ext4_writepages",
                                 ["WARNING: ..."] + trace, 1.0)
    assert status == "new"
    again, status = reports.seen("warning", "WARNING in ext4_writepages.cold",
                                 ["WARNING: ..."] + trace, 2.0)
    assert status == "duplicate" and again is first and first.count == 2
    assert reports.last_similarity[0] >= DUPLICATE_SIMILARITY
    other, status = reports.seen("warning", "WARNING in tcp_sendmsg",
                                 ["WARNING: ...", "Call Trace:", " tcp_sendmsg+0x1/0x2",
                                  " sock_sendmsg+0x3/0x4"], 3.0)
    assert status == "new" and other is not first


def test_what_ships_beyond_the_host_masks_users():
    assert private_masked("mysqld[1234]: segfault at 0 ip 00007f1234567890 in /home/alice/x") \
        == "COMM: segfault at 0 ip ADDR in /home/USER/x"
    assert private_masked("segfault in mysqld") == "segfault in COMM"
    assert "alice" not in private_masked("Out of memory: Killed process 42 (alice-job)")
