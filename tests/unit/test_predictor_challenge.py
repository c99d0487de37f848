"""A fleet predictor on a host: kept while the host cannot judge it, dropped when the
host's own predicts the host's newest rows better (`trainers.predictor.challenge`)."""

import numpy as np
import pytest
from mlfs.backends.sim_disks import RECORDS, DrivePopulation
from mlfs.trainers.predictor.learner import (
    _shift_first_tree,
    challenge,
    fit_predictor,
    log_loss,
    policy_probabilities,
)

FIELDS = [n for n in RECORDS if n not in ("drive_id", "failed")]
HORIZON = 30


def drive_days(seed: int, drives: int, days: int) -> dict[str, np.ndarray]:
    columns = DrivePopulation(drives=drives, seed=seed).days(days)
    columns["tick"] = columns.pop("day")
    return columns


@pytest.fixture(scope="module")
def fleet_prior() -> str:
    """A predictor fitted on another population (seed 11): what a fleet round publishes."""
    learner, figures = fit_predictor(drive_days(11, 3000, 365), "drive_id", "failed",
                                     HORIZON, FIELDS, rounds=60)
    assert learner is not None and figures["positives"] >= 20
    return learner.policy_text()


def test_a_prior_that_overstates_every_risk_is_dropped_for_the_hosts_own(fleet_prior):
    host = drive_days(12, 3000, 365)
    # deliberately wrong: the same trees, log-odds raised by 4 (about 50 times the risk)
    wrong = _shift_first_tree(fleet_prior, 4.0)
    verdict = challenge(wrong, host, "drive_id", "failed", HORIZON, FIELDS)
    assert verdict["chosen"] == "local", verdict
    assert verdict["holdout_positives"] >= 1
    assert verdict["local_log_loss"] < verdict["prior_log_loss"]
    assert "this host's own" in verdict["why"]


@pytest.mark.parametrize(("seed", "why"), [
    (19, "under 20"),  # its one failure came late: none before the newest fifth
    (26, "no positive row"),  # its one failure came early: nothing to judge the newest by
])
def test_the_prior_is_kept_while_the_host_cannot_fit_or_judge_its_own(fleet_prior, seed, why):
    host = drive_days(seed, 200, 120)  # a small, young host (deterministic per seed)
    verdict = challenge(_shift_first_tree(fleet_prior, 4.0), host, "drive_id", "failed",
                        HORIZON, FIELDS)
    assert verdict["chosen"] == "prior", verdict
    assert why in verdict["why"]
    assert "local_log_loss" not in verdict  # nothing of its own was judged


def test_the_judged_probabilities_are_the_policys_own_with_its_window_features(fleet_prior):
    import lightgbm as lgb

    from mlfs.abi import window_features
    host = drive_days(14, 500, 90)
    p = policy_probabilities(fleet_prior, host, "drive_id")
    names = lgb.Booster(model_str=fleet_prior).feature_name()
    columns = dict(host)
    columns.update(window_features(host["drive_id"], host["tick"], host,
                                   [n for n in names if n not in host]))
    again = lgb.Booster(model_str=fleet_prior).predict(
        np.column_stack([columns[n] for n in names]))
    np.testing.assert_allclose(p, again)
    assert 0 < p.mean() < 0.05  # calibrated: drive failures are rare


def test_log_loss_rewards_the_calibrated_probability():
    label = np.array([True] + [False] * 99)
    assert log_loss(np.full(100, 0.01), label) < log_loss(np.full(100, 0.5), label)
    assert np.isfinite(log_loss(np.array([0.0, 1.0]), np.array([True, False])))
