"""Synthesized logic: a trainer's LightGBM model run by the proxy itself.

Contract: the model is a regression of the subsystem's objective on columns
named exactly as in the dataset — feature columns and `knob_<name>` columns
(raw values; choice knobs as the index into `choices`).  On an ML tick the
proxy builds one row per candidate knob setting from the latest features,
predicts, and applies the best candidate (argmax, or argmin for goal "min");
the prediction is the tick's `expected`.

A policy file is first loaded in a separate, resource-limited process
(`python -m mlfs.core.policy`), so a malformed or hostile file can crash only
that process, never the daemon; only then is it loaded here.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from mlfs.abi import Knob, KnobValue, candidate_values, distance_from_default, knob_column

from .errors import invalid

MAX_POLICY_BYTES = 16 << 20
MAX_CANDIDATES = 4096
CHECK_TIMEOUT = 20.0


def encode_knob(knob: Knob, value: KnobValue) -> float:
    if knob.type == "choice":
        return float(knob.choices.index(str(value)))
    return float(value)


def check_in_subprocess(text: bytes) -> dict:
    """Load the model in a throw-away process; return its feature names."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mlfs.core.policy"],
            input=text,
            capture_output=True,
            timeout=CHECK_TIMEOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    except subprocess.TimeoutExpired:
        raise invalid("policy check timed out") from None
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["crashed"]
        raise invalid(f"policy does not load as a LightGBM model: {tail[0][:200]}")
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise invalid("policy check gave no answer") from None


class Policy:
    """A loaded, validated policy for one model's controlled knobs."""

    def __init__(self, text: bytes, knobs: dict[str, Knob], controlled: list[str],
                 features: list[str], goal: str) -> None:
        import lightgbm

        self.text = text
        self.goal = goal
        self.booster = lightgbm.Booster(model_str=text.decode("ascii"))
        self.feature_names = list(self.booster.feature_name())
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
        combos = list(itertools.islice(itertools.product(*grids), MAX_CANDIDATES))
        self.candidates = [dict(zip(used, combo, strict=True)) for combo in combos]
        self._knob_by_column = knob_by_column
        self._used = used
        self._distance = np.array([sum(distance_from_default(knob_by_column[c], cand[c])
                                       for c in used) for cand in self.candidates])
        self._matrix = np.zeros((len(combos), len(self.feature_names)), dtype=np.float64)
        for j, name in enumerate(self.feature_names):
            if name in used:
                knob = knob_by_column[name]
                self._matrix[:, j] = [encode_knob(knob, c[name]) for c in self.candidates]
        self.decisions = 0
        self.seconds = 0.0

    def decide(self, features: dict[str, float], current: dict[str, KnobValue]
               ) -> tuple[dict[str, KnobValue], float]:
        """The best candidate for these features: (knob name -> value, prediction)."""
        started = time.perf_counter()
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
        predictions = self.booster.predict(matrix, num_threads=1)
        top = predictions.max() if self.goal == "max" else predictions.min()
        tied = np.flatnonzero(predictions == top)
        best = int(tied[np.argmin(self._distance[tied])])  # a tie: the least change
        choice = {self._knob_by_column[c].name: self.candidates[best][c] for c in self._used}
        self.decisions += 1
        self.seconds += time.perf_counter() - started
        return choice, float(predictions[best])


def _check_main() -> int:
    """Child side of check_in_subprocess: load, predict once, report columns."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (15, 15))
    except (ImportError, ValueError, OSError):
        pass
    import lightgbm

    text = sys.stdin.buffer.read()
    booster = lightgbm.Booster(model_str=text.decode("ascii"))
    names = booster.feature_name()
    booster.predict(np.zeros((1, len(names))), num_threads=1)
    json.dump({"feature_names": names, "trees": booster.num_trees()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_check_main())
