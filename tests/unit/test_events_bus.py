"""The event bus: cursors from "now", filtering, bounded queues, overflow markers."""

from __future__ import annotations

import json
import re

from mlfs.core.mount.events import EventBus

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")


def lines(data: bytes) -> list[dict]:
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode().splitlines()]


def drain(sub, size: int = 1 << 20) -> list[dict]:
    out = []
    while sub.has_data():
        out += lines(sub.take(size))
    return out


def test_a_new_subscriber_starts_at_now():
    bus = EventBus()
    bus.publish("a", "portion", path="a/dataset/1", rows=1)
    sub = bus.subscribe()
    assert not sub.ready()
    bus.publish("a", "portion", path="a/dataset/2", rows=2)
    (event,) = drain(sub)
    assert event["path"] == "a/dataset/2"
    assert event["seq"] == 2


def test_every_event_has_seq_ts_subsystem_and_event():
    bus = EventBus()
    sub = bus.subscribe()
    record = bus.publish("sim", "mode", model="m", **{"from": "learning", "to": "emergency"})
    (event,) = drain(sub)
    assert event == record
    assert RFC3339.match(event["ts"])
    assert {"seq", "ts", "subsystem", "event", "from", "to", "model"} <= set(event)


def test_a_subsystem_stream_gets_only_its_events_and_seq_is_global():
    bus = EventBus()
    everything = bus.subscribe()
    only_a = bus.subscribe("a")
    for name in ("a", "b", "a", "b", "b", "a"):
        bus.publish(name, "portion", path=f"{name}/dataset/x", rows=1)
    a_events = drain(only_a)
    assert [e["subsystem"] for e in a_events] == ["a", "a", "a"]
    assert [e["seq"] for e in a_events] == [1, 3, 6], "a filtered stream shows gaps"
    assert [e["seq"] for e in drain(everything)] == [1, 2, 3, 4, 5, 6]


def test_a_reader_that_falls_behind_gets_one_overflow_line_then_the_oldest_kept():
    """As on /dev/kmsg: the oldest unread events are overwritten, the reader is told."""
    bus = EventBus(capacity=5)
    slow = bus.subscribe()
    for i in range(12):
        bus.publish("s", "recommendation", model="m", id=i, status="accepted", reason="")
    events = drain(slow)
    assert events[0]["event"] == "overflow"
    assert events[0]["lost"] == 7
    assert events[0]["seq"] == 7, "the overflow line carries the last lost seq"
    assert RFC3339.match(events[0]["ts"]), "an overflow line is an event like any other"
    assert events[0]["subsystem"] is None
    assert [e["id"] for e in events[1:]] == [7, 8, 9, 10, 11]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events), "seq still rises"
    bus.publish("s", "recommendation", model="m", id=99, status="accepted", reason="")
    (after,) = drain(slow)
    assert after["id"] == 99, "the overflow marker is sent once"


def test_the_producer_never_blocks_and_other_readers_lose_nothing():
    bus = EventBus(capacity=3)
    stuck = bus.subscribe()
    keeping_up = bus.subscribe("s")
    got = []
    for i in range(50):
        bus.publish("s", "portion", path=str(i), rows=i)
        got += drain(keeping_up)
    assert [e["rows"] for e in got] == list(range(50))
    assert stuck.lost == 47
    first = drain(stuck)[0]
    assert first == {**first, "event": "overflow", "lost": 47, "subsystem": None}


def test_overflow_line_of_a_filtered_stream_names_its_subsystem():
    bus = EventBus(capacity=1)
    sub = bus.subscribe("sim.readahead")
    for _ in range(3):
        bus.publish("sim.readahead", "portion", path="p", rows=1)
    bus.publish("other", "portion", path="p", rows=1)
    events = drain(sub)
    assert events[0]["event"] == "overflow"
    assert events[0]["subsystem"] == "sim.readahead"
    assert events[0]["lost"] == 2, "events of other subsystems are not counted as lost"


def test_take_returns_whole_lines_up_to_the_size_asked():
    bus = EventBus()
    sub = bus.subscribe()
    for i in range(3):
        bus.publish("s", "portion", path="p" * 10, rows=i)
    first_len = len(bus._log(None).line(0))
    data = sub.take(first_len * 2 + 5)
    assert data.count(b"\n") == 2
    assert len(data) <= first_len * 2 + 5
    assert len(drain(sub)) == 1


def test_a_read_smaller_than_the_next_line_gets_it_in_pieces_never_more_than_asked():
    """A reply longer than the read's size fails the FUSE read with EIO (seen live)."""
    bus = EventBus(capacity=2)
    sub = bus.subscribe()
    for i in range(4):  # two are kept, two are lost: the overflow marker comes first
        bus.publish("s", "recommendation", model="m" * 30, id=i, status="accepted",
                    reason="r" * 40)
    pieces = []
    while sub.has_data():
        piece = sub.take(16)
        assert 0 < len(piece) <= 16
        pieces.append(piece)
    events = lines(b"".join(pieces))
    assert [e["event"] for e in events] == ["overflow", "recommendation", "recommendation"]
    assert [e["id"] for e in events[1:]] == [2, 3]


def test_close_wakes_readers_and_marks_them_ready_for_end_of_file():
    bus = EventBus()
    sub = bus.subscribe()
    woken = []
    sub.wait_with(lambda: woken.append(True))
    bus.close()
    assert woken and sub.ready() and sub.closed
    assert not sub.has_data()
    late = bus.subscribe()
    assert late.closed, "a subscriber after shutdown sees end of file at once"


def test_unsubscribed_readers_get_nothing_and_are_not_counted():
    bus = EventBus()
    sub = bus.subscribe()
    assert bus.subscriber_count == 1
    sub.unsubscribe()
    assert bus.subscriber_count == 0
    bus.publish("s", "portion", path="p", rows=1)
    assert not sub.ready()
    assert bus.published == 1
    assert bus.by_kind["portion"] == 1


def test_a_waiting_reader_is_woken_once_by_the_next_event_of_its_stream():
    bus = EventBus(capacity=1)
    sub = bus.subscribe("s")
    calls = []
    sub.wait_with(lambda: calls.append(1))
    bus.publish("other", "portion", path="p", rows=1)
    assert calls == [], "another subsystem's event does not wake a filtered reader"
    for _ in range(3):  # the log is full after the first: still woken, once
        bus.publish("s", "portion", path="p", rows=1)
    assert calls == [1]
    sub.wait_with(lambda: calls.append(2))
    bus.publish("s", "portion", path="p", rows=1)
    assert calls == [1, 2]


def test_a_cancelled_wait_is_not_run_and_unread_readers_cost_the_producer_nothing():
    bus = EventBus(capacity=100)
    idle = [bus.subscribe() for _ in range(1000)]
    waiting = bus.subscribe()
    calls = []

    def waker():
        calls.append(1)

    waiting.wait_with(waker)
    waiting.cancel_wait(waker)
    for i in range(500):
        bus.publish("s", "portion", path="p", rows=i)
    assert calls == []
    assert all(log.waiting == set() for log in bus._logs.values())
    assert sum(len(log._slots) for log in bus._logs.values()) == 200, \
        "one global and one subsystem log of 100 lines, whatever the number of readers"
    assert all(sub.lost == 400 for sub in idle)
    assert drain(idle[0])[0]["lost"] == 400


def test_private_events_reach_only_readers_allowed_to_read_private_files():
    """A `report` event of linux.kmsg carries the report's title: it goes to the readers
    that may read the reports (root, the mount's group), and no other reader sees a trace
    of it, not even a wake-up (red team K13)."""
    bus = EventBus(capacity=8)
    member = bus.subscribe("linux.kmsg")
    outsider = bus.subscribe("linux.kmsg", private_ok=False)
    outsider_all = bus.subscribe(None, private_ok=False)
    bus.publish("linux.kmsg", "report", private=True, title="segfault in alicejob")
    assert not outsider.has_data() and not outsider_all.has_data()
    assert outsider.take(4096) == b"" and outsider_all.take(4096) == b""
    bus.publish("linux.kmsg", "tick", tick=1)
    assert b"alicejob" in member.take(4096)
    for sub in (outsider, outsider_all):
        lines = sub.take(4096).splitlines()
        assert [json.loads(line)["event"] for line in lines] == ["tick"]
