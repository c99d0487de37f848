"""A predictor's incumbent on a real mount: the rule sweep over sim.disks' labelled
drive-days names the rule that stands (mlfs/core/models/rule_incumbent.py)."""

from __future__ import annotations

import re
import signal

import pytest
from mlfs.backends.sim_disks import RECORDS

from tests.harness import Mount, sh, sim_disks_config, wait_for

#: "incumbent <target> <rule> (declared|swept): caught <n>/<events>, ... over <events> events"
INCUMBENT = re.compile(r"^incumbent failure (?P<rule>.+) \((?P<origin>declared|swept)\): "
                       r"caught (?P<caught>\d+)/(?P<events>\d+), false alarms \d+, .*"
                       r"over (?P=events) events and (?P<negatives>\d+) negative rows$")


@pytest.fixture
def disks(mount_root):
    mount = Mount(mount_root, sim_disks_config(seed=11, drives=2000))
    mount.start()
    try:
        yield mount
    finally:
        mount.kill(signal.SIGTERM)


def _standing(model) -> re.Match | None:
    return INCUMBENT.match((model / "incumbent").read_text().splitlines()[0])


def test_the_incumbent_file_names_the_rule_swept_from_labelled_outcomes(disks):
    model = disks.mountpoint / "sim.disks" / "models" / "p"
    assert sh(f"mkdir {model} && echo start > {model}/control").returncode == 0
    first = _standing(model)
    assert first is not None and first["rule"] == "smart_failed"  # nothing judged: declared
    assert first["events"] == "0"
    # failures come at about 0.09 a day among 2,000 drives; the sweep rescored after some
    # (and negatives: a drive-day is one once 30 days passed without its failure)
    wait_for(lambda: (m := _standing(model)) is not None and int(m["events"]) >= 2
             and int(m["negatives"]) > 0, timeout=90,
             what="the rule sweep over judged failures and negatives")
    lines = (model / "incumbent").read_text().splitlines()
    standing = _standing(model)
    if standing["origin"] == "declared":
        assert standing["rule"] == "smart_failed"
    else:
        assert standing["rule"].split()[0] in RECORDS
    challengers = [line for line in lines if line.startswith("challenger failure ")]
    for line in challengers:
        assert line.split()[2] in RECORDS and line.split()[3] in (">=", "<=")
    assert lines[-2].startswith(f"model, against the rule {standing['rule']}: caught ")
    assert lines[-1] in ("model_beats_rule no", "model_beats_rule yes")
