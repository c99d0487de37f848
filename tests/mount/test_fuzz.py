"""Property-based fuzzing of the steering files on a real mount (bounded).

Every input written with one os.write either succeeds or fails with EINVAL or
EBUSY (never EIO, never another errno); the daemon keeps serving; and a
refused write changes nothing: not the model's knobs, mode or state, and its
value never comes into effect.
"""

from __future__ import annotations

import collections
import errno

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import new_model, wait_for, write_errno

FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

MODES = ["emergency", "learning", "collaboration", "recommendation"]
ALLOWED = {0, errno.EINVAL, errno.EBUSY}

space = st.sampled_from(["", " ", "  ", "\t", "\n", "\r", "\x00", "\x0b"])
junk_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=40)


def decorate(words: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """A word with random whitespace and control characters around it."""
    return st.tuples(space, words, space, st.sampled_from(["", "\n", "\n\n"])).map(
        lambda t: "".join(t).encode("utf-8", errors="surrogatepass"))


def any_bytes(valid: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        valid,
        st.binary(max_size=80),
        junk_text.map(lambda s: s.encode("utf-8", errors="surrogatepass")),
        st.integers(4080, 4200).map(lambda n: (b"read_ahead_kb=64\n" * 300)[:n]),
    )


knob_value = st.one_of(
    st.integers(-20, 5000).map(str),
    st.sampled_from(["", "1.5", "nan", "inf", "1e3", "0x10", "+5", "-0", "0128",
                     "4096", "4097", "١", "12a"]),
)
token = st.one_of(
    st.builds(lambda v: f"read_ahead_kb={v}", knob_value),
    st.builds(lambda v: f"expect={v}", st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["", "x", "1e999", "-3"]))),
    st.builds(lambda v: f"ttl={v}", st.one_of(st.integers(-3, 50).map(str),
                                              st.sampled_from(["", "1.0", "x"]))),
    st.sampled_from(["swappiness=10", "read_ahead_kb", "=5", "read_ahead_kb==5",
                     "READ_AHEAD_KB=5", "nr_requests=4"]),
)
rec_line = st.lists(token, min_size=0, max_size=4).map(" ".join)
rec_write = st.lists(rec_line, min_size=1, max_size=4).map(
    lambda lines: ("\n".join(lines) + "\n").encode())
valid_line = st.builds(
    lambda ra, expect, ttl: " ".join(filter(None, [f"read_ahead_kb={ra}", expect, ttl])),
    st.integers(0, 4096),
    st.one_of(st.just(""), st.floats(-1e6, 1e6).map(lambda v: f"expect={v!r}")),
    st.one_of(st.just(""), st.integers(1, 1000).map(lambda v: f"ttl={v}")))
valid_rec_write = st.lists(valid_line, min_size=1, max_size=3).map(
    lambda lines: ("\n".join(lines) + "\n").encode())


write = write_errno  # one open + one write(2) + close; 0 or the errno


def snapshot(model) -> dict[str, str]:
    return {name: (model / name).read_text() for name in ("knobs", "mode", "mode_switching",
                                                            "state")}


def check_alive(mount) -> None:
    assert mount.alive(), "the daemon died"
    assert (mount.mountpoint / "version").read_text().startswith("mlfs ")


def check_log(mount) -> None:
    log = (mount.state_dir / "mlfs.log").read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


def accepted_value(line: bytes) -> int | None:
    """The read_ahead_kb of one line of an accepted write."""
    for tok in line.decode().split():
        key, _, value = tok.partition("=")
        if key == "read_ahead_kb":
            return int(value)
    return None


def test_fuzzed_recommend_writes_succeed_or_are_einval_and_change_nothing(mount):
    model = new_model(mount.sub, "fz")
    assert write(model / "mode", b"recommendation\n") == 0
    assert write(model / "recommend", b"read_ahead_kb=128\n") == 0
    wait_for(lambda: (model / "state").read_text() == "running\n", what="running")
    knob = mount.sub / "knobs/read_ahead_kb"
    ruling = {128}  # the values that may be in effect: the default and any ever accepted
    outcomes: collections.Counter[int] = collections.Counter()

    @FUZZ
    @given(data=any_bytes(st.one_of(valid_rec_write, rec_write)),
           mode=st.sampled_from(["recommendation"] * 4 + ["emergency"]))
    def prop(data: bytes, mode: str) -> None:
        assert write(model / "mode", mode.encode()) == 0
        before = snapshot(model)
        result = write(model / "recommend", data)
        outcomes[result] += 1
        assert result in ALLOWED, (data, errno.errorcode.get(result, result))
        if result == 0 and data.strip():
            ruling.update(accepted_value(line) for line in data.split(b"\n") if line.strip())
            return
        assert snapshot(model) == before, data
        value = int(knob.read_text())
        assert value in ruling, (data, value)
        check_alive(mount)

    prop()
    check_alive(mount)
    check_log(mount)
    print("outcomes:", dict(outcomes))
    assert outcomes[0] >= 5 and outcomes[errno.EINVAL] >= 5, outcomes
    assert outcomes[errno.EBUSY] >= 1, outcomes


def test_fuzzed_mode_writes_pin_or_are_einval_and_change_nothing(mount):
    model = new_model(mount.sub, "fz")
    valid = decorate(st.sampled_from([*MODES, "auto"]))
    words = decorate(st.sampled_from([*MODES, "auto", "Auto", "pinned", "learning auto",
                                      "emergency\nlearning", "default"]))

    outcomes: collections.Counter[int] = collections.Counter()

    @FUZZ
    @given(data=any_bytes(st.one_of(valid, words)))
    def prop(data: bytes) -> None:
        before = snapshot(model)
        result = write(model / "mode", data)
        outcomes[result] += 1
        assert result in ALLOWED - {errno.EBUSY}, (data, errno.errorcode.get(result, result))
        after = snapshot(model)
        if result == 0 and data.split():
            word = data.split()[0].decode()
            if word == "auto":  # automatic switching resumes; a pinned emergency ends
                assert after["mode_switching"] == "auto\n"
                assert after["mode"] == (before["mode"] if before["mode"] != "emergency\n"
                                         else "learning\n")
            else:
                assert (after["mode"], after["mode_switching"]) == (f"{word}\n", "pinned\n")
        else:
            assert after == before, data
        check_alive(mount)

    prop()
    check_log(mount)
    print("outcomes:", dict(outcomes))
    assert outcomes[0] >= 5 and outcomes[errno.EINVAL] >= 5, outcomes


def test_fuzzed_control_writes_run_a_command_or_are_einval_and_change_nothing(mount):
    model = new_model(mount.sub, "fz", start=False)
    rival = new_model(mount.sub, "rival", start=False)
    commands = ["start", "stop", "prepare_dataset", "discard_dataset"]
    words = decorate(st.sampled_from([*commands, "Start", "restart", "start stop",
                                      "prepare", "discard_dataset\nstart", "destroy"]))

    outcomes: collections.Counter[int] = collections.Counter()

    @FUZZ
    @given(data=any_bytes(words), target=st.sampled_from(["fz", "rival"]))
    def prop(data: bytes, target: str) -> None:
        path = model if target == "fz" else rival
        other = rival if target == "fz" else model
        before, other_before = snapshot(path), snapshot(other)
        result = write(path / "control", data)
        outcomes[result] += 1
        assert result in ALLOWED, (data, errno.errorcode.get(result, result))
        after = snapshot(path)
        word = data.split()[0].decode() if result == 0 and data.split() else None
        if word == "start":
            assert after["state"] in ("started\n", "running\n")
            assert other_before["state"] not in ("started\n", "running\n")
        elif word == "stop":
            assert after["state"] == "stopped\n" or before["state"] == "initialized\n"
        else:
            assert after == before, data
            if result == errno.EBUSY:
                assert other_before["state"] in ("started\n", "running\n")
        assert snapshot(other) == other_before
        check_alive(mount)

    prop()
    check_log(mount)
    print("outcomes:", dict(outcomes))
    assert outcomes[0] >= 5 and outcomes[errno.EINVAL] >= 5, outcomes


@pytest.mark.parametrize("file", ["knobs", "objective"])
def test_fuzzed_writes_to_other_attributes_are_einval_at_worst(mount, file):
    model = new_model(mount.sub, "fz")
    path = model / "knobs" if file == "knobs" else mount.sub / "objective"

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=any_bytes(decorate(st.sampled_from(["read_ahead_kb", "1.5", "nan", "-3"]))))
    def prop(data: bytes) -> None:
        result = write(path, data)
        assert result in ALLOWED, (data, errno.errorcode.get(result, result))
        assert (model / "knobs").read_text() == "read_ahead_kb\n"
        check_alive(mount)

    prop()
    check_log(mount)
