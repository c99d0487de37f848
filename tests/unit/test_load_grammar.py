"""The root `load` grammar (docs/ABI.md): one TOML value per key, bare words as strings."""

from __future__ import annotations

import errno

import pytest

from mlfs.base.errors import Refused
from mlfs.core.mount.loading import (
    Load,
    Remembered,
    Unload,
    parse_command,
    read_remembered,
    write_remembered,
)


def words(line: str) -> list[str]:
    return line.split()


def test_values_are_toml_and_bare_words_are_strings():
    got = parse_command(words('load linux.block devices=["loop7"] '
                              'apply={read_ahead_kb=[0,4096]} tracepoints=true'))
    assert got == Load({"backend": "linux.block", "devices": ["loop7"],
                        "apply": {"read_ahead_kb": [0, 4096]}, "tracepoints": True})
    got = parse_command(words("load sim.readahead name=sim2 seed=3 noise=0.5"))
    assert got == Load({"backend": "sim.readahead", "name": "sim2", "seed": 3, "noise": 0.5})
    assert parse_command(words("unload sim2")) == Unload("sim2")


@pytest.mark.parametrize("line", [
    "load", "load name=x", "load Bad!", "load sim.readahead seed", "load sim.readahead =3",
    "load sim.readahead Seed=3", "load sim.readahead seed=", "load sim.readahead seed=[1",
    "load sim.readahead name=a name=b", "load sim.readahead backend=x",
    "load sim.readahead name={a", "unload", "unload a b",
    "load sim.readahead " + " ".join(f"k{i}=1" for i in range(33)),
])
def test_malformed_commands_are_einval_with_a_reason(line):
    with pytest.raises(Refused) as refused:
        parse_command(words(line))
    assert refused.value.errno == errno.EINVAL and refused.value.reason


def test_the_remembered_loads_round_trip_and_a_damaged_file_is_set_aside(tmp_path):
    loads = [Remembered("sim2", {"backend": "sim.readahead", "name": "sim2", "seed": 3})]
    write_remembered(tmp_path, loads)
    assert read_remembered(tmp_path) == loads
    (tmp_path / "loaded.json").write_text("{not json")
    assert read_remembered(tmp_path) == []
    assert not (tmp_path / "loaded.json").exists()
    assert list(tmp_path.glob("loaded.json*"))  # kept aside for the operator


def test_a_deeply_nested_value_is_refused_with_a_reason_not_a_recursion_error():
    """Red-team pass 2: ~700 levels in a 4 KiB `load` line made tomllib raise
    RecursionError: EIO and no line in the root `errors`."""
    from mlfs.base.errors import Refused
    from mlfs.core.mount.loading import MAX_NESTING, parse_command

    for deep in ("[" * 700 + "]" * 700, "{a=" * 300 + "1" + "}" * 300):
        with pytest.raises(Refused) as info:
            parse_command(["load", "sim.readahead", f"seed={deep}"])
        assert info.value.errno == errno.EINVAL
        assert f"nested deeper than {MAX_NESTING}" in info.value.reason
    parse_command(["load", "sim.readahead", "phases=[\"sequential\",\"strided\"]"])
