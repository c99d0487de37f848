"""sim.disks reproduces the published statistics its docstring cites, and is deterministic."""

import numpy as np
import pytest
from mlfs.backends.sim_disks import (
    RECORDS,
    WARNED_SHARE,
    DrivePopulation,
    SimDisks,
    backblaze_rule,
    smart_threshold_rule,
)


@pytest.fixture(scope="module")
def year():
    """One simulated year of 20,000 drives (7.3 M drive-days)."""
    return DrivePopulation(drives=20_000, seed=0).days(365)


def _share_of_failures_flagged(columns, flags) -> float:
    ids = columns["drive_id"]
    failed = np.unique(ids[columns["failed"]])
    flagged = np.unique(ids[flags & np.isin(ids, failed)])
    return len(flagged) / len(failed)


def test_annualised_failure_rate_is_backblazes(year):
    afr = year["failed"].sum() / 20_000
    assert 0.012 <= afr <= 0.021  # Backblaze: 1.37 % (2022) and 1.70 % (2023)


def test_about_three_quarters_of_failures_show_the_five_attributes_first(year):
    share = _share_of_failures_flagged(year, backblaze_rule(year))
    assert abs(share - WARNED_SHARE) < 0.06  # Backblaze 2016: 76.7 %


def test_smart_threshold_catches_only_a_few_per_cent_of_failures(year):
    share = _share_of_failures_flagged(year, smart_threshold_rule(year))
    assert 0.03 <= share <= 0.10  # Hughes et al. 2002: 3-10 %


def test_about_four_per_cent_of_working_drives_have_non_zero_raw_values(year):
    last = year["day"] == year["day"].max()
    working = last & ~year["failed"]
    assert 0.03 <= backblaze_rule(year)[working].mean() <= 0.055  # Backblaze 2016: 4.2 %


def test_a_failed_drive_is_replaced_and_never_reported_again(year):
    ids = year["drive_id"]
    failed_ids = ids[year["failed"]]
    assert len(np.unique(failed_ids)) == len(failed_ids)
    for drive in failed_ids[:20]:
        days = year["day"][ids == drive]
        assert days.max() == year["day"][(ids == drive) & year["failed"]][0]
    assert (year["day"] == year["day"].min()).sum() == 20_000  # population kept whole


def test_same_seed_same_days_other_seed_other_days():
    a = DrivePopulation(drives=500, seed=7).days(30)
    b = DrivePopulation(drives=500, seed=7).days(30)
    c = DrivePopulation(drives=500, seed=8).days(30)
    for name in RECORDS:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["read_latency_ms"], c["read_latency_ms"])


def test_a_tick_publishes_one_record_per_drive_with_the_declared_fields():
    sub = SimDisks(drives=300, seed=1)
    sample = sub.step({})
    assert sample.records.dtype.names == tuple(RECORDS)
    assert len(sample.records) == 300
    assert sample.features["drives"] == 300
    assert sample.features["failures"] == int(sample.records["failed"].sum())
