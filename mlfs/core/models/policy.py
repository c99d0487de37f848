"""Synthesized logic: a trainer's LightGBM model run by the proxy itself.

Contract: the model is a regression of the subsystem's objective on columns
named exactly as in the dataset — feature columns and `knob_<name>` columns
(raw values; choice knobs as the index into `choices`).  On an ML tick the
proxy builds one row per candidate knob setting from the latest features,
predicts, and applies the best candidate (argmax, or argmin for goal "min");
the prediction is the tick's `expected`.

A policy is untrusted: before LightGBM ever sees it, `mlfs.base.verifier`
reads it strictly (every node, index and number; bounded trees, leaves and
depth) -- in a separate, resource-limited process (`python -m
mlfs.core.models.policy`) that then loads and runs it once, and again here, in
`Policy`, which is also what a saved policy goes through at start-up.  A
prediction then visits a bounded number of nodes, all in range; `decide`
still measures each decision and raises `PolicyRemoved` over a budget.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mlfs.abi import Knob, KnobValue, candidate_values, distance_from_default, knob_column
from mlfs.base.errors import invalid
from mlfs.base.verifier import MAX_POLICY_BYTES, gives_probability, verify

__all__ = ["MAX_POLICY_BYTES", "Policy", "PolicyRemoved", "check_in_subprocess"]

MAX_CANDIDATES = 4096
CHECK_TIMEOUT = 20.0
# The package this daemon runs: the check process must import the same one,
# whatever the daemon's cwd (an editable install elsewhere would win otherwise).
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

# A decision predicts one row per candidate, and each row visits at most
# `path_sum` nodes (the verifier's bound), so its cost is known before the
# policy runs.  Measured: 3.3-3.8 ns of CPU per node visited (LightGBM 4.7,
# one thread, a 150-tree trainer policy on 4096 rows).  32 M nodes is then
# ~0.12 s of CPU at most; our trainer needs ~16 k typically (14 candidates x
# path sum ~1,100) and ~5 M with 4096 candidates.
MAX_DECISION_NODES = 32_000_000
# A decision runs on the trio thread, so it stalls every file operation while
# it runs.  Over this much CPU time (thread_time: other processes' load does
# not count) the policy costs what the static bound did not foresee: it is
# removed.  Twice the bound above; a typical decision takes ~0.4 ms.
DECIDE_BUDGET_SECONDS = 0.25


class PolicyRemoved(Exception):
    """A running policy failed or ran over its budget: the proxy removes it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_knob(knob: Knob, value: KnobValue) -> float:
    if knob.type == "choice":
        return float(knob.choices.index(str(value)))
    return float(value)


def check_in_subprocess(text: bytes) -> dict:
    """Verify and load the model in a throw-away process; return its feature names.

    Defence in depth: the child runs the verifier before LightGBM, under
    memory and CPU limits, so a text that gets past the verifier and still
    crashes or spins LightGBM kills only the child.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mlfs.core.models.policy"],
            input=text,
            capture_output=True,
            timeout=CHECK_TIMEOUT,
            cwd=PACKAGE_ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise invalid("policy check timed out") from None
    if done.returncode == 2:  # the verifier refused: its reason is the last line
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["refused"]
        raise invalid(tail[0][:300])
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["crashed"]
        raise invalid(f"policy does not load as a LightGBM model: {tail[0][:200]}")
    # the answer is the last line: LightGBM may print its warnings to stdout before it
    # (`objective=huber alpha:-1e-400` did, and was refused as "gave no answer")
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (ValueError, IndexError):
        shown = lines[0][:200] if lines else "nothing"
        raise invalid(f"policy check gave no answer (it printed {shown!r})") from None


class Policy:
    """A loaded, validated policy for one model's controlled knobs."""

    def __init__(self, text: bytes, knobs: dict[str, Knob], controlled: list[str],
                 features: list[str], goal: str) -> None:
        import lightgbm

        self.verified = verify(text)  # before LightGBM sees a byte of it
        self.text = text
        self.goal = goal
        if gives_probability(self.verified):
            raise invalid(f"policy objective {self.verified.objective!r} gives a probability "
                          "(a predictor's policy); a knob model needs a regression of the "
                          "objective")
        self.feature_names = list(self.verified.feature_names)
        knob_by_column = {knob_column(name): knobs[name] for name in knobs}
        feature_set = set(features)
        controlled_columns = {knob_column(name) for name in controlled}
        for name in self.feature_names:
            if name not in feature_set and name not in knob_by_column:
                raise invalid(f"policy uses column {name!r}, not a feature or knob of this "
                              "subsystem")
        used = [c for c in self.feature_names if c in controlled_columns]
        if not used:
            raise invalid("policy uses none of the knobs this model controls")
        grids = [candidate_values(knob_by_column[c]) for c in used]
        #: the candidate grid's shape: candidate i is cell i of it (product order)
        self.grid_shape = tuple(len(grid) for grid in grids)
        combos = list(itertools.islice(itertools.product(*grids), MAX_CANDIDATES))
        nodes = len(combos) * self.verified.path_sum
        if nodes > MAX_DECISION_NODES:
            raise invalid(f"a decision would visit up to {nodes} nodes ({len(combos)} candidates "
                          f"x {self.verified.path_sum}), over {MAX_DECISION_NODES}")
        self.booster = lightgbm.Booster(model_str=text.decode("ascii"))
        if (list(self.booster.feature_name()) != self.feature_names
                or self.booster.num_trees() != self.verified.trees):
            raise invalid("LightGBM read another model than the verifier did")
        self.candidates = [dict(zip(used, combo, strict=True)) for combo in combos]
        self._knob_by_column = knob_by_column
        self._used = used
        self._distance = np.array([sum(distance_from_default(knob_by_column[c], cand[c])
                                       for c in used) for cand in self.candidates])
        self.is_default = self._distance == 0
        #: each candidate's position on the grid, one rank per knob
        self._grid_ranks = np.array(np.unravel_index(np.arange(len(combos)),
                                                     self.grid_shape)).T
        self._matrix = np.zeros((len(combos), len(self.feature_names)), dtype=np.float64)
        for j, name in enumerate(self.feature_names):
            if name in used:
                knob = knob_by_column[name]
                self._matrix[:, j] = [encode_knob(knob, c[name]) for c in self.candidates]
        self.decisions = 0
        self.seconds = 0.0

    @staticmethod
    def _best(scores: np.ndarray, order: np.ndarray) -> int:
        """The best score's candidate; a tie goes to the least `order`."""
        tied = np.flatnonzero(scores == scores.max())
        return int(tied[np.argmin(order[tied])])

    def decide(self, features: dict[str, float], current: dict[str, KnobValue],
               allowed: np.ndarray | None = None, toward_wanted: bool = False
               ) -> tuple[dict[str, KnobValue], float]:
        """The best candidate for these features: (knob name -> value, prediction).

        `allowed`: a mask of the candidates it may choose among (`mlfs.core.models.safe_set`).
        When the best of all is not allowed, a tie among the allowed goes to the least
        change from the default, or with `toward_wanted` to the fewest grid steps from
        that best (then the least change).

        Raises PolicyRemoved when LightGBM fails, predicts inf or nan, or the
        decision took more than DECIDE_BUDGET_SECONDS of CPU (its result is
        not used then).
        """
        started = time.perf_counter()
        cpu = time.thread_time()
        matrix = self._matrix
        for j, name in enumerate(self.feature_names):
            if name in self._used:
                continue
            if name in self._knob_by_column:
                knob = self._knob_by_column[name]
                matrix[:, j] = encode_knob(knob, current[knob.name])
            else:
                value = features.get(name, math.nan)
                matrix[:, j] = value if value is not None else math.nan
        try:
            predictions = self.booster.predict(matrix, num_threads=1)
        except Exception as exc:
            raise PolicyRemoved(f"prediction failed: {str(exc)[:200]}") from exc
        if not np.isfinite(predictions).all():  # finite leaves can still sum (or exp) to inf
            raise PolicyRemoved("a prediction is not a finite number")
        spent = time.thread_time() - cpu
        if spent > DECIDE_BUDGET_SECONDS:
            raise PolicyRemoved(f"a decision took {spent * 1000:.0f} ms of CPU, over the "
                                f"{DECIDE_BUDGET_SECONDS * 1000:.0f} ms budget")
        scores = predictions if self.goal == "max" else -predictions
        best = self._best(scores, self._distance)
        if allowed is not None and not allowed[best]:
            order = self._distance
            if toward_wanted:  # the safe set grows a step at a time in that direction
                steps = np.abs(self._grid_ranks - self._grid_ranks[best]).sum(axis=1)
                order = steps * (1 + self._distance.max()) + self._distance
            best = self._best(np.where(allowed, scores, -np.inf), order)
        choice = {self._knob_by_column[c].name: self.candidates[best][c] for c in self._used}
        self.decisions += 1
        self.seconds += time.perf_counter() - started
        return choice, float(predictions[best])


def _check_main() -> int:
    """Child side of check_in_subprocess: verify, load, predict once, report columns.

    Exit status 2 with the reason on stderr: the verifier refused.
    """
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (15, 15))
    except (ImportError, ValueError, OSError):
        pass
    from mlfs.base.errors import Refused

    # LightGBM imports scikit-learn and pandas at import time when they are installed
    # (the fleet extra installs both) for interfaces this check never uses: it needs
    # only Booster.  Hidden from this child, `import lightgbm` takes 0.96 s CPU and
    # 56 MB instead of 4.1 s and 194 MB (measured, /usr/bin/time, lightgbm 4.7): less
    # of the CPU limit above spent before the policy is even read, and a faster upload.
    # The whole child on a 150-tree policy, 2-CPU VM at load 11: 13-21 s wall before
    # (CHECK_TIMEOUT is 20 s: a good policy could be refused as "timed out"), 3.5-4.4 s
    # with them hidden.
    for name in ("sklearn", "pandas"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # import -> ImportError
    text = sys.stdin.buffer.read()
    try:
        verified = verify(text)
    except Refused as exc:
        print(exc.reason, file=sys.stderr)
        return 2
    import lightgbm

    booster = lightgbm.Booster(model_str=text.decode("ascii"))
    names = booster.feature_name()
    booster.predict(np.zeros((1, len(names))), num_threads=1)
    json.dump({"feature_names": names, "trees": booster.num_trees(),
               "verified": list(verified.feature_names) == list(names)}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_check_main())
