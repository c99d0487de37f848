"""`mlfs fleet push`: real mounts as hosts, a real directory store, real kills."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from fsspec import register_implementation
from fsspec.implementations.memory import MemoryFileSystem

from mlfs.fleet.layout import Source, portion_number
from mlfs.fleet.manifest import objects
from mlfs.fleet.push import Pusher, store_key
from mlfs.fleet.store import STORES, MemoryStore
from tests.harness import FAST_CONFIG, REPO, Mount, mlfs_command, new_model, wait_for

pytestmark = pytest.mark.mount

#: portions sealed every 0.2 s, so a few seconds make many
BUSY_CONFIG = FAST_CONFIG.replace("seal_seconds = 1.0", "seal_seconds = 0.2")


def push(m: Mount, store: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                     "--state-dir", str(m.state_dir), *extra),
        capture_output=True, text=True, timeout=timeout, cwd=REPO)


def start_pusher(m: Mount, store: Path, *extra: str) -> subprocess.Popen:
    """The service, its log in m.root/pusher.log (a file: a pipe nobody reads would fill)."""
    with open(m.root / "pusher.log", "ab") as log:
        return subprocess.Popen(
            mlfs_command("fleet", "push", str(m.mountpoint), "--store", str(store),
                         "--state-dir", str(m.state_dir), "--interval", "0.2", *extra),
            stdout=log, stderr=log, cwd=REPO)


def end(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def cursor(m: Mount, store: Path) -> dict:
    return json.loads((m.state_dir / "fleet" / f"push-{store_key(str(store))}.json").read_text())


def metrics(m: Mount, store: Path) -> dict[str, float]:
    path = m.state_dir / "fleet" / f"push-{store_key(str(store))}.prom"
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def mount_ticks(m: Mount, up_to: int) -> list[int]:
    """Ticks of the mount's dataset portions numbered up to `up_to` (what was shipped)."""
    ticks: list[int] = []
    for path in sorted((m.sub / "dataset").glob("*.parquet")):
        if portion_number(path.name) <= up_to:
            ticks += pq.read_table(path, columns=["tick"]).column("tick").to_pylist()
    return ticks


def store_ticks(store: Path, host: str) -> Counter:
    rows = duckdb.sql(
        f"SELECT tick FROM read_parquet('{store}/*/*/kind=dataset/*.parquet', "
        f"hive_partitioning=true) WHERE host = '{host}'").fetchall()
    return Counter(t for (t,) in rows)


def fleet_status(store: Path) -> dict:
    done = subprocess.run(mlfs_command("fleet", "status", "--store", str(store), "--json"),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def portions(directory: Path) -> int:
    return len(list(directory.glob("*.parquet")))


def test_two_hosts_push_once_and_the_store_reads_as_one_hive_table(mount_root, tmp_path):
    store = tmp_path / "store"
    a = Mount(mount_root, name="a")
    b = Mount(mount_root, config=FAST_CONFIG.replace("seed = 1", "seed = 2"), name="b")
    try:
        a.start()
        b.start()
        model = new_model(a.sub, "m")
        (model / "mode").write_text("collaboration\n")  # pinned: the status must show it
        (model / "recommend").write_text("read_ahead_kb=256\n")
        wait_for(lambda: portions(a.sub / "dataset") >= 2 and portions(b.sub / "dataset") >= 2
                 and portions(model / "feedback") >= 1
                 and portions(model / "recommendations") >= 1,
                 timeout=30, what="portions on both hosts")
        for m in (a, b):
            done = push(m, store, "--once")
            assert done.returncode == 0, done.stderr
            assert "0 waiting" in done.stdout
        hosts = {m: (m.mountpoint / "host").read_text().strip() for m in (a, b)}
        table = duckdb.sql(
            f"SELECT subsystem, host, host_id, kernel_release, machine, mlfs_version, "
            f"count(*) AS n FROM read_parquet('{store}/*/*/kind=dataset/*.parquet', "
            f"hive_partitioning=true) GROUP BY ALL ORDER BY host").fetchall()
        assert {row[1] for row in table} == set(hosts.values())
        uname = os.uname()
        version = (a.mountpoint / "version").read_text().split()[-1]
        for subsystem, host, host_id, release, machine, mlfs_version, _ in table:
            assert (subsystem, host_id, release, machine, mlfs_version) == (
                "sim.readahead", host, uname.release, uname.machine, version)
        for m in (a, b):
            shipped = cursor(m, store)["shipped"]["sim.readahead/dataset"]
            expected = Counter(mount_ticks(m, shipped))
            assert store_ticks(store, hosts[m]) == expected and len(expected) > 0
        feedback = store / "subsystem=sim.readahead" / f"host={hosts[a]}" / "kind=feedback"
        journal = feedback.parent / "kind=recommendations" / "model=m"
        assert portions(feedback / "model=m") >= 1 and portions(journal) >= 1
        lines = duckdb.sql(f"SELECT line FROM read_parquet('{journal}/*.parquet')").fetchall()
        assert ("read_ahead_kb=256",) in lines
        status = fleet_status(store)
        assert set(status["hosts"]) == set(hosts.values())
        for host in hosts.values():
            record = status["hosts"][host]
            assert (record["backlog"], record["lost"], record["failing"]) == (0, 0, False)
            assert status["subsystems"]["sim.readahead"][host]["rows"] == sum(
                store_ticks(store, host).values())
        shown = status["hosts"][hosts[a]]["models"]["sim.readahead"]["m"]
        assert shown["mode"] == "collaboration" and shown["efficiency"]
        assert status["hosts"][hosts[b]]["models"] == {}
    finally:
        a.kill(signal.SIGTERM)
        b.kill(signal.SIGTERM)


def test_pusher_sigkilled_mid_run_then_restarted_ships_each_row_exactly_once(
        mount_root, tmp_path):
    store = tmp_path / "store"
    m = Mount(mount_root, config=BUSY_CONFIG)
    try:
        m.start()
        wait_for(lambda: portions(m.sub / "dataset") >= 20, timeout=60, what="20 portions")
        host = (m.mountpoint / "host").read_text().strip()
        shipped_dir = store / "subsystem=sim.readahead" / f"host={host}" / "kind=dataset"
        pusher = start_pusher(m, store)
        try:
            wait_for(lambda: portions(shipped_dir) >= 3, timeout=30, interval=0.002,
                     what="the first shipped portions")
        finally:
            end(pusher, signal.SIGKILL)
        at_kill = portions(shipped_dir)
        done = push(m, store, "--once")
        assert done.returncode == 0, done.stderr
        shipped = cursor(m, store)["shipped"]["sim.readahead/dataset"]
        assert at_kill < shipped, "the pusher was not killed mid-run"
        ticks = store_ticks(store, host)
        assert max(ticks.values()) == 1  # nothing twice
        assert ticks == Counter(mount_ticks(m, shipped))  # nothing lost
    finally:
        m.kill(signal.SIGTERM)


def test_unwritable_store_keeps_a_backlog_with_a_clear_error_and_drains_after(
        mount_root, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    blocker = store / "subsystem=sim.readahead"
    blocker.write_text("a file where a directory must be: fails for root too\n")
    m = Mount(mount_root)
    try:
        m.start()
        wait_for(lambda: portions(m.sub / "dataset") >= 2, timeout=30, what="portions")
        done = push(m, store, "--once")
        assert done.returncode == 1
        assert "cannot write subsystem=sim.readahead/" in done.stderr
        assert metrics(m, store)["mlfs_fleet_push_store_failing"] == 1
        assert metrics(m, store)["mlfs_fleet_push_backlog_portions"] >= 2
        record = next(iter(fleet_status(store)["hosts"].values()))  # the status record
        assert record["failing"] and record["backlog"] >= 2  # ... still reaches the store
        assert "cannot write subsystem=sim.readahead/" in record["error"]
        pusher = start_pusher(m, store, "--max-backoff", "0.5")
        try:
            wait_for(lambda: "fleet store failing" in (m.root / "pusher.log").read_text(),
                     timeout=30, what="the outage logged")
            time.sleep(0.6)
            assert pusher.poll() is None  # an outage does not end the service
            blocker.unlink()
            wait_for(lambda: metrics(m, store)["mlfs_fleet_push_store_failing"] == 0,
                     timeout=30, what="the backlog drained")
        finally:
            code = end(pusher, signal.SIGTERM)
        assert code == 0  # SIGTERM ends the service cleanly
        host = (m.mountpoint / "host").read_text().strip()
        shipped = cursor(m, store)["shipped"]["sim.readahead/dataset"]
        assert shipped >= 2
        assert store_ticks(store, host) == Counter(mount_ticks(m, shipped))
        assert metrics(m, store)["mlfs_fleet_push_lost_portions_total"] == 0
    finally:
        m.kill(signal.SIGTERM)


class RecordingMemoryFS(MemoryFileSystem):
    """fsspec's in-memory file system (no rename at all, like S3), recording the
    order in which whole objects are written."""

    protocol = ("fleetmem",)
    writes: list[str] = []

    def pipe_file(self, path, value, **kwargs):
        type(self).writes.append(self._strip_protocol(path))
        return super().pipe_file(path, value, **kwargs)


def test_a_store_without_atomic_rename_shows_readers_only_what_the_manifest_lists(
        mount_root, monkeypatch):
    register_implementation("fleetmem", RecordingMemoryFS, clobber=True)
    monkeypatch.setitem(STORES, "fleetmem", MemoryStore)  # a store is one map entry
    url = f"fleetmem://fleet-{os.getpid()}-{time.monotonic_ns()}"

    def where(key: str) -> str:  # the file system's path of a store key
        return RecordingMemoryFS._strip_protocol(f"{url}/{key}")
    m = Mount(mount_root)
    try:
        m.start()
        wait_for(lambda: portions(m.sub / "dataset") >= 3, timeout=30, what="portions")
        pusher = Pusher(m.mountpoint, url, m.state_dir)
        store = pusher.store
        assert not store.atomic
        host = pusher.host["host_id"]
        source = Source("sim.readahead", "dataset")
        first = pusher.pending(source)[0]
        # what a pusher killed mid-PUT leaves on a store without rename: a torn object
        store.put(source.object_path(host, first), b"PAR1 torn")
        assert objects(store, "sim.readahead", "dataset") == []
        assert fleet_status_of(url)["subsystems"] == {}
        RecordingMemoryFS.writes.clear()
        result = pusher.ship_pass()
        assert result.error == "" and result.shipped >= 3
        shipped = pusher.cursor.shipped[source.key()]
        listed = objects(store, "sim.readahead", "dataset")
        assert listed == [source.object_path(host, n) for n in range(first, shipped + 1)]
        ticks = Counter()
        for path in listed:  # the torn one replaced: every listed object reads whole
            with store.open(path) as f:
                ticks.update(pq.read_table(f, columns=["tick"]).column("tick").to_pylist())
        assert ticks == Counter(mount_ticks(m, shipped))
        rows = fleet_status_of(url)["subsystems"]["sim.readahead"][host]["rows"]
        assert rows == sum(ticks.values())
        writes = RecordingMemoryFS.writes
        manifest = writes.index(where(f"manifests/{host}.json"))
        assert all(writes.index(where(p)) < manifest for p in listed)  # the manifest last
    finally:
        m.kill(signal.SIGTERM)
        RecordingMemoryFS.store.clear()
        RecordingMemoryFS.pseudo_dirs[:] = [""]


def fleet_status_of(url: str) -> dict:
    from mlfs.fleet.status import collect

    return collect(url)


HOLD_CONFIG = BUSY_CONFIG.replace("[modes]", "retention_count = 3\n{backlog}\n[modes]")


def test_unshipped_portions_are_held_back_from_retention_while_the_store_is_down(
        mount_root, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    blocker = store / "subsystem=sim.readahead"
    blocker.write_text("a file where a directory must be\n")
    m = Mount(mount_root, config=HOLD_CONFIG.format(backlog=""))
    try:
        m.start()
        push(m, store, "--once")  # the cursor exists from here on: portions held
        assert cursor(m, store)["shipped"] == {}
        wait_for(lambda: portions(m.sub / "dataset") >= 8, timeout=60,
                 what="8 portions kept with retention_count = 3")
        blocker.unlink()
        done = push(m, store, "--once")
        assert done.returncode == 0, done.stderr
        assert ", 0 lost" in done.stdout
        host = (m.mountpoint / "host").read_text().strip()
        shipped = cursor(m, store)["shipped"]["sim.readahead/dataset"]
        # portions 1..shipped, no gap: none was removed while the store was down
        assert cursor(m, store)["ranges"]["sim.readahead/dataset"] == [[1, shipped]]
        assert max(store_ticks(store, host).values()) == 1
        assert metrics(m, store)["mlfs_fleet_push_lost_portions_total"] == 0
        assert shipped >= 8
        # shipped now: the next seals remove them (newer ones wait for the next push)
        wait_for(lambda: min(map(portion_number, os.listdir(m.sub / "dataset"))) > shipped,
                 timeout=30, what="retention removing the shipped portions")
    finally:
        m.kill(signal.SIGTERM)


def test_past_the_backlog_limit_retention_wins_and_the_loss_is_counted_logged_and_shown(
        mount_root, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    m = Mount(mount_root, config=HOLD_CONFIG.format(backlog="fleet_backlog_bytes = 1"))
    try:
        m.start()
        wait_for(lambda: portions(m.sub / "dataset") >= 1, timeout=60, what="a portion")
        first = push(m, store, "--once")  # the cursor now has a shipped prefix
        assert first.returncode == 0, first.stderr
        # the store goes away (a file where its directory was): nothing ships, and past
        # the 1-byte backlog limit retention removes portions the pusher never shipped
        store.rename(tmp_path / "store.away")
        store.write_text("not a store\n")
        failed = push(m, store, "--once")
        assert failed.returncode == 1
        wait_for(lambda: "before the fleet pusher shipped" in
                 (m.state_dir / "mlfs.log").read_text(), timeout=60,
                 what="the daemon logging an unshipped portion removed")
        assert portions(m.sub / "dataset") <= 4
        store.unlink()
        (tmp_path / "store.away").rename(store)
        done = push(m, store, "--once")
        assert done.returncode == 0, done.stderr
        lost = metrics(m, store)["mlfs_fleet_push_lost_portions_total"]  # all passes
        found = re.search(r"\d+ waiting, (\d+) lost", done.stdout)
        assert found and 1 <= int(found.group(1)) <= lost  # this pass sees the gap
        assert "removed from the mount before" in done.stderr
        record = next(iter(fleet_status(store)["hosts"].values()))
        assert record["lost"] == lost
        status = subprocess.run(mlfs_command("fleet", "status", "--store", str(store)),
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        host = (m.mountpoint / "host").read_text().strip()
        line = next(x for x in status.stdout.splitlines() if x.startswith(host))
        assert f" {lost:g} " in line
    finally:
        m.kill(signal.SIGTERM)
