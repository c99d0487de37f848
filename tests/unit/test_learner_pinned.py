"""The knob learner's decisions pinned per seed: what it recommends, explores, fits,
corrects and challenges on the simulator and on synthetic subsystems.

The learner is deterministic per seed (one LightGBM thread, `deterministic`), so a
change of its structure that leaves its behaviour alone leaves every value below
alone: the knob the simulator ran on each tick (policy argmax and explorations alike),
the mode transitions, the policy text, the fit, correction and challenge statistics,
the coordinate search on a grid too large to list.  The expected values
(tests/unit/learner_pinned.json) were recorded from the learner before it was split
into trainers/knob/{encoding,dataset,fit,challenge,exploration}.py.  A change that
means to alter the learner's choices re-records them:

    .venv/bin/python -m tests.unit.test_learner_pinned > tests/unit/learner_pinned.json
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from mlfs.trainers.knob.learner import KnobLearner

from tests.bench.learning import run_seed
from tests.harness import INFO, make_dataset, make_feedback, phase_features

EXPECTED = Path(__file__).with_name("learner_pinned.json")
SEEDS = (0, 1)
TICKS = 800


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _clean(value):
    """JSON-able and exact: floats by repr, NaN as a string, timings left out."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float | np.floating):
        return repr(float(value)) if math.isfinite(value) else str(float(value))
    if isinstance(value, np.integer):
        return int(value)
    return value


def _simulated(seed: int, initial_policy: str | None = None) -> dict:
    result = run_seed(seed, TICKS, keep_rows=True, initial_policy=initial_policy)
    rows = result["rows"]
    applied = json.dumps([rows.column("knob_read_ahead_kb").to_pylist(),
                          rows.column("controller").to_pylist()])
    return {"applied": _sha(applied), "transitions": result["transitions"],
            "ticks_to_recommendation": result["ticks_to_recommendation"],
            "explored_ticks": result["exploration_cost"]["explored_ticks"],
            "vs_oracle": result["whole_run"]["vs_oracle"]}, rows


def _decisions(learner: KnobLearner, states: list[dict], rng: np.random.Generator) -> dict:
    return {
        "recommend": [learner.recommend(s) for s in states],
        "explore": [learner.explore(s, rng) for s in states],
        "explore_cover": [learner.explore(s, rng, cover=5) for s in states],
        "uncovered": [learner.uncovered(s, 5) for s in states],
        "predict": [learner.predict(s, {k: learner.grids[0][1] for k in learner.knobs})
                    for s in states],
    }


def _on_simulator_rows(rows: pa.Table, other: pa.Table) -> dict:
    """A fresh learner on one run's rows: fit, decisions, correction; then a prior
    fitted on them adopted and challenged by a learner on the other run's rows."""
    info = json.loads(json.dumps(_sim_info()))
    learner = KnobLearner(info, seed=3)
    kept = learner.add_dataset(rows)
    out: dict = {"kept": kept, "explored_rows": learner.explored_rows,
                 "fit": learner.fit(), "policy": _sha(learner.policy_text())}
    table = rows.slice(rows.num_rows - 50)
    states = [{c: table.column(c)[i].as_py() for c in learner.feature_columns}
              for i in (0, 25, 49)]
    out["decisions"] = _decisions(learner, states, np.random.default_rng(5))
    host = KnobLearner(info, seed=4)
    host.add_dataset(other)
    host.adopt(learner.policy_text())
    out["challenge_rolled_out"] = host.challenge(rolled_out=True)
    out["challenge"] = host.challenge()
    out["challenge_policy"] = _sha(host.policy_text())
    out["challenged_decisions"] = _decisions(host, states, np.random.default_rng(6))
    return out


def _sim_info() -> dict:
    """`sim.readahead`'s info as its runtime publishes it."""
    from mlfs.backends.sim_readahead import SimReadahead

    from mlfs.config import load_config
    from mlfs.core.mount.exchange import Exchange

    with tempfile.TemporaryDirectory(prefix="mlfs-pin-") as state:
        exchange = Exchange(load_config(None), Path(state), [SimReadahead(seed=0)])
        try:
            return exchange.runtimes["sim.readahead"].info()
        finally:
            exchange.close()


def _synthetic() -> dict:
    """The harness's subsystem: fit, correct, a settling knob, goal min."""
    learner = KnobLearner(INFO, seed=7)
    for k in range(3):
        learner.add_dataset(make_dataset(800, seed=20 + k, start_tick=800 * k,
                                         explore_share=0.3))
    rng = np.random.default_rng(8)
    states = [phase_features(p, rng) for p in ("sequential", "random", "strided")]
    out: dict = {"fit": learner.fit(), "policy": _sha(learner.policy_text())}
    out["before"] = _decisions(learner, states, np.random.default_rng(9))
    out["correct"] = learner.correct(make_feedback(learner, 300, seed=10, bias=1.4))
    out["corrected_policy"] = _sha(learner.policy_text())
    out["after"] = _decisions(learner, states, np.random.default_rng(11))
    settling = json.loads(json.dumps(INFO))
    settling["knobs"]["read_ahead_kb"]["settle_ticks"] = 3
    settling["objective"]["goal"] = "min"
    slow = KnobLearner(settling, seed=12, relative=True)
    slow.add_dataset(make_dataset(1500, seed=30, goal="min", explore_share=0.4,
                                  phase_len=30))
    out["settling_fit"] = slow.fit()
    out["settling_policy"] = _sha(slow.policy_text())
    out["settling"] = _decisions(slow, states, np.random.default_rng(13))
    return out


def _large_grid() -> dict:
    """Three knobs, one a choice: 5,880 combinations, searched one knob at a time."""
    info = json.loads(json.dumps(INFO))
    info["knobs"] = {
        "a": {"type": "int", "min": 0, "max": 4096, "default": 128},
        "b": {"type": "int", "min": 0, "max": 4096, "default": 64},
        "c": {"type": "choice", "choices": [f"c{i}" for i in range(30)], "default": "c3"},
    }
    rng = np.random.default_rng(14)
    n = 1200
    columns = {"tick": np.arange(n)}
    for name in info["features"]:
        columns[name] = rng.normal(size=n)
    a = rng.choice([0, 4, 64, 128, 1024], n)
    b = rng.choice([0, 16, 64, 512], n)
    c = rng.integers(0, 30, n)
    columns["knob_a"], columns["knob_b"] = a, b
    columns["knob_c"] = np.array([f"c{i}" for i in c])
    columns["objective"] = (-np.abs(np.log2(1 + a) - 6 - columns["seq_ratio"])
                            - 0.1 * np.abs(c - 12) + 0.01 * b ** 0.5
                            + rng.normal(0, 0.1, n))
    learner = KnobLearner(info, seed=15)
    learner.add_dataset(pa.table(columns))
    states = [{f: float(v) for f, v in zip(info["features"], rng.normal(size=5),
                                           strict=True)} for _ in range(3)]
    return {"fit": learner.fit(), "policy": _sha(learner.policy_text()),
            "decisions": _decisions(learner, states, np.random.default_rng(16)),
            "blank_explore": [KnobLearner(info).explore(s, np.random.default_rng(17))
                              for s in states]}


def observe() -> dict:
    """Everything pinned, as JSON-able values."""
    out: dict = {}
    runs = {}
    for seed in SEEDS:
        out[f"sim_{seed}"], runs[seed] = _simulated(seed)
    learned = _on_simulator_rows(runs[0], runs[1])
    out["learned"] = learned
    prior = KnobLearner(_sim_info(), seed=0)
    prior.add_dataset(runs[0])
    prior.fit()
    out["sim_1_adopted"], _ = _simulated(1, initial_policy=prior.policy_text())
    out["synthetic"] = _synthetic()
    out["large_grid"] = _large_grid()
    return _clean(out)


def test_the_learner_decides_exactly_as_recorded():
    expected = json.loads(EXPECTED.read_text())
    observed = json.loads(json.dumps(observe()))
    for key in expected:
        assert observed[key] == expected[key], key
    assert observed.keys() == expected.keys()


if __name__ == "__main__":
    json.dump(observe(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
