"""A signature binds everything a host acts on (issue 50, F2-F4, F6, F8-F10): the
subsystem and version of the path it was read from, the policy's sha256 and the
signer; a host never goes back past the newest policy it installed; keys someone else
could replace are refused, as ssh refuses them; a store full of forgeries costs one
log line and no hang."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys

import lightgbm as lgb
import numpy as np
import pytest

from mlfs.fleet.layout import policy_path
from mlfs.fleet.pull import PullError, fetch, installed_mark
from mlfs.fleet.signing import SigningError, keygen, load_private, load_trusted
from mlfs.fleet.store import Store
from mlfs.fleet.train import publish
from tests.harness import REPO, Mount, mlfs_command


def _text(scale: float) -> str:
    x = np.random.default_rng(0).random((200, 2))
    return lgb.train({"objective": "regression", "verbose": -1, "min_data_in_leaf": 5},
                     lgb.Dataset(x, label=x[:, 0] * scale,
                                 feature_name=["mem_pressure", "knob_read_ahead_kb"]),
                     num_boost_round=2).model_to_string()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [_text(scale) for scale in (1, 2, 3)]


@pytest.fixture
def signed(tmp_path, texts):
    """A store with signed versions 1 (old) and 2 (current) of `s`; (root, key, pub)."""
    pub = keygen(tmp_path / "k")
    root = tmp_path / "store"
    for text in texts[:2]:
        publish(Store(str(root)), "s", text, {"rows": 1}, key=tmp_path / "k")
    return root, tmp_path / "k", pub


def _copy(root, subsystem, version, to_subsystem, to_version):
    (root / "policies" / to_subsystem).mkdir(parents=True, exist_ok=True)
    for suffix in ("txt", "sig", "json"):
        shutil.copy(root / policy_path(subsystem, version, suffix),
                    root / policy_path(to_subsystem, to_version, suffix))


def test_a_signed_policy_copied_to_a_higher_number_is_not_installed(signed):
    root, _, pub = signed
    _copy(root, "s", 1, "s", 3)  # F2: a rollback dressed as a newer version
    got = fetch(str(root), "s", trusted_keys=[pub])
    assert (got.version, got.card["version"]) == (2, 2)
    with pytest.raises(PullError, match="signed as s policy 1, found as s policy 3"):
        fetch(str(root), "s", 3, trusted_keys=[pub])


def test_a_replay_at_the_last_number_is_not_installed_and_never_stops_publishing(
        signed, texts):
    root, key, pub = signed
    _copy(root, "s", 1, "s", 9_999_999_999)  # F3
    assert fetch(str(root), "s", trusted_keys=[pub]).version == 2
    card = publish(Store(str(root)), "s", texts[2], {"rows": 3}, key=key)
    assert card["version"] == 3
    assert fetch(str(root), "s", trusted_keys=[pub]).card["sha256"] == card["sha256"]


def test_a_policy_signed_for_another_subsystem_is_not_installed_there(signed):
    root, _, pub = signed
    _copy(root, "s", 2, "other", 1)  # F4
    with pytest.raises(PullError, match="no other policy a trusted key signed"):
        fetch(str(root), "other", trusted_keys=[pub])
    with pytest.raises(PullError, match="signed as s policy 2, found as other policy 1"):
        fetch(str(root), "other", 1, trusted_keys=[pub])


def test_a_host_never_installs_a_policy_older_than_the_newest_it_installed(
        signed, tmp_path, texts):
    root, key, pub = signed
    state = tmp_path / "state"
    assert fetch(str(root), "s", trusted_keys=[pub], state_dir=state).version == 2
    assert installed_mark(state, "s")["version"] == 2
    with pytest.raises(PullError, match="rollback"):  # pinned back: refused
        fetch(str(root), "s", 1, trusted_keys=[pub], state_dir=state)
    for suffix in ("txt", "sig", "json"):  # a store writer deletes the newest version
        (root / policy_path("s", 2, suffix)).unlink()
    with pytest.raises(PullError, match="does not come after policy 2"):
        fetch(str(root), "s", trusted_keys=[pub], state_dir=state)
    again = publish(Store(str(root)), "s", texts[2], {"rows": 3}, key=key)
    assert again["version"] == 2  # the number reused, with another policy: refused too
    with pytest.raises(PullError, match="rollback"):
        fetch(str(root), "s", trusted_keys=[pub], state_dir=state)
    newer = publish(Store(str(root)), "s", texts[2], {"rows": 4}, key=key)
    assert fetch(str(root), "s", trusted_keys=[pub], state_dir=state).version == 3
    assert installed_mark(state, "s")["sha256"] == newer["sha256"]


def test_a_format_1_signature_over_the_card_alone_is_refused_saying_so(signed):
    root, key, pub = signed
    card = (root / policy_path("s", 2, "json")).read_bytes()
    (root / policy_path("s", 2, "sig")).write_bytes(load_private(key).sign(card))
    with pytest.raises(PullError, match="format 1 .* publish it again"):
        fetch(str(root), "s", 2, trusted_keys=[pub])
    assert fetch(str(root), "s", trusted_keys=[pub]).version == 1


def test_forged_versions_cost_one_log_line_and_the_search_stops_at_the_newest_verified(
        signed, caplog):
    root, _, pub = signed
    folder = root / "policies" / "s"
    genuine_sig = (folder / "0000000002.sig").read_bytes()
    for version in range(3, 303):
        (folder / f"{version:010d}.json").write_text("{}")
        if version % 2:
            (folder / f"{version:010d}.sig").write_bytes(genuine_sig)
    with caplog.at_level(logging.INFO, logger="mlfs.fleet"):
        assert fetch(str(root), "s", trusted_keys=[pub]).version == 2
    lines = [r for r in caplog.records if r.name == "mlfs.fleet"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "skipped 150 unsigned and 150 unverifiable" in lines[0].getMessage()


def test_a_fifo_or_a_huge_file_as_the_newest_card_is_skipped_unread(signed):
    root, _, pub = signed
    folder = root / "policies" / "s"
    os.mkfifo(folder / "0000000004.json")  # F9: reading it would block forever
    (folder / "0000000004.sig").write_bytes((folder / "0000000002.sig").read_bytes())
    with open(folder / "0000000003.json", "wb") as huge:  # F10: sparse, 2 GB
        huge.truncate(2 << 30)
    (folder / "0000000003.sig").write_bytes((folder / "0000000002.sig").read_bytes())
    script = ("import sys; from mlfs.fleet.pull import fetch; "
              "print(fetch(sys.argv[1], 's', trusted_keys=[sys.argv[2]]).version)")
    done = subprocess.run([sys.executable, "-c", script, str(root), str(pub)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2", done.stderr[-500:]
    assert "skipped 0 unsigned and 2 unverifiable" in done.stderr


@pytest.mark.parametrize("how", ["0666", "0620", "symlink"])
def test_a_trusted_key_someone_else_could_replace_is_refused(tmp_path, how):
    pub = keygen(tmp_path / "k")
    if how == "symlink":
        os.rename(pub, tmp_path / "real.pub")
        os.symlink(tmp_path / "real.pub", pub)
    else:
        os.chmod(pub, int(how, 8))
    with pytest.raises(SigningError, match="symlink|lets group or other replace it"):
        load_trusted([pub])


@pytest.mark.parametrize("how", ["0644", "0640", "symlink"])
def test_a_private_key_others_can_read_or_that_is_a_symlink_is_refused(tmp_path, texts,
                                                                        how):
    keygen(tmp_path / "k")
    key = tmp_path / "k"
    if how == "symlink":
        os.rename(key, tmp_path / "real.key")
        os.symlink(tmp_path / "real.key", key)
    else:
        os.chmod(key, int(how, 8))
    with pytest.raises(SigningError, match="symlink|lets group or other read it"):
        publish(Store(str(tmp_path / "store")), "s", texts[0], {"rows": 1}, key=key)
    assert not (tmp_path / "store" / "policies").exists()
    done = subprocess.run(mlfs_command("fleet", "train", "--store", str(tmp_path / "store"),
                                       "--subsystem", "s", "--key", str(key)),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "refused" in done.stderr


def test_mlfs_train_installs_the_newest_genuine_policy_records_it_and_refuses_loose_keys(
        mount_root, tmp_path):
    x = np.random.default_rng(0).random((200, 2))
    text = lgb.train({"objective": "regression", "verbose": -1, "min_data_in_leaf": 5},
                     lgb.Dataset(x, label=x[:, 0], feature_name=["mem_pressure",
                                                                  "knob_read_ahead_kb"]),
                     num_boost_round=2).model_to_string()
    pub = keygen(tmp_path / "k")
    store = tmp_path / "store"
    old = publish(Store(str(store)), "sim.readahead", text, {"rows": 1}, key=tmp_path / "k")
    new = publish(Store(str(store)), "sim.readahead", text.replace("\n\n", "\n\n\n", 1),
                  {"rows": 2}, key=tmp_path / "k")
    assert old["sha256"] != new["sha256"]
    _copy(store, "sim.readahead", 1, "sim.readahead", 9_999_999_999)
    m = Mount(mount_root)
    m.start()
    try:
        train = mlfs_command("train", str(m.mountpoint), "sim.readahead", "--fleet",
                             str(store), "--trusted-key", str(pub), "--max-seconds", "2")
        done = subprocess.run(train, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 0, done.stderr[-800:]
        assert f"starting from fleet policy 2 (sha256 {new['sha256']}" in done.stderr
        mark = json.loads((m.state_dir / "fleet-policies" / "sim.readahead.json").read_text())
        assert (mark["version"], mark["sha256"]) == (2, new["sha256"])
        os.chmod(pub, 0o666)
        done = subprocess.run(train, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 2
        assert done.stderr.strip().count("\n") == 0 and "chmod go-w" in done.stderr
    finally:
        m.kill()
    assert hashlib.sha256(text.encode()).hexdigest() == old["sha256"]
