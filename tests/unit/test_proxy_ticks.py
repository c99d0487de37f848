"""The proxy's tick decisions in virtual time: shares per mode, default ticks, feedback.

These drive `SubsystemRuntime.tick()` directly on the simulated readahead
subsystem with a temporary state directory: no mount, no trio, no wall clock.
"""

from __future__ import annotations

import errno
import math

import pyarrow as pa
import pytest
from mlfs.backends.sim_readahead import SimReadahead

from mlfs.base.errors import Refused
from mlfs.config import parse_config
from mlfs.core.models.proxy import ModelProxy
from mlfs.core.mount.exchange import Exchange
from mlfs.core.mount.runtime import SubsystemRuntime

CONFIG = """
[modes]
silence_seconds = 600.0
"""


@pytest.fixture
def runtime(tmp_path) -> SubsystemRuntime:
    exchange = Exchange(parse_config(CONFIG, "test"), tmp_path, [SimReadahead(seed=1)])
    rt = exchange.runtimes["sim.readahead"]
    yield rt
    rt.close()


def started_model(rt: SubsystemRuntime, name: str = "m", mode: str | None = None
                  ) -> ModelProxy:
    proxy = rt.create_model(name)
    proxy.start()
    if mode:
        proxy.set_mode(mode.encode() + b"\n")
    return proxy


def run(rt: SubsystemRuntime, ticks: int) -> pa.Table:
    """Run `ticks` ticks and return the dataset rows they produced."""
    first = rt.next_tick
    for _ in range(ticks):
        rt.tick()
    rt.dataset.seal_now()
    table = rt.dataset.read_all()
    mask = pa.compute.greater_equal(table.column("tick"), first)
    return table.filter(mask)


def controllers(table: pa.Table) -> list[str]:
    return table.column("controller").to_pylist()


@pytest.mark.parametrize("mode, ml_ticks", [
    ("learning", 100),
    ("collaboration", 500),
    ("recommendation", 950),
    ("emergency", 0),
])
def test_share_of_ml_ticks_per_mode_is_exact_with_a_valid_recommendation(runtime, mode,
                                                                          ml_ticks):
    proxy = started_model(runtime, mode=mode if mode != "emergency" else None)
    proxy.recommend(b"read_ahead_kb=512\n")
    if mode == "emergency":
        proxy.set_mode(b"emergency\n")
    rows = run(runtime, 1000)
    assert rows.num_rows == 1000
    assert controllers(rows).count("ml") == ml_ticks
    assert proxy.ml_ticks == ml_ticks
    assert set(rows.column("mode").to_pylist()) == {mode}
    ml_knobs = {k for k, c in zip(rows.column("knob_read_ahead_kb").to_pylist(),
                                  controllers(rows), strict=True) if c == "ml"}
    assert ml_knobs <= {512}


def test_collaboration_interleaves_ml_and_default_ticks(runtime):
    proxy = started_model(runtime, mode="collaboration")
    proxy.recommend(b"read_ahead_kb=512\n")
    kinds = controllers(run(runtime, 200))
    assert all(a != b for a, b in zip(kinds, kinds[1:], strict=False)), kinds[:20]


def test_learning_spreads_ml_ticks_evenly(runtime):
    proxy = started_model(runtime, mode="learning")
    proxy.recommend(b"read_ahead_kb=512\n")
    kinds = controllers(run(runtime, 1000))
    positions = [i for i, kind in enumerate(kinds) if kind == "ml"]
    gaps = {b - a for a, b in zip(positions, positions[1:], strict=False)}
    assert gaps == {10}


def test_recommendation_mode_probes_the_default_on_five_percent_of_ticks(runtime):
    proxy = started_model(runtime, mode="recommendation")
    proxy.recommend(b"read_ahead_kb=512\n")
    kinds = controllers(run(runtime, 400))
    assert kinds.count("default") == 20
    assert "default,default" not in ",".join(kinds), "probe ticks are spread out"


def test_without_a_recommendation_every_tick_is_a_default_tick(runtime):
    proxy = started_model(runtime, mode="recommendation")
    rows = run(runtime, 200)
    assert set(controllers(rows)) == {"default"}
    assert set(rows.column("knob_read_ahead_kb").to_pylist()) == {128}
    assert set(rows.column("model").to_pylist()) == {"m"}
    assert proxy.state == "started", "a model is running only once it controlled a tick"
    assert proxy.feedback.pending == 0


def test_no_started_model_means_default_ticks_with_a_null_model(runtime):
    runtime.create_model("idle")
    rows = run(runtime, 50)
    assert set(controllers(rows)) == {"default"}
    assert set(rows.column("model").to_pylist()) == {None}
    assert set(rows.column("mode").to_pylist()) == {"default"}


def test_ticks_rise_by_one_and_rows_have_the_dataset_schema(runtime):
    rows = run(runtime, 30)
    assert rows.column("tick").to_pylist() == list(range(30))
    schema = rows.schema
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("tick").type == pa.int64()
    assert schema.field("objective").type == pa.float64()
    assert schema.field("knob_read_ahead_kb").type == pa.int64()


def test_a_model_becomes_running_on_its_first_ml_tick(runtime):
    proxy = started_model(runtime, mode="learning")
    proxy.recommend(b"read_ahead_kb=512\n")
    states = []
    for _ in range(12):
        runtime.tick()
        states.append(proxy.state)
    assert states[0] == "started"
    assert states[-1] == "running"
    assert states.index("running") == 9, "learning's first ML tick is the tenth"


def test_feedback_rows_hold_expected_observed_baseline_efficiency_and_error(runtime):
    proxy = started_model(runtime, mode="collaboration")
    (rec_id,) = proxy.recommend(b"read_ahead_kb=512 expect=100.0\n")
    rows = run(runtime, 120).to_pylist()
    proxy.stop()  # resolves the last ML tick, which waits for a following default tick
    proxy.feedback.seal_now()
    feedback = proxy.feedback.read_all().to_pylist()
    ml_rows = [r for r in rows if r["controller"] == "ml"]
    assert len(feedback) == len(ml_rows) == 60
    by_tick = {r["tick"]: r for r in rows}
    for fb in feedback:
        row = by_tick[fb["tick"]]
        assert row["controller"] == "ml"
        assert fb["ts"] == row["ts"]
        assert fb["model"] == "m"
        assert fb["source"] == "recommendation"
        assert fb["recommendation_id"] == rec_id
        assert fb["knob_read_ahead_kb"] == 512
        assert fb["expected"] == 100.0
        assert fb["observed"] == row["objective"]
        assert fb["error"] == pytest.approx(row["objective"] - 100.0)
        # the baseline is the mean of the default ticks bracketing the ML tick
        before = [r["objective"] for r in rows
                  if r["controller"] == "default" and r["tick"] < fb["tick"]][-1:]
        after = [r["objective"] for r in rows
                 if r["controller"] == "default" and r["tick"] > fb["tick"]][:1]
        sides = before + after
        if sides:
            baseline = sum(sides) / len(sides)
            assert fb["baseline"] == pytest.approx(baseline)
            assert fb["efficiency"] == pytest.approx(row["objective"] / baseline)
        else:
            assert fb["baseline"] is None and fb["efficiency"] is None


def test_feedback_error_is_null_when_the_trainer_did_not_say_what_it_expected(runtime):
    proxy = started_model(runtime, mode="recommendation")
    proxy.recommend(b"read_ahead_kb=64\n")
    run(runtime, 40)
    proxy.stop()  # resolves ML ticks still waiting for a following default tick
    proxy.feedback.seal_now()
    feedback = proxy.feedback.read_all()
    assert feedback.num_rows == 38
    assert set(feedback.column("expected").to_pylist()) == {None}
    assert set(feedback.column("error").to_pylist()) == {None}
    assert all(isinstance(v, float) for v in feedback.column("observed").to_pylist())


def test_efficiency_compares_ml_ticks_to_default_ticks_of_the_window(runtime):
    proxy = started_model(runtime, mode="collaboration")
    proxy.recommend(b"read_ahead_kb=0\n")  # readahead off is much slower in every phase
    assert proxy.efficiency_text() == "nan\n"
    run(runtime, 200)
    efficiency = float(proxy.efficiency_text())
    assert 0 < efficiency < 0.5
    assert proxy.efficiency_text().endswith("\n")


def test_ttl_recommendation_expires_and_then_default_ticks_run(runtime):
    proxy = started_model(runtime, mode="recommendation")
    (rec_id,) = proxy.recommend(b"read_ahead_kb=512 ttl=5\n")
    rows = run(runtime, 30)
    ml_ticks = [r["tick"] for r in rows.to_pylist() if r["controller"] == "ml"]
    assert ml_ticks and max(ml_ticks) < 5
    proxy.journal.seal_now()
    journal = proxy.journal.read_all().to_pylist()
    assert [(j["id"], j["status"]) for j in journal] == [
        (rec_id, "accepted"), (rec_id, "applied"), (rec_id, "expired")]


def test_a_newer_recommendation_supersedes_the_older_one(runtime):
    proxy = started_model(runtime, mode="recommendation")
    first, second = proxy.recommend(b"read_ahead_kb=64\nread_ahead_kb=256\n")
    rows = run(runtime, 20)
    ml_knobs = {r["knob_read_ahead_kb"] for r in rows.to_pylist() if r["controller"] == "ml"}
    assert ml_knobs == {256}
    proxy.journal.seal_now()
    statuses = [(j["id"], j["status"]) for j in proxy.journal.read_all().to_pylist()]
    assert (first, "superseded") in statuses
    assert (second, "applied") in statuses
    assert (first, "applied") not in statuses


def test_pinned_emergency_refuses_recommendations_with_ebusy(runtime):
    proxy = started_model(runtime, mode="emergency")
    with pytest.raises(Refused) as info:
        proxy.recommend(b"read_ahead_kb=512\n")
    assert info.value.errno == errno.EBUSY
    assert proxy.current is None


def test_a_recommendation_to_a_model_not_started_is_refused_with_einval(runtime):
    proxy = runtime.create_model("m")
    with pytest.raises(Refused) as info:
        proxy.recommend(b"read_ahead_kb=512\n")
    assert info.value.errno == errno.EINVAL
    assert "not started" in proxy.errors[-1]


def test_auto_after_a_pinned_emergency_lets_the_model_leave_emergency(runtime):
    """docs/ABI.md, mode: writing "auto" returns to automatic transitions.

    An emergency that was only pinned has no cause left once unpinned, so
    nothing may keep the model there: with a valid recommendation it must
    get back to learning (and ML ticks) rather than stay in emergency for ever.
    """
    proxy = started_model(runtime, mode="emergency")
    proxy.set_mode(b"auto\n")
    assert proxy.mode_switching == "auto"
    proxy.recommend(b"read_ahead_kb=512\n")
    rows = run(runtime, 500)
    assert proxy.mode != "emergency"
    assert "ml" in controllers(rows)


def test_a_critical_state_puts_every_model_in_emergency_and_runs_the_default(tmp_path):
    sim = SimReadahead(seed=1, critical_pressure=0.0)  # every tick is critical
    exchange = Exchange(parse_config(CONFIG, "test"), tmp_path, [sim])
    rt = exchange.runtimes["sim.readahead"]
    proxy = started_model(rt, mode="recommendation")
    proxy.recommend(b"read_ahead_kb=512\n")
    rows = run(rt, 20)
    assert proxy.mode == "emergency"
    assert controllers(rows).count("ml") <= 1, "only a tick decided before the report"
    with pytest.raises(Refused) as info:
        proxy.recommend(b"read_ahead_kb=256\n")
    assert info.value.errno == errno.EBUSY
    rt.close()


def test_tick_numbers_are_never_reused_after_a_restart(tmp_path):
    config = parse_config(CONFIG, "test")
    first = Exchange(config, tmp_path, [SimReadahead(seed=1)]).runtimes["sim.readahead"]
    for _ in range(25):
        first.tick()
    last = first.next_tick - 1
    first.close()  # as after a crash: nothing sealed
    again = Exchange(config, tmp_path, [SimReadahead(seed=1)]).runtimes["sim.readahead"]
    assert again.dataset.pending == 25, "the rows come back from the write-ahead file"
    assert again.next_tick > last
    again.tick()
    again.dataset.seal_now()
    ticks = again.dataset.read_all().column("tick").to_pylist()
    assert ticks[:25] == list(range(25))
    assert ticks == sorted(set(ticks))
    again.close()


def test_objective_written_by_the_application_replaces_the_measured_one(runtime):
    runtime.write_objective(b"4242.5\n")
    rows = run(runtime, 2).to_pylist()
    assert rows[0]["objective"] == 4242.5
    assert rows[1]["objective"] != 4242.5, "an override counts for one tick"
    assert not math.isnan(float(runtime.objective_text()))


def test_removing_a_model_while_its_journal_is_being_sealed_does_not_kill_the_exchange(
        tmp_path):
    """rmdir while the seal loop writes the model's journal in a worker thread.

    Seen live (about one run in ten of test_attributes): the portion is written,
    the model is removed before the seal task resumes, `_announce` cannot find
    the store's owner and raises KeyError out of the seal loop, which ends the
    daemon: the mount goes away (mkdir: ENOENT or ECONNABORTED).
    """
    import threading

    import trio

    exchange = Exchange(parse_config(CONFIG, "test"), tmp_path, [SimReadahead(seed=1)])
    rt = exchange.runtimes["sim.readahead"]
    proxy = started_model(rt)
    proxy.recommend(b"read_ahead_kb=64\n")
    journal = proxy.journal
    written, resume = threading.Event(), threading.Event()
    write_batch = journal.write_batch

    def write_then_wait(batch):
        portion = write_batch(batch)
        written.set()  # the portion is on disk; the seal task has not resumed yet
        resume.wait(10)
        return portion

    journal.write_batch = write_then_wait

    async def race() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(exchange.sealer.seal, journal)
            while not written.is_set():
                await trio.sleep(0.001)
            rt.destroy_model("m")  # the rmdir handler runs first
            resume.set()

    trio.run(race)  # must not raise
    assert "m" not in rt.models
    rt.close()


@pytest.mark.parametrize("data", [b"read_ahead_kb\x1c\n", b"read_ahead_kb\x0b",
                                  b"\x1fread_ahead_kb"])
def test_knobs_refuses_control_characters_like_every_text_attribute(runtime, data):
    """`knobs` is "space-separated knob names"; str.split() also splits on \\x0b-\\x1f."""
    proxy = runtime.create_model("m")
    with pytest.raises(Refused) as info:
        proxy.set_knobs(data)
    assert info.value.errno == errno.EINVAL
    assert "\\x" in proxy.errors[-1], "the refused input is shown escaped in errors"
