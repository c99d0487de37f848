"""A model's saved state and its running policy, on a real state directory (no mount).

Start-up reads back model.json and policy.txt; what fails validation is set
aside as `.damaged`, the model starts with defaults or without a policy, and
`errors` says why.  A running policy that fails or runs over its CPU budget
is removed the same way, with a `policy` event carrying the reason.
"""

from __future__ import annotations

import json
import re

import lightgbm as lgb
import numpy as np
import pytest
from mlfs.backends.sim_readahead import SimReadahead

from mlfs.config import parse_config
from mlfs.core.models import policy as policy_module
from mlfs.core.mount.exchange import Exchange
from tests.harness import fix_sizes

CONFIG = """
[modes]
silence_seconds = 600.0
"""
COLUMNS = ["sequential_ratio", "mem_pressure", "knob_read_ahead_kb"]


def sim_policy(rounds: int = 5) -> bytes:
    rng = np.random.default_rng(0)
    x = rng.random((300, 3)) * [1, 1, 4096]
    data = lgb.Dataset(x, label=x[:, 0] + x[:, 2] / 4096, feature_name=COLUMNS,
                       params={"verbose": -1})
    return lgb.train({"verbose": -1, "num_leaves": 4, "min_data_in_leaf": 5}, data,
                     num_boost_round=rounds).model_to_string().encode()


def open_exchange(state) -> Exchange:
    return Exchange(parse_config(CONFIG, "test"), state, [SimReadahead(seed=1)])


@pytest.fixture
def state(tmp_path):
    """A state dir with model m: started, pinned to collaboration, running a policy."""
    exchange = open_exchange(tmp_path)
    rt = exchange.runtimes["sim.readahead"]
    proxy = rt.create_model("m")
    proxy.start()
    proxy.set_mode(b"collaboration\n")
    text = sim_policy()
    proxy.set_policy(text)  # built in-process (the check process is for uploads)
    exchange.close()
    return tmp_path


def model_dir(state):
    return state / "sim.readahead" / "models" / "m"


def reopen(state):
    exchange = open_exchange(state)
    return exchange, exchange.runtimes["sim.readahead"].models["m"]


def test_saved_state_comes_back_as_it_was(state):
    exchange, proxy = reopen(state)
    try:
        assert proxy.policy is not None and proxy.policy.verified.trees == 5
        assert (proxy.pinned, proxy.mode, proxy.state) == ("collaboration", "collaboration",
                                                           "started")
        assert json.loads((model_dir(state) / "model.json").read_text()) == {
            "knobs": ["read_ahead_kb"], "pinned": "collaboration", "state": "started"}
        assert list(proxy.errors) == []
        assert sorted(p.name for p in model_dir(state).iterdir() if ".tmp" in p.name) == []
    finally:
        exchange.close()


@pytest.mark.parametrize("damage, reason", [
    (lambda t: t[: len(t) // 2], "truncated"),
    (lambda t: t.replace(b"right_child=", b"right_child=0 ", 1), "right_child has"),
    (lambda t: t.replace(b"split_feature=", b"split_feature=100000000 ", 1), "split_feature"),
    (lambda t: b"\x00" * 100, "not printable ASCII"),
])
def test_a_damaged_saved_policy_is_set_aside_and_the_model_starts_without_it(
        state, damage, reason):
    path = model_dir(state) / "policy.txt"
    bad = damage(path.read_bytes())
    path.write_bytes(bad)
    exchange, proxy = reopen(state)
    try:
        assert proxy.policy is None
        assert not path.exists()
        assert (model_dir(state) / "policy.txt.damaged").read_bytes() == bad
        [line] = list(proxy.errors)
        assert " policy.txt " in line and reason in line and "policy.txt.damaged" in line
        assert proxy.pinned == "collaboration"  # the rest of the state is kept
    finally:
        exchange.close()


@pytest.mark.parametrize("content, reason", [
    (b"{not json", "not JSON"),
    (b"[1, 2, 3]", "not a JSON object but list"),
    (b'{"knobs": "read_ahead_kb", "pinned": null, "state": "started"}',
     "knobs is not a list of knob names"),
    (b'{"knobs": [1], "pinned": null, "state": "started"}', "knobs is not a list"),
    (b'{"knobs": ["no_such"], "pinned": null, "state": "started"}', "'no_such' is not a knob"),
    (b'{"knobs": [], "pinned": "turbo", "state": "started"}', "pinned is 'turbo'"),
    (b'{"knobs": [], "pinned": 7, "state": "started"}', "pinned is '7'"),
    (b'{"knobs": [], "pinned": null, "state": 5}', "state is '5'"),
    (b'{"knobs": [], "pinned": null, "state": "started", "x": 1}', "unknown field 'x'"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
])
def test_a_damaged_model_json_is_set_aside_and_the_model_starts_with_defaults(
        state, content, reason):
    path = model_dir(state) / "model.json"
    path.write_bytes(content)
    exchange, proxy = reopen(state)
    try:
        assert (proxy.state, proxy.pinned, proxy.mode) == ("initialized", None, "learning")
        assert (model_dir(state) / "model.json.damaged").read_bytes() == content
        assert json.loads(path.read_text()) == {"knobs": ["read_ahead_kb"], "pinned": None,
                                                "state": "initialized"}
        assert any(" model.json " in line and reason in line for line in proxy.errors), (
            list(proxy.errors))
        assert proxy.policy is not None  # the policy file is checked on its own
    finally:
        exchange.close()


def run_policy_ticks(state, prepare) -> tuple[list[dict], object]:
    exchange, proxy = reopen(state)
    rt = exchange.runtimes["sim.readahead"]
    events = exchange.bus.subscribe("sim.readahead")
    try:
        prepare(proxy)
        for _ in range(20):
            rt.tick()
            if proxy.policy is None:
                break
        lines = events.take(1 << 20).decode().splitlines()
        return [json.loads(line) for line in lines], proxy
    finally:
        events.close()
        exchange.close()


def removed_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("event") == "policy" and e.get("status") == "removed"]


def test_a_decision_over_the_cpu_budget_removes_the_policy_with_a_reason(state, monkeypatch):
    monkeypatch.setattr(policy_module, "DECIDE_BUDGET_SECONDS", -1.0)
    events, proxy = run_policy_ticks(state, lambda proxy: None)
    assert proxy.policy is None
    [event] = removed_events(events)
    assert "of CPU, over the -1000 ms budget" in event["reason"]
    [line] = list(proxy.errors)
    assert "policy removed: a decision took" in line
    assert (model_dir(state) / "policy.txt.damaged").exists()
    assert not (model_dir(state) / "policy.txt").exists()  # not back at the next start


def test_a_policy_that_fails_in_lightgbm_is_removed_the_same_way(state):
    def widen(proxy):  # one column more than the model has: LightGBM refuses to predict
        matrix = proxy.policy._matrix
        proxy.policy._matrix = np.zeros((matrix.shape[0], matrix.shape[1] + 1))

    events, proxy = run_policy_ticks(state, widen)
    assert proxy.policy is None
    [event] = removed_events(events)
    assert event["reason"].startswith("prediction failed: ")
    assert "policy removed: prediction failed" in list(proxy.errors)[0]


def test_a_policy_whose_finite_leaves_sum_to_infinity_is_removed(state):
    path = model_dir(state) / "policy.txt"
    text = path.read_text()
    huge = re.sub(r"^leaf_value=.*$", lambda m: "leaf_value=" + " ".join(
        ["1.7e308"] * len(m.group(0).split(" "))), text, flags=re.M)
    path.write_text(fix_sizes(huge))  # (with stale tree_sizes LightGBM would abort)
    events, proxy = run_policy_ticks(state, lambda proxy: None)
    assert proxy.policy is None
    [event] = removed_events(events)
    assert event["reason"] == "a prediction is not a finite number"


def test_a_keep_alive_upload_of_the_policy_in_force_is_not_checked_again(tmp_path,
                                                                        monkeypatch):
    """A trainer's keep-alive uploads the policy in force every few seconds; its check
    process took 5-15 s on a loaded machine, so the trainer was heard too late and the
    model pinned to emergency as silent (issue 55).  The running policy is not checked
    again; any other text still is."""
    exchange = open_exchange(tmp_path)
    try:
        proxy = exchange.runtimes["sim.readahead"].create_model("m")
        text = sim_policy()
        proxy.set_policy(text, proxy.check_policy(text))
        checks: list[bytes] = []
        real = policy_module.check_in_subprocess

        def counted(data: bytes) -> dict:
            checks.append(data)
            return real(data)

        monkeypatch.setattr("mlfs.core.models.installed_policy.check_in_subprocess", counted)
        assert proxy.check_policy(text) is proxy.policy
        assert checks == []
        other = sim_policy(rounds=6)
        assert proxy.check_policy(other).text == other
        assert checks == [other]
    finally:
        exchange.close()
