"""README's test command really runs each module whole and the machine's modules in series.

tests/conftest.py marks every test with an `xdist_group`: its module, or "machine"
for the modules that share the kernel's state (SERIAL_MODULES).  pytest-xdist's
`--dist loadgroup` honours the marks only as far as the pytest it runs on lets it
rename a test's id: under pytest 9.2 it did not, and the suite ran with every
module's tests spread over both workers (module fixtures made twice, the loop-device
and sysctl tests beside each other).  This runs a small session through the same
conftest, the way README's command does, and checks what actually happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import SERIAL_MODULES
from tests.harness import REPO

#: each test records (module, worker, start, end); a module fixture records its set-up
MODULE = '''
import json, os, time, pytest
LOG = {log!r}

def note(**what):
    with open(LOG, "a") as fh:
        fh.write(json.dumps(what) + "\\n")

@pytest.fixture(scope="module")
def made_once():
    note(module=__name__, fixture=True)

@pytest.mark.parametrize("n", range(4))
def test_one(made_once, n):
    began = time.monotonic()
    time.sleep(0.3)
    note(module=__name__, worker=os.environ.get("PYTEST_XDIST_WORKER"),
         began=began, ended=time.monotonic())
'''


def test_each_module_runs_whole_on_one_worker_and_the_machines_modules_in_series(tmp_path):
    serial = sorted(SERIAL_MODULES)[:2]
    names = [*serial, "test_apart_one", "test_apart_two"]
    log = tmp_path / "log.jsonl"
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    for name in names:
        (tmp_path / f"{name}.py").write_text(MODULE.format(log=str(log)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-o", "addopts=", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    notes = [json.loads(line) for line in log.read_text().splitlines()]
    made = sorted(n["module"] for n in notes if n.get("fixture"))
    assert made == sorted(names), "a module fixture made more than once: its tests were split"
    runs = [n for n in notes if not n.get("fixture")]
    for name in names:
        workers = {n["worker"] for n in runs if n["module"] == name}
        assert len(workers) == 1, f"{name} ran on {workers}"
    first, second = ([n for n in runs if n["module"] == name] for name in serial)
    assert first[0]["worker"] == second[0]["worker"]
    spans = sorted((min(n["began"] for n in group), max(n["ended"] for n in group))
                   for group in (first, second))
    assert spans[0][1] <= spans[1][0], "the machine's modules overlapped"

