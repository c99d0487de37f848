"""Signed fleet policies: a host installs only what a key it trusts signed; a forged
version never blocks the numbering; no trusted key, nothing installed."""

from __future__ import annotations

import json
import subprocess

import lightgbm as lgb
import numpy as np
import pytest

from mlfs.fleet.layout import policy_path
from mlfs.fleet.pull import PullError, fetch
from mlfs.fleet.signing import keygen
from mlfs.fleet.store import Store
from mlfs.fleet.train import TrainError, next_version, publish
from tests.harness import Mount, mlfs_command


@pytest.fixture(scope="module")
def text() -> str:
    x = np.random.default_rng(0).random((200, 2))
    return lgb.train({"objective": "regression", "verbose": -1, "min_data_in_leaf": 5},
                     lgb.Dataset(x, label=x[:, 0], feature_name=["mem_pressure",
                                                                  "knob_read_ahead_kb"]),
                     num_boost_round=2).model_to_string()


@pytest.fixture
def keys(tmp_path):
    return keygen(tmp_path / "ours.key"), keygen(tmp_path / "theirs.key")


def test_only_a_policy_a_trusted_key_signed_is_installed(tmp_path, text, keys):
    ours, theirs = keys
    store = Store(str(tmp_path / "store"))
    signed = publish(store, "s", text, {"rows": 1}, key=tmp_path / "ours.key")
    publish(store, "s", text, {"rows": 2})  # unsigned, newer
    publish(store, "s", text, {"rows": 3}, key=tmp_path / "theirs.key")  # another key
    got = fetch(str(tmp_path / "store"), "s", trusted_keys=[ours])
    assert got.version == signed["version"] == 1
    assert fetch(str(tmp_path / "store"), "s", trusted_keys=[theirs]).version == 3
    with pytest.raises(PullError, match="unsigned"):
        fetch(str(tmp_path / "store"), "s", 2, trusted_keys=[ours])
    with pytest.raises(PullError, match="not signed by a trusted key"):
        fetch(str(tmp_path / "store"), "s", 3, trusted_keys=[ours])
    with pytest.raises(PullError, match="no trusted key"):
        fetch(str(tmp_path / "store"), "s", trusted_keys=[])


def test_a_forged_last_version_is_skipped_and_never_blocks_the_numbering(tmp_path, text,
                                                                         keys):
    ours, _ = keys
    root = tmp_path / "store"
    store = Store(str(root))
    publish(store, "s", text, {"rows": 1}, key=tmp_path / "ours.key")
    forged = json.loads((root / policy_path("s", 1, "json")).read_text())
    (root / policy_path("s", 9_999_999_999, "txt")).write_text(text)
    (root / policy_path("s", 9_999_999_999, "json")).write_text(
        json.dumps(dict(forged, version=9_999_999_999, rows=10**9)))
    assert fetch(str(root), "s", trusted_keys=[ours]).version == 1  # the forgery is unsigned
    card = publish(store, "s", text, {"rows": 2}, key=tmp_path / "ours.key")
    assert card["version"] == 2  # one past the newest that verifies, 10 digits
    with pytest.raises(TrainError, match="11 digits"):  # unsigned: integrity alone counts
        next_version(store, "s")
    assert (root / policy_path("s", 2, "sig")).read_bytes().startswith(b"mlfs-policy-signature 2\n")


def test_keygen_never_overwrites_and_train_without_a_trusted_key_installs_nothing(
        mount_root, tmp_path, text):
    key = tmp_path / "k"
    assert subprocess.run(mlfs_command("fleet", "keygen", str(key)), capture_output=True,
                          text=True, timeout=60).returncode == 0
    again = subprocess.run(mlfs_command("fleet", "keygen", str(key)), capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 2 and "never overwritten" in again.stderr
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    publish(Store(str(tmp_path / "store")), "sim.readahead", text, {"rows": 1}, key=key)
    m = Mount(mount_root)
    m.start()
    try:
        done = subprocess.run(mlfs_command("train", str(m.mountpoint), "sim.readahead",
                                           "--fleet", str(tmp_path / "store")),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "no trusted key" in done.stderr
        assert not (m.sub / "models" / "lgbm").exists()
    finally:
        m.kill()
