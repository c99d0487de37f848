"""linux.kmsg across ticks: a report's records may span ticks, a tick may fail, the ring
may overrun the reader, the cursor may be damaged.  `LinuxKmsg.step` is fed through a
replaced `read_records` (or a replaced `os` for `read_records` itself), on a fake clock,
so none of this needs root or a CPU of any speed."""

from __future__ import annotations

import errno
import json
import logging
from types import SimpleNamespace

import backends.linux.kmsg as kmsg
from mlfs.kmsg import parse_record


def _feed(monkeypatch, batches):
    it = iter(batches)

    def fake_read_records(fd, limit, after, last_seq):
        recs = [parse_record(r) for r in next(it, [])]
        return recs, 0, (recs[-1].seq if recs else last_seq)
    monkeypatch.setattr(kmsg, "read_records", fake_read_records)


def _rec(seq, text, ts_usec=None, prio=4):
    return f"{prio},{seq},{seq * 1000 if ts_usec is None else ts_usec},-;{text}".encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _subsystem(clock: Clock, **kwargs) -> kmsg.LinuxKmsg:
    sub = kmsg.LinuxKmsg(path="/dev/null", start="boot", **kwargs)
    sub._clock = clock
    return sub


def _kinds(sub):
    return {r.kind: r for r in sub.reports.by_id.values()}


HUNG = ["INFO: task jbd2/sda1-8:123 blocked for more than 120 seconds.", "Call Trace:",
        " jbd2_journal_commit_transaction+0x10/0x20"]


def test_a_block_with_no_end_marker_closes_after_a_quiet_interval_not_an_idle_tick(
        monkeypatch):
    """A hung-task report has no end marker: it is made once nothing came for the quiet
    interval, whatever the number of idle ticks in between (an idle tick once raised
    IndexError and lost the report: red team K7)."""
    clock = Clock()
    sub = _subsystem(clock)
    _feed(monkeypatch, [[_rec(1 + i, line) for i, line in enumerate(HUNG)], [], [], []])
    sub.step({})
    clock.now += 0.1
    sub.step({})  # an idle tick: the block may not be complete yet
    assert "hung_task" not in _kinds(sub)
    clock.now += kmsg.Blocks.QUIET_SECONDS
    sample = sub.step({})
    report = _kinds(sub)["hung_task"]
    assert report.title == "INFO: task hung in jbd2_journal_commit_transaction"
    assert sample.extra["reports"][0]["report"] == report.id
    assert sample.records is None  # nothing new: no rows, and nothing relabelled


def test_records_of_the_tick_that_closes_an_earlier_block_are_kept(monkeypatch):
    """The tick that closes a block opened in an earlier tick keeps all its own rows, and
    only its own rows of the block get the completed title."""
    clock = Clock()
    sub = _subsystem(clock)
    _feed(monkeypatch, [
        [_rec(10, "WARNING: CPU: 0 PID: 1 at mm/x.c:1 first_block+0x1/0x2"),
         _rec(11, "Call Trace:")],
        [_rec(12, "WARNING: CPU: 0 PID: 1 at mm/x.c:1 second_block+0x1/0x2"),
         _rec(13, "an unrelated record")],
    ])
    first = sub.step({})
    assert first.records.column("seq").to_pylist() == [10, 11]
    sample = sub.step({})
    assert sample.records.column("seq").to_pylist() == [12, 13]
    assert sample.records.column("signature").to_pylist()[0] == "WARNING in second_block"
    assert "WARNING in first_block" in {r.title for r in sub.reports.by_id.values()}


def test_a_report_split_across_ticks_gets_the_function_of_its_later_lines(monkeypatch):
    """A BUG header, then its RIP line a tick later (the red team's 0.5 s pause): the
    report is one, named by the RIP line; the rows of each tick keep the title of their
    tick and all rows carry the block's first seq."""
    clock = Clock()
    sub = _subsystem(clock)
    _feed(monkeypatch, [
        [_rec(20, "BUG: unable to handle page fault for address: ffffffffc0001234")],
        [],
        [_rec(21, "RIP: 0010:rt3_split_oops+0x1a/0x30"),
         _rec(22, "---[ end trace 0000000000000000 ]---")],
    ])
    sub.step({})
    clock.now += 0.5
    sub.step({})
    clock.now += 0.1
    sample = sub.step({})
    titles = [r.title for r in sub.reports.by_id.values()]
    assert titles == ["BUG: unable to handle kernel paging request in rt3_split_oops"]
    assert sample.records.column("block").to_pylist() == [20, 20]
    assert set(sample.records.column("signature").to_pylist()) == {titles[0]}


def test_a_tick_whose_classification_fails_still_hands_over_its_records(monkeypatch,
                                                                         caplog):
    """Records read from the ring are gone from it: a bug in classifying them must not
    drop them (they go out as plain rows, and the next tick works again)."""
    clock = Clock()
    sub = _subsystem(clock)
    _feed(monkeypatch, [[_rec(30, "random: one"), _rec(31, "random: two")],
                        [_rec(32, "random: three")]])

    def broken(message):
        raise RuntimeError("a bug in a title rule")
    real = kmsg.classify
    monkeypatch.setattr(kmsg, "classify", broken)
    with caplog.at_level(logging.ERROR):
        sample = sub.step({})
    assert sample.records.column("seq").to_pylist() == [30, 31]
    assert sample.records.column("message").to_pylist() == ["random: one", "random: two"]
    assert "records not classified" in caplog.text
    monkeypatch.setattr(kmsg, "classify", real)
    assert sub.step({}).records.column("seq").to_pylist() == [32]


def test_a_report_is_dated_by_its_records_not_by_when_they_were_read(monkeypatch):
    clock = Clock()
    sub = _subsystem(clock)
    _feed(monkeypatch, [[_rec(40, "traps: junk[42] trap invalid opcode ip:1 sp:2",
                              ts_usec=5_000_000)],
                        [_rec(41, "traps: junk[43] trap invalid opcode ip:1 sp:2",
                              ts_usec=9_000_000)]])
    sub.step({})
    sub.step({})
    report = next(iter(sub.reports.by_id.values()))
    assert report.count == 2
    assert report.first_seen == sub._wall_offset + 5.0
    assert report.last_seen == sub._wall_offset + 9.0


def _fake_os(script):
    """An `os` whose read(2) plays `script`: bytes are records, an int an errno."""
    it = iter(script)

    def read(fd, size):
        item = next(it, None)
        if item is None:
            raise BlockingIOError
        if isinstance(item, int):
            raise OSError(item, "fake")
        return item
    return SimpleNamespace(read=read)


def test_every_gap_of_an_overrun_read_is_counted_whole(monkeypatch):
    """Gaps of 99 and 98 records in one read are 197 lost (not 97: red team K10)."""
    monkeypatch.setattr(kmsg, "os", _fake_os([
        _rec(1, "a"), errno.EPIPE, _rec(101, "b"), errno.EPIPE, _rec(200, "c"),
        _rec(201, "d")]))
    records, lost, last = kmsg.read_records(0, 100, -1, 0)
    assert [r.seq for r in records] == [1, 101, 200, 201]
    assert (lost, last) == (197, 201)


def test_a_cursor_past_the_newest_record_is_set_aside_and_logged(tmp_path, caplog):
    """`seq: 10**30` in a cursor of this boot once skipped every record of the boot
    silently (red team K15)."""
    state = tmp_path / "backends" / "linux.kmsg" / "linux.kmsg.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"boot_id": kmsg._boot_id(), "seq": 10**30,
                                 "reports": []}))
    with caplog.at_level(logging.WARNING):
        sub = kmsg.LinuxKmsg(path="/dev/null", start="boot", state_dir=tmp_path)
    assert sub._skip_to == -1 and sub._last_seq is None
    assert state.with_suffix(".damaged").exists()
    assert "set aside" in caplog.text and "past the newest record" in caplog.text
    sub.close()
