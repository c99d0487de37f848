"""What another writer of a shared store (or of a directory root writes in) can make a
reader or writer do: nothing outside the store, never block, never exhaust memory.

Each test is a red-team finding (redteam3.md: F9-F13, U2, B2) against real files,
real links, real FIFOs and, where a reader could hang, a real subprocess with a
timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from mlfs.base.durable import NotRegular, TooLarge, UnsafePath, read_bounded, write_durably
from mlfs.base.statedir import read_word
from mlfs.fleet.host import HostClash, claim
from mlfs.fleet.layout import Source, info_path
from mlfs.fleet.manifest import manifest_path, objects
from mlfs.fleet.store import FsspecStore, Store, StoreUnavailable
from mlfs.fleet.train import load_infos
from tests.harness import REPO, mlfs_command


def _victim(tmp_path):
    victim = tmp_path / "victim.conf"
    victim.write_text("root's file\n")
    return victim


# ---- F11: writes never leave the store -------------------------------------------------
def test_a_link_planted_at_the_old_temporary_name_is_never_written_through(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "store" / "manifests").mkdir(parents=True)
    os.symlink(victim, tmp_path / "store" / "manifests" / ".hostb.json.tmp")
    Store(str(tmp_path / "store")).put("manifests/hostb.json", b'{"host_id": "hostb"}\n')
    assert victim.read_text() == "root's file\n"
    assert (tmp_path / "store" / "manifests" / "hostb.json").read_bytes() == \
        b'{"host_id": "hostb"}\n'


def test_a_link_at_the_final_name_is_refused_in_one_line_and_its_target_kept(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "store" / "status").mkdir(parents=True)
    os.symlink(victim, tmp_path / "store" / "status" / "hostb.json")
    with pytest.raises(StoreUnavailable, match="symbolic link: refused") as refused:
        Store(str(tmp_path / "store")).put("status/hostb.json", b"{}")
    assert "\n" not in str(refused.value)
    assert victim.read_text() == "root's file\n"
    assert os.path.islink(tmp_path / "store" / "status" / "hostb.json")


def test_a_link_in_place_of_a_store_directory_is_refused_and_nothing_lands_beyond(tmp_path):
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "store").mkdir()
    os.symlink(elsewhere, tmp_path / "store" / "manifests")
    store = Store(str(tmp_path / "store"))
    with pytest.raises(StoreUnavailable, match="symbolic link"):
        store.put("manifests/hostb.json", b"{}")
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(UnsafePath):
        store.get("manifests/hostb.json")
    assert store.list("manifests/") == []


def test_a_dangling_link_at_a_claim_makes_put_if_absent_false_and_creates_nothing(tmp_path):
    (tmp_path / "store" / "claims").mkdir(parents=True)
    target = tmp_path / "created-by-root"
    os.symlink(target, tmp_path / "store" / "claims" / "h.json")
    assert Store(str(tmp_path / "store")).put_if_absent("claims/h.json", b"{}") is False
    assert not target.exists()


# ---- the host claim --------------------------------------------------------------------
def test_the_first_state_directory_claims_a_host_and_a_second_is_refused(tmp_path):
    store = Store(str(tmp_path / "store"))
    claim(store, tmp_path / "a", "h1", store.url)
    claim(store, tmp_path / "a", "h1", store.url)  # the same directory again: its own
    with pytest.raises(HostClash, match="claimed in the store"):
        claim(store, tmp_path / "b", "h1", store.url)
    token = json.loads((tmp_path / "a" / "fleet").glob("claim-*.json").__next__().read_text())
    assert json.loads(store.get("claims/h1.json"))["token"] == token["token"]
    assert oct(next((tmp_path / "a" / "fleet").glob("claim-*.json")).stat().st_mode)[-3:] \
        == "600"


def test_a_store_without_a_conditional_write_cannot_hold_a_claim(tmp_path):
    store = FsspecStore("memory://claimless/store")
    with pytest.raises(HostClash, match="no conditional write"):
        claim(store, tmp_path / "a", "h1", store.url)
    assert not store.exists("claims/h1.json")


# ---- F9, F10: readers check type and size before reading -------------------------------
def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter, killed if it hangs (a FIFO opened blocking)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_a_fifo_as_the_newest_card_is_skipped_not_waited_on(tmp_path):
    folder = tmp_path / "store" / "policies" / "sim.readahead"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "0000000002.json")
    done = _run(f"""
        from mlfs.fleet.pull import newest_verified
        from mlfs.fleet.store import Store
        print(newest_verified(Store({str(tmp_path / 'store')!r}), "sim.readahead"))
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert "not a regular file" in done.stderr


def test_a_fifo_in_the_state_directory_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "format")
    done = _run(f"""
        from mlfs.base.statedir import read_word
        print(read_word({str(tmp_path / 'format')!r}))
        """)
    assert done.returncode == 0, done.stderr
    assert "not a regular file" in done.stdout
    assert read_word(tmp_path / "format") == (None, f"{tmp_path / 'format'} is not a "
                                               "regular file")


def test_a_huge_card_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    store = Store(str(tmp_path / "store"))
    store.put("policies/s/0000000002.json", b"")
    with open(tmp_path / "store" / "policies" / "s" / "0000000002.json", "r+b") as fh:
        fh.truncate(1_500_000_000)  # sparse: no disk, but 1.5 GB to read whole
    with pytest.raises(TooLarge, match="1500000000 bytes"):
        store.get("policies/s/0000000002.json", 1 << 20)
    os.mkdir(tmp_path / "store" / "policies" / "s" / "0000000003.json")
    with pytest.raises(NotRegular):
        store.get("policies/s/0000000003.json")


# ---- F12: a manifest costs what its host shipped ---------------------------------------
def test_a_manifest_of_huge_ranges_lists_only_what_its_host_shipped(tmp_path):
    store = Store(str(tmp_path))
    source = Source("s", "dataset")
    for number in (3, 4, 9):
        store.put(source.object_path("evil", number), b"PAR1")
    store.put(source.object_path("evil", 10_000_001), b"PAR1")  # past every range
    body = {"host_id": "evil", "sources": {
        f"s/dataset{i}": {"subsystem": "s", "kind": "dataset", "model": "",
                          "ranges": [[0, 9_999_999]]} for i in range(200)}}
    store.put(manifest_path("evil"), json.dumps(body).encode())
    assert objects(store, "s", "dataset") == [source.object_path("evil", n) for n in (3, 4, 9)]


def test_a_manifest_with_overlapping_or_unsorted_ranges_is_ignored(tmp_path, caplog):
    store = Store(str(tmp_path))
    source = Source("s", "dataset")
    store.put(source.object_path("h", 1), b"PAR1")
    body = {"host_id": "h", "sources": {"s/dataset": {
        "subsystem": "s", "kind": "dataset", "model": "", "ranges": [[5, 9], [0, 6]]}}}
    store.put(manifest_path("h"), json.dumps(body).encode())
    with caplog.at_level(logging.ERROR, "mlfs.fleet"):
        assert objects(store, "s", "dataset") == []
    assert "sorted, disjoint" in caplog.text


# ---- F13: one host's info never stops training for everyone ----------------------------
def test_one_hosts_malformed_or_disagreeing_info_is_ignored_with_its_rows(tmp_path, caplog):
    store = Store(str(tmp_path))
    good = {"knobs": [{"name": "read_ahead_kb"}], "features": ["iops"], "objective": "x"}
    for host in ("a", "b"):
        store.put(info_path("sim.readahead", host), json.dumps(good).encode())
    store.put(info_path("sim.readahead", "evil"), json.dumps(
        dict(good, knobs=[{"name": "other"}])).encode())
    store.put(info_path("sim.readahead", "broken"), b"{{{")
    store.put(info_path("sim.readahead", "list"), b"[]")
    with caplog.at_level(logging.ERROR, "mlfs.fleet"):
        info, pairs = load_infos(store, "sim.readahead")
    assert info == good
    assert pairs == {("sim.readahead", "a"), ("sim.readahead", "b")}
    for host in ("evil", "broken", "list"):
        assert f"{host}.json" in caplog.text


# ---- the one write path ----------------------------------------------------------------
def test_modes_are_explicit_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        write_durably(tmp_path / "a" / "b" / "file", b"x", anchor=tmp_path, make_dirs=True,
                      dir_mode=0o755, mode=0o644)
    finally:
        os.umask(old)
    assert oct((tmp_path / "a").stat().st_mode)[-3:] == "755"
    assert oct((tmp_path / "a" / "b").stat().st_mode)[-3:] == "755"
    assert oct((tmp_path / "a" / "b" / "file").stat().st_mode)[-3:] == "644"


def test_replace_link_replaces_the_link_and_never_touches_its_target(tmp_path):
    victim = _victim(tmp_path)
    os.chmod(victim, 0o600)
    os.symlink(victim, tmp_path / "unit.service")
    with pytest.raises(UnsafePath):
        write_durably(tmp_path / "unit.service", b"[Unit]\n")
    write_durably(tmp_path / "unit.service", b"[Unit]\n", replace_link=True)
    assert not os.path.islink(tmp_path / "unit.service")
    assert (tmp_path / "unit.service").read_bytes() == b"[Unit]\n"
    assert victim.read_text() == "root's file\n"
    assert oct(victim.stat().st_mode)[-3:] == "600"


def test_a_write_leaves_no_temporary_file_behind(tmp_path):
    write_durably(tmp_path / "f", b"1")
    write_durably(tmp_path / "f", b"2")
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_read_bounded_refuses_a_link(tmp_path):
    victim = _victim(tmp_path)
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(UnsafePath):
        read_bounded(tmp_path / "link", 100)


def test_keygen_refuses_a_dangling_link_at_the_public_key_in_one_line(tmp_path):
    """Red-team F7: `exists()` is False for a dangling link, and the key went through it."""
    target = tmp_path / "kg-target"
    os.symlink(target, tmp_path / "fleet.key.pub")
    done = subprocess.run(mlfs_command("fleet", "keygen", str(tmp_path / "fleet.key")),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "never overwritten" in done.stderr
    assert not target.exists()
    assert not (tmp_path / "fleet.key").exists()
