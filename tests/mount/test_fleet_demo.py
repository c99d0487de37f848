"""`mlfs demo --fleet N` as a user runs it: a real subprocess, real mounts, real commands.

The small run (two hosts, 200 ticks a phase at 0.05 s) checks the demo's shape, never
its learning: in 200 ticks neither arm is expected to reach recommendation mode, so
the test asserts that both arms are named with their figures, that the run exits 0,
and that every mount and process the demo reported is gone afterwards, as is its
temporary directory.  How much the fleet helps is tests/bench/fleet_coldstart.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, fuse_unavailable


def demo(*args: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlfs", "demo", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


@pytest.mark.parametrize("n", ["1", "x", "17", "-2"])
def test_a_bad_fleet_size_is_one_line_and_exit_2(n):
    done = demo("--fleet", n, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and f"--fleet {n}" in done.stderr


def test_fleet_options_without_fleet_are_one_line_and_exit_2():
    done = demo("--ticks", "100", timeout=60)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1)
    assert "--ticks" in done.stderr and "--fleet" in done.stderr


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_fleet_demo_compares_the_newcomer_with_the_lone_host_and_leaves_nothing(tmp_path):
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = demo("--fleet", "2", "--host-ticks", "200", "--ticks", "200", "--seed", "3",
                timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    root = re.search(r"a fleet of 2 hosts in (\S+) ", out).group(1)
    assert Path(root).parent == tmp_path
    pids = [int(p) for p in re.findall(r"(?:mount|trainer) pid (\d+)", out)]
    assert len(pids) == 2 * 4, out  # two fleet hosts, the newcomer, the lone host
    assert re.search(r"fleet policy \d+: \d+ rows from 2 hosts", out), out
    number = r"(\d+|not reached)"
    for host, arm in (("newcomer", "fleet"), ("alone", "alone"), ("host1", "alone"),
                      ("host2", "alone")):
        assert re.search(rf"^{host}\s+{arm}\s+\d+\s+\d+\s+{number}\s+{number}\s+\d\.\d{{3}}$",
                         out, re.M), out
    assert re.search(rf"newcomer vs alone \(seed 3\): ticks to recommendation mode "
                     rf"{number} vs {number}; second half \d\.\d{{3}} vs \d\.\d{{3}} of the oracle",
                     out), out
    assert [pid for pid in pids if _alive(pid)] == []
    assert root not in Path("/proc/self/mountinfo").read_text()
    assert not Path(root).exists()
    assert list(tmp_path.iterdir()) == []
