"""The action runner's bounds, with real processes and no mount: the global start rate
(red team A5) and the per-entity interval that a full table never shortens (A6)."""

from __future__ import annotations

import pytest

from mlfs.core.mount import actions
from mlfs.core.mount.actions import ActionRunner
from mlfs.core.mount.containment import Cgroups
from tests.harness import wait_for


@pytest.fixture
def runner():
    made = ActionRunner({"s": {"action": ["/bin/true"], "action_every_seconds": 3600}})
    yield made
    made.close()


def _run(runner: ActionRunner, entity: str, ended: list) -> bool:
    """Start the command for `entity` and, if it started, wait until it is reaped."""
    started = runner.start("s", entity, lambda status, code, seconds: ended.append(status))
    if started:
        def done() -> bool:
            runner.reap()
            return not runner._running  # noqa: SLF001 (also there before the bounds)
        wait_for(done, timeout=30, what=f"/bin/true for {entity} reaped")
    return started


def test_starts_over_the_mount_are_bounded_by_a_token_bucket(runner):
    """A5: a command that exits at once let a member's predictions start ~230 root
    processes a second.  At 1 start a minute, ten alerts in a row start one command (two
    if the test took a minute)."""
    runner.spawns_per_minute = 1
    ended: list[str] = []
    started = sum(_run(runner, f"drive{i}", ended) for i in range(10))
    assert 1 <= started <= 2
    assert runner.counts["limited"] == 10 - started
    assert ended.count("limited") == 10 - started


def test_a_full_table_refuses_new_entities_instead_of_forgetting_one_early(runner,
                                                                           monkeypatch):
    """A6: with MAX_REMEMBERED entities remembered, the oldest was forgotten and could run
    again long before its interval.  A new entity is refused instead, and counted."""
    monkeypatch.setattr(actions, "MAX_REMEMBERED", 3)
    ended: list[str] = []
    assert all(_run(runner, entity, ended) for entity in ("a", "b", "c"))
    assert not _run(runner, "d", ended)
    assert runner.counts["unremembered"] == 1
    assert not _run(runner, "a", ended), "a ran again within its interval"
    assert ended == ["exited", "exited", "exited", "unremembered"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_without_cgroups_a_command_lives_while_its_process_group_does_and_dies_whole(
        tmp_path):
    """Where cgroups are not writable (a container), the process group and session stand
    in: a backgrounded child keeps the command alive (it counts against MAX_RUNNING) and
    the timeout kills it with the command.  (A `setsid` grandchild leaves both: only a
    cgroup holds it.)"""
    runner = ActionRunner({"s": {"action": ["/bin/sh", "-c", "sleep 4321.5 & echo $! > $1",
                                            "sh"], "action_timeout_seconds": 3600}},
                          cgroups=Cgroups(None))
    pidfile = tmp_path / "sleep.pid"
    try:
        assert runner.start("s", str(pidfile), lambda *report: None)
        sleep = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(),
                             timeout=30, what="the background sleep's pid"))
        wait_for(lambda: runner._running[0].process.poll() is not None,  # noqa: SLF001
                 timeout=30, what="the shell exited")
        runner.reap()
        assert runner.running() == 1, "its background child keeps it alive"
        runner._running[0].deadline = 0.0  # noqa: SLF001 (its time is up)
        runner.reap()
        wait_for(lambda: not _alive(sleep), timeout=30, what="the sleep killed with it")
        wait_for(lambda: runner.reap() or runner.running() == 0, timeout=30,
                 what="the command reaped")
        assert runner.counts["killed"] == 1
    finally:
        runner.close()
