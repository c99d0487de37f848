"""Issue 10, attack 1, before and after: crafted policies through the daemon's own code.

    .venv/bin/python -m tests.bench.policy_attacks [--repo DIR]

Each attack runs in a child process started in DIR (default: this checkout)
with DIR first on PYTHONPATH, so `--repo` pointed at an older checkout shows
what that code does.  The child does what the daemon does with an upload:
the check process (`check_in_subprocess`), then `Policy` and one `decide`.
A child killed by SIGSEGV (-11), SIGABRT (-6) or still running after the
timeout (a spin) is what the daemon would have suffered.  Last, the decide()
time of a typical trainer policy (150 trees).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import sys
import lightgbm as lgb
import numpy as np
from mlfs.abi import Knob
from mlfs.core.models import policy as P
from mlfs.base.errors import Refused
COLUMNS = ["sequential_ratio", "mem_pressure", "knob_read_ahead_kb"]
def three_node(split_feature, right_child):
    return ("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n"
            "max_feature_idx=2\nobjective=regression\nfeature_names=" + " ".join(COLUMNS) +
            "\nfeature_infos=none none none\n\nTree=0\nnum_leaves=3\nnum_cat=0\n"
            f"split_feature={split_feature}\nthreshold=0.5 0.5\ndecision_type=2 2\n"
            f"left_child=-1 -2\nright_child={right_child}\nleaf_value=1 2 3\nshrinkage=1\n\n\n"
            "end of trees\n").encode()
def truncated():
    x = np.random.default_rng(0).random((300, 3)) * [1, 1, 4096]
    data = lgb.Dataset(x, label=x[:, 0], feature_name=COLUMNS, params={"verbose": -1})
    text = lgb.train({"verbose": -1, "num_leaves": 4, "min_data_in_leaf": 5}, data,
                     num_boost_round=4).model_to_string().encode()
    return text[: len(text) // 5]
text = {"split_feature": lambda: three_node("0 100000000", "1 -3"),
        "cycle": lambda: three_node("0 1", "1 0"), "truncated": truncated}[sys.argv[1]]()
try:
    P.check_in_subprocess(text)
    print("check process: accepted", flush=True)
except Refused as exc:
    print("check process: refused:", exc.reason, flush=True)
try:
    knob = Knob("read_ahead_kb", "int", 128, 0, 4096)
    policy = P.Policy(text, {"read_ahead_kb": knob}, ["read_ahead_kb"], COLUMNS[:2], "max")
    print("daemon: loaded; deciding", flush=True)
    policy.decide({"sequential_ratio": 0.9, "mem_pressure": 0.9}, {"read_ahead_kb": 128})
    print("daemon: decided", flush=True)
except Refused as exc:
    print("daemon: refused:", exc.reason, flush=True)
'''

DECIDE = r'''
import time
from mlfs.abi import Knob
from mlfs.core.models.policy import Policy
from tests.harness import FEATURES, INFO, make_dataset
from mlfs.trainers.knob.learner import KnobLearner
learner = KnobLearner(INFO)
for k in range(5):
    learner.add_dataset(make_dataset(1000, seed=10 + k, start_tick=1000 * k, explore_share=0.25))
learner.fit()
spec = INFO["knobs"]["read_ahead_kb"]
knob = Knob("read_ahead_kb", "int", spec["default"], spec["min"], spec["max"])
policy = Policy(learner.policy_text().encode(), {"read_ahead_kb": knob}, ["read_ahead_kb"],
                FEATURES, "max")
features = {f: 0.5 for f in FEATURES}
wall, cpu = [], []
for _ in range(1000):
    t, c = time.perf_counter(), time.thread_time()
    policy.decide(features, {"read_ahead_kb": 128})
    wall.append(time.perf_counter() - t)
    cpu.append(time.thread_time() - c)
wall.sort()
cpu.sort()
print(f"decide(): {learner.booster.num_trees()} trees, {len(policy.candidates)} candidates: "
      f"wall p50 {wall[500] * 1e3:.3f} ms p99 {wall[990] * 1e3:.3f} ms, "
      f"CPU p50 {cpu[500] * 1e3:.3f} ms p99 {cpu[990] * 1e3:.3f} ms")
'''


def run(repo: Path, code: str, *args: str, timeout: float = 20.0) -> tuple[str, str]:
    env = {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return f"still running after {timeout:g} s (killed)", out
    status = {-11: "SIGSEGV", -6: "SIGABRT"}.get(done.returncode, f"exit {done.returncode}")
    return status, done.stdout


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    print(f"code under test: {repo}")
    for attack in ("split_feature", "cycle", "truncated"):
        status, out = run(repo, CHILD, attack)
        print(f"== {attack}: {status}")
        for line in out.strip().splitlines():
            print("   " + line)
    if (repo / "mlfs" / "core" / "verifier.py").exists():
        print(run(repo, DECIDE, timeout=300)[1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
