"""smartctl --json of real drives (tests/data/smartctl) maps onto health rows, nothing invented."""

import json
from pathlib import Path

import pytest
from mlfs.backends.smart import FIELDS, backblaze_flag, health_row

DATA = Path(__file__).resolve().parent.parent / "data" / "smartctl"


def _row(name: str) -> dict:
    return health_row(json.loads((DATA / name).read_text()))


def test_a_sata_drive_gives_its_five_backblaze_attributes_and_no_trip():
    row = _row("ST3500418AS_11.json")
    assert (row["smart_5_raw"], row["smart_187_raw"], row["smart_188_raw"],
            row["smart_197_raw"], row["smart_198_raw"]) == (1, 0, 1, 0, 0)
    assert row["passed"] is True and row["threshold_tripped"] is False
    assert row["temperature_c"] == 32 and row["power_on_hours"] == 44670
    assert backblaze_flag(row)  # one reallocated sector, one timeout: Backblaze looks
    assert row["media_errors"] is None  # an ATA drive has no NVMe log


def test_an_nvme_drive_gives_its_health_log_and_no_ata_attributes():
    row = _row("nvme-null-CT250P2SSD8-nvme0.json")
    assert row["protocol"] == "NVMe"
    assert (row["media_errors"], row["error_log_entries"], row["critical_warning"]) == (0, 1, 0)
    assert row["threshold_tripped"] is False
    assert row["smart_5_raw"] is None and not backblaze_flag(row)


def test_a_sas_drive_gives_uncorrected_errors_and_grown_defects():
    row = _row("SEAGATE_ST373453LC_26.json")
    assert row["protocol"] == "SCSI"
    assert row["uncorrected_errors"] == 1 + 535
    assert isinstance(row["grown_defects"], int)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json")))
def test_every_recorded_drive_parses_into_exactly_the_fields(name):
    row = _row(name)
    assert set(row) == set(FIELDS)
    assert row["passed"] in (True, False)


def test_a_damaged_report_gives_nones_not_an_exception():
    row = health_row({"ata_smart_attributes": {"table": [None, {"id": "5"}]},
                      "smart_status": "yes", "temperature": [1], "device": 3})
    assert row["passed"] is None and row["smart_5_raw"] is None
