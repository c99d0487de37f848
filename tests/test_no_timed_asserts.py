"""No test outside tests/bench/ asserts how long something took.

A timed assertion fails on a slow or loaded machine while nothing is broken
(CI's machines differ ~3x in speed from one day to the next): a test waits on a
condition with a timeout that only means "broken", and speed is measured in
tests/bench/, as a ratio against a reference timed in the same run.  This walks
every test module's syntax tree, so the rule is checked by a tool, not by memory.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: the clocks a duration is read from
CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"})


def _reads_clock(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in CLOCKS and isinstance(n.func.value, ast.Name)
               and n.func.value.id == "time" for n in ast.walk(node))


def _is_duration(node: ast.AST, durations: set[str]) -> bool:
    """A difference of clock readings, or a name that holds one."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in durations:
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and _reads_clock(n):
            return True
    return False


def timed_assertions(source: str) -> list[int]:
    """Line numbers of asserts comparing a duration (`clock() - start`, or a name set to one)."""
    tree = ast.parse(source)
    durations: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_duration(node.value, set()):
            durations |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
                  and _is_duration(node.test, durations))


def test_no_test_outside_the_benches_asserts_an_elapsed_time():
    found = [f"{path.relative_to(TESTS)}:{line}"
             for path in sorted(TESTS.rglob("*.py")) if "bench" not in path.parts
             for line in timed_assertions(path.read_text())]
    assert found == [], "timed assertions (move them to tests/bench/): " + ", ".join(found)


def test_the_checker_finds_a_timed_assertion_and_passes_a_deadline_loop():
    timed = ("import time\nstarted = time.monotonic()\nelapsed = time.monotonic() - started\n"
             "assert elapsed < 2\nassert time.perf_counter() - started < 5\n")
    assert timed_assertions(timed) == [4, 5]
    waiting = ("import time\ndeadline = time.monotonic() + 20\n"
               "while True:\n    assert time.monotonic() < deadline\n")
    assert timed_assertions(waiting) == []
