"""Reading a drive's health from `smartctl --json`: the fields a failure predictor uses.

smartmontools' JSON output (`smartctl --json --info --health --attributes DEV`) differs by
protocol, so this module maps each protocol's own fields onto one flat row, and nothing
else: a field a drive does not report is None, never invented.

- ATA/SATA: the attribute table `ata_smart_attributes.table` (id, raw.value, value,
  thresh); the five attributes Backblaze watches (5 reallocated sectors, 187 reported
  uncorrectable, 188 command timeout, 197 current pending, 198 offline uncorrectable) and
  whether any attribute is at or below its threshold (SMART's own trip).
- NVMe: `nvme_smart_health_information_log` (media_errors, num_err_log_entries,
  critical_warning, available_spare against available_spare_threshold, percentage_used).
- SCSI/SAS: `scsi_error_counter_log` (total uncorrected read and write errors) and
  `scsi_grown_defect_list` (the SCSI counterpart of reallocated sectors).
On every protocol: `smart_status.passed` (the drive's overall verdict), `temperature.current`
and `power_on_time.hours`.  The parsing is tested on recorded output of real drives
(tests/data/smartctl/).
"""

from __future__ import annotations

import json
import subprocess

#: the ATA attributes of Backblaze's rule of thumb, by id, and their row names
BACKBLAZE_ATTRIBUTES = {5: "smart_5_raw", 187: "smart_187_raw", 188: "smart_188_raw",
                        197: "smart_197_raw", 198: "smart_198_raw"}
#: every field `health_row` returns (None where the drive does not report it)
FIELDS = ("protocol", "passed", "threshold_tripped", "temperature_c", "power_on_hours",
          *BACKBLAZE_ATTRIBUTES.values(), "media_errors", "error_log_entries",
          "critical_warning", "uncorrected_errors", "grown_defects")
#: seconds `read_smartctl` waits for smartctl (a drive in error recovery can hang it)
SMARTCTL_TIMEOUT = 30.0
#: the most bytes of smartctl output read (a full report is about 10-40 KB)
MAX_OUTPUT = 1 << 20


def _obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def health_row(report: dict) -> dict:
    """One flat row of health fields from a parsed `smartctl --json` report."""
    row: dict = dict.fromkeys(FIELDS)
    row["protocol"] = _obj(report.get("device")).get("protocol")
    status = report.get("smart_status")
    if isinstance(status, dict) and isinstance(status.get("passed"), bool):
        row["passed"] = status["passed"]
    row["temperature_c"] = _int(_obj(report.get("temperature")).get("current"))
    row["power_on_hours"] = _int(_obj(report.get("power_on_time")).get("hours"))
    table = _obj(report.get("ata_smart_attributes")).get("table")
    if isinstance(table, list):
        tripped = False
        for attribute in table:
            if not isinstance(attribute, dict):
                continue
            ident = attribute.get("id")
            name = BACKBLAZE_ATTRIBUTES.get(ident) if isinstance(ident, int) else None
            if name is not None:
                row[name] = _int(_obj(attribute.get("raw")).get("value"))
            value, thresh = _int(attribute.get("value")), _int(attribute.get("thresh"))
            if value is not None and thresh and value <= thresh:
                tripped = True
        row["threshold_tripped"] = tripped
    nvme = report.get("nvme_smart_health_information_log")
    if isinstance(nvme, dict):
        row["media_errors"] = _int(nvme.get("media_errors"))
        row["error_log_entries"] = _int(nvme.get("num_err_log_entries"))
        row["critical_warning"] = _int(nvme.get("critical_warning"))
        spare, floor = _int(nvme.get("available_spare")), _int(
            nvme.get("available_spare_threshold"))
        row["threshold_tripped"] = bool(
            (row["critical_warning"] or 0) or (spare is not None and floor is not None
                                               and spare <= floor))
    scsi = report.get("scsi_error_counter_log")
    if isinstance(scsi, dict):
        total = 0
        for direction in ("read", "write", "verify"):
            count = _int(_obj(scsi.get(direction)).get("total_uncorrected_errors"))
            total += count or 0
        row["uncorrected_errors"] = total
    row["grown_defects"] = _int(report.get("scsi_grown_defect_list"))
    return row


def backblaze_flag(row: dict) -> bool:
    """Backblaze's rule of thumb on one row: any of SMART 5/187/188/197/198 raw above 0."""
    return any((row.get(name) or 0) > 0 for name in BACKBLAZE_ATTRIBUTES.values())


def read_smartctl(device: str, smartctl: str = "smartctl") -> dict:
    """Run smartctl on `device` (no shell, a timeout, bounded output) and parse its JSON.

    smartctl's exit status is a bit mask (bit 3: the disk is failing, bits 4-7: errors
    logged): anything with valid JSON is a report; OSError/ValueError otherwise.
    """
    done = subprocess.run([smartctl, "--json", "--info", "--health", "--attributes",
                           "--nocheck=standby", device],
                          capture_output=True, timeout=SMARTCTL_TIMEOUT, check=False)
    out = done.stdout[:MAX_OUTPUT]
    report = json.loads(out)
    if not isinstance(report, dict):
        raise ValueError(f"smartctl {device}: not a JSON object")
    return report
