"""The kernel log's rules: records parsed, kinds, devices and titles from the kernel's formats."""

import random
import string
from pathlib import Path

import pytest

from mlfs.kmsg import (
    BUDGETS,
    DUPLICATE_SIMILARITY,
    MAX_ALIASES,
    MAX_REPORTS,
    Blocks,
    Report,
    Reports,
    classify,
    mask,
    parse_record,
    printable,
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


def test_reports_are_counted_and_repeats_rate_limited():
    reports = Reports("6.1.0", "host")
    report, status = reports.seen("warning", "WARNING in f", ["WARNING: ..."], 100.0)
    assert status == "new" and report.id == signature_id("warning", "WARNING in f")
    assert reports.seen("warning", "WARNING in f", [], 110.0)[1] == "quiet"
    assert reports.seen("warning", "WARNING in f", [], 1000.0)[1] == "repeat"
    assert report.count == 3 and report.first_seen == 100.0 and report.last_seen == 1000.0
    assert reports.seen("other", "random: crng init done", [], 1.0) == (None, "quiet")


def test_no_number_of_user_triggered_reports_evicts_or_blocks_a_kernel_report():
    """600 `segfault in junkNNNN` (any user, red team K12) once filled every slot: the
    kernel's oops after them was neither stored nor announced."""
    reports = Reports("6.1.0", "host")
    oops, _ = reports.seen("oops", "BUG: kernel NULL pointer dereference in f", [], 1.0)
    for i in range(600):
        reports.seen("segfault", f"segfault in junk{i}", [], 2.0 + i)
    assert oops.id in reports.by_id
    later, status = reports.seen("bug", "BUG: unable to handle page fault in rt3_real",
                                 [], 700.0)
    assert status == "new" and later.id in reports.by_id
    user = [r for r in reports.by_id.values() if r.kind == "segfault"]
    assert len(user) == BUDGETS["user"] and reports.evicted["user"] == 600 - BUDGETS["user"]
    # the least recent gave way: the newest segfaults are the ones kept
    assert {r.title for r in user} == {f"segfault in junk{i}"
                                       for i in range(600 - BUDGETS["user"], 600)}
    assert len(reports.by_id) <= MAX_REPORTS


def test_a_full_kernel_budget_evicts_its_least_recent_report_and_counts_it():
    reports = Reports("6.1.0", "host")
    kept = []
    i = 0
    while len(reports.by_id) < BUDGETS["kernel"]:
        report, status = reports.seen("warning", f"WARNING in fn_{i}_{i * 7919}", [],
                                      float(i))
        kept += [report.id] if status == "new" else []
        i += 1
    first, second = kept[:2]
    reports.seen("warning", reports.by_id[first].title, [], 1e6)  # now the most recent
    _, status = reports.seen("oops", "BUG: kernel NULL pointer dereference in g", [], 2e6)
    assert status == "new"
    assert first in reports.by_id and second not in reports.by_id
    assert reports.evicted == {"kernel": 1, "user": 0}
    # user space writing a WARNING into /dev/kmsg (facility user) spends the user budget
    fake, _ = reports.seen("warning", "WARNING in written_by_root", [], 3e6, origin="user")
    assert fake.budget == "user" and reports.evicted["kernel"] == 1


def test_a_storm_of_similar_titles_keeps_aliases_and_the_index_bounded():
    """20,000 distinct titles once gave 20,000 aliases and a TF-IDF refit per title (red
    team K11); the cost per title is bounded by the reports kept (tests/bench/kmsg_storm.py
    measures the time on a mount)."""
    reports = Reports("6.1.0", "host")
    rng = random.Random(7)
    for i in range(20_000):
        word = "".join(rng.choices(string.ascii_lowercase, k=6))
        reports.seen("bug", f"BUG: alpha bravo charlie delta echo {word}", [], float(i))
    assert len(reports.aliases) <= MAX_ALIASES
    assert len(reports.by_id) <= MAX_REPORTS
    assert sum(len(s) for s in reports.similar.values()) <= MAX_REPORTS
    # every title is in a kept report or went with an evicted one, and evictions are counted
    kept = sum(r.count for r in reports.by_id.values())
    assert kept + sum(reports.evicted.values()) <= 20_000
    assert kept == 20_000 or sum(reports.evicted.values()) > 0


def test_the_kernels_escaped_bytes_are_utf8_and_controls_never_reach_a_title():
    """The kernel escapes each byte >= 0x80 as \\xNN (red team K3: é came back as Ã©) and
    each control byte (K2: a comm with ESC sequences set the title of the terminal
    running `mlfs reports`)."""
    record = parse_record(b"4,1,2,-;WARNING: bad utf8 \\xff\\xfe valid \\xc3\\xa9 end")
    assert record.message == "WARNING: bad utf8 \\xff\\xfe valid \u00e9 end"
    record = parse_record(b"4,2,3,-;\\x1b]0;PWNED\\x07\\x1b[2Jred[77]: segfault at 0 ip 1"
                          b" sp 2 error 4")
    assert record.message.startswith("\x1b]0;PWNED\x07")  # the record is the kernel's
    report, _ = Reports("6.1.0", "host").seen("segfault", classify(record.message).signature,
                                              [record.message], 1.0)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in report.title)
    assert "\\x1b]0;PWNED\\x07" in report.title
    assert "\x1b" not in report.text() and "\x07" not in report.text()
    assert printable("a\u202eb\tc") == "a\\u202eb\\x09c"


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
        == "COMM[PID]: segfault at 0 ip ADDR in PATH"
    assert private_masked("segfault in mysqld") == "segfault in COMM"
    assert "alice" not in private_masked("Out of memory: Killed process 42 (alice-job)")


def test_mlfs_reports_prints_no_terminal_control_sequence():
    """`mlfs reports` prints titles and examples (red team K2): escaped, as dmesg does."""
    from mlfs.cli.kernel_reports import render_html, render_text

    title = "segfault in \x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mred"
    item = {"hosts": 1, "count": 2, "kind": "segfault", "title": title,
            "example": "\x1b[2Jx", "first_seen": "", "last_seen": ""}
    for out in (render_text([item]), render_html([item], "reports")):
        assert "\x1b" not in out and "\x07" not in out
        assert "\\x1b]0;PWNED-TITLE\\x07" in out
    assert "\x1b" not in private_masked(title)


def test_a_report_names_the_guilty_file_as_syzkallers_corpus_does_and_keeps_it():
    """Each log of syzkaller's guilty corpus names its file on the first line; a report
    the daemon makes of the block carries it, in its file and across a restart."""
    corpus = Path(__file__).resolve().parents[1] / "data" / "syzkaller" / "linux-guilty"
    source = (corpus / "0").read_text()
    expected = source.splitlines()[0].removeprefix("FILE: ").strip()
    block = [line for line in source.split("\n\n", 1)[1].splitlines() if line.strip()]
    reports = Reports("6.1.0", "host")
    report, status = reports.seen("bug", "KASAN: use-after-free in ip6_send_skb", block, 1.0)
    assert status == "new" and report.guilty_file == expected == "net/ipv6/ip6_output.c"
    assert f"guilty_file: {expected}" in report.text()
    again = Reports("6.1.0", "host")
    again.load(reports.to_json())
    assert again.by_id[report.id].guilty_file == expected


def test_a_report_file_reads_back_as_the_report_it_was_written_from():
    """`mlfs reports` reads the mount's report files through `Report.from_text`, the
    inverse of `Report.text` beside it: one report type, no second parser."""
    reports = Reports("6.1.0", "host-a")
    block = ["WARNING: CPU: 0 PID: 1 at fs/ext4/inode.c:1 ext4_writepages+0x1/0x2",
             "Call Trace:", " ext4_writepages+0x1/0x2", " do_writepages+0x3/0x4"]
    report, _ = reports.seen("warning", "WARNING in ext4_writepages", block, 1_700_000_000.0)
    reports.seen("warning", "WARNING in ext4_writepages", block, 1_700_000_100.0)
    back = Report.from_text(report.id, report.text())
    assert (back.id, back.kind, back.title, back.count, back.release, back.host) == \
        (report.id, "warning", "WARNING in ext4_writepages", 2, "6.1.0", "host-a")
    assert (back.first_seen, back.last_seen) == (1_700_000_000.0, 1_700_000_100.0)
    assert back.block == block and back.guilty_file == report.guilty_file
