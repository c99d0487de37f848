"""syzkaller's crash corpus as golden tests: titles, CORRUPTED flags and guilty files.

Each file of tests/data/syzkaller/linux-report/ and linux-guilty/ is one case, with what
syzkaller's authors expect in its header.  A case listed in known_mismatches.txt must
still differ (when it stops, the fix is to delete its line, so the list only shrinks);
any other case must agree.  The whole corpus parses in a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlfs.crash import parse_log
from mlfs.crash.formats import STACK, CrashKind, Stack, TitleFormat
from mlfs.crash.parse import NO_FRAMES, StackRules, describe
from mlfs.crash.symbols import demangle
from mlfs.kmsg import classify, complete_title
from tests.bench.kmsg_titles import (
    Case,
    differences,
    guilty_cases,
    known_mismatches,
    report_cases,
)

DATA_KMSG = Path(__file__).resolve().parents[1] / "data" / "kmsg"
KNOWN = known_mismatches()
CASES = report_cases() + guilty_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_agrees_with_syzkaller_unless_listed_as_known_mismatch(case: Case) -> None:
    found = differences(case)
    if case.id in KNOWN:
        assert found, (f"{case.id} now agrees with syzkaller: delete its line from "
                       f"tests/data/syzkaller/known_mismatches.txt")
    else:
        assert not found, f"{case.id}: {'; '.join(found)}"


def test_known_mismatches_name_only_existing_cases() -> None:
    assert set(KNOWN) <= {c.id for c in CASES}


def test_titles_the_issue_quoted_misses_as_syzbot_does() -> None:
    """The four misses of issue 52, each now the title syzbot shows."""
    quoted = {"WARNING: kobject bug in br_add_if",
              "KASAN: stack-out-of-bounds Read in xfrm_selector_match",
              "INFO: task hung in p9_fd_close",
              "BUG: stack guard page was hit in rtnl_newlink"}
    cases = [c for c in report_cases() if c.title in quoted and not c.corrupted]
    assert {c.title for c in cases} == quoted
    for case in cases:
        report = parse_log(case.log)
        assert report is not None and report.title == case.title


def test_masks_what_varies_between_two_hits_of_one_bug() -> None:
    log = ("[  10.000000] Kernel panic - not syncing: Attempted to kill init! "
           "exitcode=0x0000000b at ffffffff81234567 cpu 3\n")
    report = parse_log(log)
    assert report is not None
    assert report.title == "kernel panic: Attempted to kill init!"


def test_finds_no_report_in_a_quiet_log() -> None:
    assert parse_log("[    0.000000] Linux version 6.1.0\n[    1.0] eth0: link up\n") is None


def test_names_the_guilty_file_past_headers_and_lib_helpers() -> None:
    log = ("BUG: KASAN: use-after-free in memcmp+0x1/0x2 lib/string.c:861\n"
           "Read of size 1 at addr ffff88801234 by task a/1\n"
           "Call Trace:\n"
           " __dump_stack lib/dump_stack.c:77 [inline]\n"
           " memcmp+0xe3/0x160 lib/string.c:861\n"
           " ip6_send_skb+0x2f5/0x330 include/linux/skbuff.h:12\n"
           " udp_v6_send_skb+0x1/0x2 net/ipv6/udp.c:100\n")
    report = parse_log(log)
    assert report is not None and report.guilty_file == "net/ipv6/udp.c"


def test_a_console_line_of_thousands_of_path_characters_still_parses() -> None:
    # a hex dump without spaces once made the file pattern backtrack for minutes
    log = ("WARNING: CPU: 0 PID: 1 at net/strparser/strparser.c:406 strp_data_ready+0x1/0x2\n"
           + "Code: " + "0123456789abcdef/." * 2000 + "\n"
           + "Call Trace:\n strp_data_ready+0x1/0x2 net/strparser/strparser.c:406\n")
    report = parse_log(log)
    assert report is not None and report.guilty_file == "net/strparser/strparser.c"


@pytest.mark.parametrize(("mangled", "name"), [
    ("_RNvMs3_NtCshgDM7dBCdno_11rust_binder7processNtB5_7Process10update_ref",
     "<rust_binder::process::Process>::update_ref"),
    ("_RNvXs1_CscPPBqWtAqum_11ashmem_rustNtB5_6AshmemNtNtCs43vyB533jt3_6kernel10miscdevice"
     "10MiscDevice4mmap", "<ashmem_rust::Ashmem as kernel::miscdevice::MiscDevice>::mmap"),
    ("_RNvCscSpY9Juk0HT_7___rustc17rust_begin_unwind", "__rustc::rust_begin_unwind"),
    ("_Z8fakeNameiii", "fakeName"),
    ("ext4_writepages", "ext4_writepages"),
    ("_RXbroken", "_RXbroken"),
])
def test_names_mangled_frames_as_their_authors_wrote_them(mangled: str, name: str) -> None:
    assert demangle(mangled) == name


_TOY_RULES = StackRules(starts=(r"Call Trace",), frames=(r"^ *{{FUNC}}",), skip=(r"^helper$",))
_TOY_KIND = CrashKind("OOPS:", (
    TitleFormat(title="OOPS: (.*)", template="oops: {1}", no_stack_trace=True),
    TitleFormat(title="OOPS: bad thing", report="OOPS: bad thing in {{FUNC}}",
                template="bad thing in {2}"),
    TitleFormat(title="OOPS: stuck", template="stuck in {1}",
                stack=Stack(parts=(r"Call Trace", STACK))),
))


def test_the_format_matching_earliest_titles_the_report_and_ties_go_to_the_first() -> None:
    assert describe("OOPS: anything else\n", _TOY_KIND, _TOY_RULES).title == "oops: anything else"
    # both match at the same place: the table's order decides
    assert describe("OOPS: stuck\n", _TOY_KIND, _TOY_RULES).title == "oops: stuck"


def test_a_title_without_the_lines_its_format_needs_is_corrupted() -> None:
    kind = CrashKind("OOPS:", _TOY_KIND.formats[1:2])
    found = describe("OOPS: bad thing happened\n", kind, _TOY_RULES)
    assert found.title == "OOPS: bad thing happened" and found.corrupted


def test_the_guilty_frame_is_the_first_not_skipped_and_none_means_corrupted() -> None:
    kind = CrashKind("OOPS:", _TOY_KIND.formats[2:])
    found = describe("OOPS: stuck\nCall Trace:\n helper+0x1/0x2\n __x64_sys_bind+0x1/0x2\n",
                     kind, _TOY_RULES)
    assert (found.title, found.corrupted) == ("stuck in sys_bind", "")
    cut = describe("OOPS: stuck\nCall Trace:\n helper+0x1/0x2\n", kind, _TOY_RULES)
    assert (cut.title, cut.corrupted) == ("stuck in corrupted", NO_FRAMES)


def test_a_block_gets_syzbots_title_and_a_header_alone_keeps_its_own() -> None:
    header = "WARNING: CPU: 1 PID: 4242 at fs/ext4/inode.c:3640 ext4_set_page_dirty+0x2a/0x40"
    found = classify(header)
    assert complete_title(found.signature, found.kind, [header]) == "WARNING in ext4_set_page_dirty"
    lines = (DATA_KMSG / "softlockup.block").read_text().splitlines()
    found = classify(lines[1])
    assert complete_title(found.signature, found.kind, lines[1:]) == lines[0]
    assert lines[0] == "BUG: soft lockup in wb_workfn"  # the work item, not where it spun
