"""The registry of model kinds, in process: which subsystems a kind serves, a model
made as the subsystem's first kind, turned into another before it starts, read back
as that kind after a restart."""

from __future__ import annotations

import errno

import pytest
from mlfs.backends.sim_disks import SimDisks
from mlfs.backends.sim_readahead import SimReadahead

from mlfs.base.errors import Refused
from mlfs.config import parse_config
from mlfs.core.models import kinds
from mlfs.core.models.kinds import KINDS, ModelKind, kinds_serving, register
from mlfs.core.models.kinds.knob.proxy import KnobProxy
from mlfs.core.mount.exchange import Exchange

CONFIG = "[modes]\nsilence_seconds = 600.0\n"


class EchoProxy(KnobProxy):
    """A second kind for the test: a knob model under another name."""

    kind = "echo"


@pytest.fixture
def echo_kind():
    entry = register(ModelKind("echo", "a knob model by another name",
                               serves=lambda sub: bool(sub.knobs), proxy=EchoProxy,
                               conformance=KINDS["knob"].conformance, sets_knobs=True))
    yield entry
    del kinds.KINDS["echo"]


def exchange(tmp_path, backend) -> Exchange:
    return Exchange(parse_config(CONFIG, "test"), tmp_path, [backend])


def test_each_subsystem_serves_the_kinds_whose_predicate_holds(tmp_path):
    assert kinds_serving(SimReadahead(seed=1)) == ["knob"]
    assert kinds_serving(SimDisks(seed=1, drives=10)) == ["predictor", "anomaly"]
    with pytest.raises(ValueError, match="registered already"):
        register(KINDS["knob"])


def test_a_model_turns_into_another_kind_until_it_starts(tmp_path, echo_kind):
    ex = exchange(tmp_path, SimReadahead(seed=1))
    rt = ex.runtimes["sim.readahead"]
    assert rt.kinds == ["knob", "echo"] and rt.info()["kinds"] == ["knob", "echo"]
    proxy = rt.create_model("m")
    assert proxy.kind == "knob" and (proxy.directory / "kind").read_text() == "knob\n"
    with pytest.raises(Refused) as refused:
        rt.change_kind(proxy, b"nothing\n")
    assert refused.value.errno == errno.EINVAL and "nothing" in proxy.errors[-1]
    echo = rt.change_kind(proxy, b"echo\n")
    assert isinstance(echo, EchoProxy) and rt.models["m"] is echo
    assert echo.generation == proxy.generation and proxy.destroyed
    assert (echo.directory / "kind").read_text() == "echo\n"
    echo.start()
    with pytest.raises(Refused) as refused:
        rt.change_kind(echo, b"knob\n")
    assert refused.value.errno == errno.EBUSY
    assert rt.change_kind(echo, b"echo\n") is echo  # its own kind: nothing to do
    rt.tick()
    ex.close()
    again = exchange(tmp_path, SimReadahead(seed=1)).runtimes["sim.readahead"]
    assert isinstance(again.models["m"], EchoProxy) and again.models["m"].active
    assert not [p for p in (tmp_path / "sim.readahead" / "models").iterdir()
                if p.name.startswith(".")]
    again.close()


def test_a_model_of_a_kind_no_longer_served_is_left_alone(tmp_path, echo_kind):
    ex = exchange(tmp_path, SimReadahead(seed=1))
    rt = ex.runtimes["sim.readahead"]
    rt.change_kind(rt.create_model("m"), b"echo\n")
    ex.close()
    del kinds.KINDS["echo"]
    try:
        again = exchange(tmp_path, SimReadahead(seed=1)).runtimes["sim.readahead"]
        assert "m" not in again.models
        assert (tmp_path / "sim.readahead" / "models" / "m" / "kind").exists()  # kept
        again.close()
    finally:
        kinds.KINDS["echo"] = echo_kind
