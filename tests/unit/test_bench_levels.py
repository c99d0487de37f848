"""tests/bench/levels.py: every level's standing read back from a model's saved pairs."""

from __future__ import annotations

import random

from mlfs.core.models.safe_set import SafeSet
from mlfs.core.models.safe_set_file import encode
from tests.bench import levels


def _pairs(level: float, policy_ratio: float, ticks: range, rng: random.Random,
           safe: SafeSet) -> None:
    """Policy episodes of two ticks at `level`, `policy_ratio` the default, 5 % noise,
    with a trainer's exploration (not the model's) between them."""
    for t in ticks:
        if t % 3 == 2:
            safe.measured({"knob_ra": 32}, level * rng.uniform(0.95, 1.05),
                          rng.gauss(0.9, 0.05), t, by_model=False)
        else:
            safe.measured({"knob_ra": 512}, level * rng.uniform(0.95, 1.05),
                          rng.gauss(policy_ratio, 0.05), t, by_model=True)


def test_each_level_shows_whether_the_policy_holds_there(tmp_path):
    rng = random.Random(7)
    safe = SafeSet()
    _pairs(1000.0, 1.4, range(0, 300), rng, safe)  # a scan: the policy clearly wins
    _pairs(50.0, 0.97, range(1000, 1300), rng, safe)  # random reads: it does not
    path = tmp_path / "measured.json"
    path.write_bytes(encode(safe))

    lines = levels.report(levels.load(path))

    by_level = {float(line.split()[1].rstrip(":")): line
                for line in lines if line.startswith("level")}
    assert len(by_level) == 2 and min(by_level) < 60 and max(by_level) > 900
    low, high = by_level[min(by_level)], by_level[max(by_level)]
    assert high.endswith("holds here: True")
    assert low.endswith("holds here: False")
    assert "knob_ra=512" in "\n".join(lines)


def test_tail_keeps_only_the_models_latest_ticks():
    rng = random.Random(3)
    safe = SafeSet()
    _pairs(1000.0, 0.6, range(0, 100), rng, safe)  # an early policy, worse
    _pairs(1000.0, 1.4, range(100, 200), rng, safe)  # a late one, better
    tail = levels.tail_only(safe, 0.5)
    _, pairs = tail.held()
    kept = pairs["tick"][pairs["by_model"]]
    assert kept.min() >= 99 and len(kept) < (pairs["by_model"].size)
    # the trainer's explorations are kept whole: they are not the policy's evidence
    assert (~pairs["by_model"]).sum() == sum(1 for t in range(200) if t % 3 == 2)
