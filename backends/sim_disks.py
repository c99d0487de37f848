"""sim.disks: a simulated population of hard drives that degrade and fail, one row per drive-day.

Why it exists: a failure predictor cannot be judged on the two or three drives of one
machine, where a failure is a once-in-decades event.  Ceph's and Backblaze's predictors
were judged on populations of tens of thousands of drives over years; this simulator
gives the same kind of data, deterministic per seed and in virtual time (one tick is one
day of the whole population, thousands of drive-days a second), so a predictor's recall
and false alarms can be measured against SMART's own threshold trip and against
Backblaze's rule of thumb, as `sim.readahead` lets a tuner be measured against the
default.  It is a *record source*: each tick publishes one record per drive alive that
day, no Python object per row (the columns are numpy arrays from the start).

The parameters below are fixed from published statistics, before any model was trained
on this simulator (they must not be changed to suit a model afterwards; a change needs
its own source and a new `SIM_VERSION`).

Published statistics and what they set
--------------------------------------
Backblaze, "Hard Drive Stats" annual reports (data drives, all models):
  annualised failure rate (AFR) 1.37 % in 2022 and 1.70 % in 2023; per-model lifetime
  AFRs in the same tables range from well under 1 % to about 3 %.
  -> `MODEL_AFR`: four drive models at 0.8, 1.2, 1.8 and 2.6 % a year, equally common,
     a population mean of 1.6 %.  Each drive's failure day is exponential with its
     model's daily hazard (constant: the simulator has no bathtub curve).
Backblaze, "What SMART Stats Tell Us About Hard Drives" (2016, 67,814 drives):
  the five attributes Backblaze watches are SMART 5 (reallocated sectors), 187
  (reported uncorrectable errors), 188 (command timeout), 197 (current pending
  sectors) and 198 (offline uncorrectable); 76.7 % of failed drives had one or more of
  them above zero, 23.3 % failed with all five at zero, and 4.2 % of operational drives
  had one or more above zero.
  -> `WARNED_SHARE` = 0.767 of failures degrade visibly before they fail, the other
     failures are sudden (no SMART change at all); `BENIGN_SHARE` = 0.042 of the
     drives carry small, (almost) static non-zero raw values without ever failing
     for it.
Pinheiro, Weber, Barroso, "Failure Trends in a Large Disk Drive Population" (FAST '07,
Google): after its first scan error a drive is 39 times more likely to fail within 60
days; more than half of the failed drives showed none of the strong SMART signals.
  -> degradation starts within `ONSET_MAX_DAYS` = 60 days of the failure for warned
     drives: the onset lead is lognormal, median `ONSET_MEDIAN_DAYS` = 20 days,
     clipped to [2, 60].
Hughes, Murray, Kreutz-Delgado, Elkan, "Improved disk-drive failure warnings" (IEEE
Trans. Reliability, 2002) and Murray, Hughes, Kreutz-Delgado (JMLR 2005): the
manufacturers' SMART thresholds detect only 3-10 % of failures (at a false-alarm rate
near 0.1 %).
  -> the normalised value of SMART 5 falls from 100 by one point per
     `SPARE_SECTORS_PER_POINT` reallocated sectors and trips its threshold
     (`SMART5_THRESHOLD` = 36) only after 512 reallocations; growth rates are
     drawn so that only a few per cent of warned drives get there before they fail
     (`tests/unit/test_sim_disks.py` pins the share within the published 3-10 %).

What a drive-day records (`RECORDS`): the drive's id, model and age; the raw values of
the five attributes; SMART 5's normalised value and the overall health verdict
(`smart_failed`: a threshold tripped, what `smartctl -H` says); temperature; mean read
latency; and `failed`, true on the drive's last day (a failed drive is replaced by a new
one the next day, so the population stays at `drives`).  A degrading drive grows pending
sectors at a rate that rises towards the failure (most become reallocated, some
uncorrectable); uncorrectable reads and command timeouts follow; read latency rises with
the retries.  Healthy drives show measurement noise in latency and temperature only.
No single column gives a failure away: benign drives have non-zero raw values too, and
latency varies more between drives than it rises in most degradations.
"""

from __future__ import annotations

import numpy as np

from mlfs.abi import (
    Backend,
    Objective,
    Sample,
    Schema,
    Subsystem,
    Target,
    check_settings,
    defaults_from,
    number,
    text,
    tick_seconds,
)

#: bump when any parameter below changes (each change needs its own published source)
SIM_VERSION = 1

#: annualised failure rate of each drive model (Backblaze's per-model spread)
MODEL_AFR = (0.008, 0.012, 0.018, 0.026)
#: share of failures preceded by non-zero raw values of SMART 5/187/188/197/198
WARNED_SHARE = 0.767
#: share of drives with benign non-zero raw values that do not fail for it
BENIGN_SHARE = 0.042
#: degradation onset before the failure, in days: lognormal median, spread, clip
ONSET_MEDIAN_DAYS = 20.0
ONSET_SIGMA = 0.8
ONSET_MIN_DAYS = 2
ONSET_MAX_DAYS = 60
#: pending sectors a degrading drive grows per day at onset (lognormal median, spread);
#: the rate rises `RATE_GROWTH` times by the failure day
PENDING_RATE_MEDIAN = 1.0
PENDING_RATE_SIGMA = 1.6
RATE_GROWTH = 8.0
#: share of pending sectors that end reallocated (SMART 5) vs offline uncorrectable (198)
REALLOCATED_SHARE = 0.85
#: SMART 5's normalised value falls one point per this many reallocated sectors
SPARE_SECTORS_PER_POINT = 8.0
#: SMART 5's threshold (a typical vendor value): health "FAILED" at or below it
SMART5_THRESHOLD = 36
#: benign drives: a static raw value in SMART 5 (or 197), and a tiny daily growth chance
BENIGN_GROWTH_PER_DAY = 0.002
#: read latency: per-drive baseline (lognormal median ms, spread), daily noise, and the
#: factor a degrading drive reaches at its failure day
LATENCY_MEDIAN_MS = 8.0
LATENCY_SIGMA = 0.35
LATENCY_NOISE = 0.10
LATENCY_RISE = 1.6
#: days of history simulated before the first published day (drives mid-degradation
#: at the start then look as they would in the field)
BURN_IN_DAYS = 90

#: the record fields, one record per drive-day
RECORDS: dict[str, str] = {
    "drive_id": "uint32",
    "model": "uint8",
    "age_days": "int32",
    "smart_5_raw": "int64",
    "smart_187_raw": "int64",
    "smart_188_raw": "int64",
    "smart_197_raw": "int64",
    "smart_198_raw": "int64",
    "smart_5_normalized": "int32",
    "smart_failed": "bool",
    "temperature_c": "float64",
    "read_latency_ms": "float64",
    "errors_delta_1d": "int64",
    "errors_delta_7d": "int64",
    "latency_ratio": "float64",
    "failed": "bool",
}
#: how fast a drive's own latency baseline follows it (EWMA weight of the newest day)
LATENCY_BASELINE_WEIGHT = 0.05


class DrivePopulation:
    """The drives and their state; `day()` advances one day for all of them at once.

    Two random streams: `_fate` draws what happens to drives (failure days, kinds,
    onsets, replacement drives), `_noise` draws the daily increments and measurement
    noise, so a drive's fate does not depend on how many noise numbers were used.
    """

    def __init__(self, drives: int = 2000, seed: int = 0) -> None:
        if drives < 1:
            raise ValueError("drives must be at least 1")
        self.drives = drives
        self._fate = np.random.default_rng([seed, 1])
        self._noise = np.random.default_rng([seed, 2])
        self.today = -BURN_IN_DAYS
        self._next_id = 0
        n = drives
        self.drive_id = np.zeros(n, np.uint32)
        self.model = np.zeros(n, np.uint8)
        self.born = np.zeros(n, np.int64)
        self.fail_day = np.zeros(n, np.int64)
        self.onset_day = np.zeros(n, np.int64)
        self.warned = np.zeros(n, bool)
        self.benign = np.zeros(n, bool)
        self.rate0 = np.zeros(n)
        self.pending = np.zeros(n, np.int64)
        self.reallocated = np.zeros(n, np.int64)
        self.uncorrectable = np.zeros(n, np.int64)
        self.reported = np.zeros(n, np.int64)
        self.timeouts = np.zeros(n, np.int64)
        self.latency_base = np.zeros(n)
        self.errors_history = np.zeros((8, n), np.int64)  # error totals of the last 8 days
        self.latency_ewma = np.full(n, np.nan)
        self._new_drives(np.arange(n), ages=self._fate.integers(0, 4 * 365, n))
        for _ in range(BURN_IN_DAYS):
            self._advance()

    # ---- fates -------------------------------------------------------------------
    def _new_drives(self, slots: np.ndarray, ages: np.ndarray | None = None) -> None:
        """Fresh drives in `slots`: model, failure day, kind of failure, baselines."""
        k = len(slots)
        if k == 0:
            return
        fate = self._fate
        self.drive_id[slots] = np.arange(self._next_id, self._next_id + k, dtype=np.uint32)
        self._next_id += k
        model = fate.integers(0, len(MODEL_AFR), k)
        self.model[slots] = model
        age = np.zeros(k, np.int64) if ages is None else ages
        self.born[slots] = self.today - age
        daily_hazard = -np.log1p(-np.asarray(MODEL_AFR)[model]) / 365.0
        self.fail_day[slots] = self.today + 1 + np.floor(
            fate.exponential(1.0 / daily_hazard)).astype(np.int64)
        warned = fate.random(k) < WARNED_SHARE
        self.warned[slots] = warned
        lead = np.clip(np.round(ONSET_MEDIAN_DAYS * np.exp(ONSET_SIGMA * fate.standard_normal(k))),
                       ONSET_MIN_DAYS, ONSET_MAX_DAYS).astype(np.int64)
        self.onset_day[slots] = self.fail_day[slots] - lead
        self.rate0[slots] = PENDING_RATE_MEDIAN * np.exp(PENDING_RATE_SIGMA
                                                         * fate.standard_normal(k))
        benign = fate.random(k) < BENIGN_SHARE
        self.benign[slots] = benign
        start = np.where(benign, fate.integers(1, 9, k), 0)
        in_197 = fate.random(k) < 0.3
        self.reallocated[slots] = np.where(in_197, 0, start)
        self.pending[slots] = np.where(in_197, start, 0)
        self.uncorrectable[slots] = 0
        self.reported[slots] = 0
        self.timeouts[slots] = 0
        self.latency_base[slots] = LATENCY_MEDIAN_MS * np.exp(LATENCY_SIGMA
                                                              * fate.standard_normal(k))
        self.errors_history[:, slots] = self._errors()[slots]
        self.latency_ewma[slots] = np.nan

    def _errors(self) -> np.ndarray:
        """Each drive's error total: the five attributes' raw values summed."""
        return (self.reallocated + self.reported + self.timeouts + self.pending
                + self.uncorrectable)

    def _advance(self) -> dict[str, np.ndarray]:
        """One day for every drive: increments, measurements, failures, replacements."""
        noise = self._noise
        n = self.drives
        t = self.today
        degrading = self.warned & (t >= self.onset_day)
        span = np.maximum(self.fail_day - self.onset_day, 1)
        progress = np.clip((t - self.onset_day) / span, 0.0, 1.0)
        rate = np.where(degrading, self.rate0 * (1.0 + (RATE_GROWTH - 1.0) * progress ** 2), 0.0)
        rate = rate + np.where(self.benign, BENIGN_GROWTH_PER_DAY, 0.0)
        new_pending = noise.poisson(rate)
        # yesterday's pending sectors resolve today: most reallocated, some uncorrectable
        resolved = noise.binomial(self.pending, 0.5)
        to_realloc = noise.binomial(resolved, REALLOCATED_SHARE)
        self.reallocated += to_realloc
        self.uncorrectable += resolved - to_realloc
        self.pending += new_pending - resolved
        self.reported += noise.poisson(0.3 * rate * degrading)
        self.timeouts += noise.poisson(0.05 * rate * degrading)
        normalized = np.maximum(
            1, 100 - np.floor(self.reallocated / SPARE_SECTORS_PER_POINT)).astype(np.int32)
        latency = self.latency_base * np.where(degrading, 1.0 + (LATENCY_RISE - 1.0) * progress,
                                               1.0)
        latency = latency * np.exp(LATENCY_NOISE * noise.standard_normal(n))
        temperature = 30.0 + 2.0 * self.model + 1.5 * noise.standard_normal(n)
        failed = self.fail_day == t
        # what a kernel-side source would publish beside the raw values: the changes a
        # predictor needs, so a policy reads them as plain columns
        errors = self._errors()
        self.errors_history = np.roll(self.errors_history, 1, axis=0)
        self.errors_history[0] = errors
        baseline = self.latency_ewma
        ratio = np.where(np.isnan(baseline), 1.0, latency / np.where(np.isnan(baseline), 1.0,
                                                                     baseline))
        w = LATENCY_BASELINE_WEIGHT
        self.latency_ewma = np.where(np.isnan(baseline), latency, (1 - w) * baseline + w * latency)
        row = {
            "drive_id": self.drive_id.copy(),
            "model": self.model.copy(),
            "age_days": (t - self.born).astype(np.int32),
            "smart_5_raw": self.reallocated.copy(),
            "smart_187_raw": self.reported.copy(),
            "smart_188_raw": self.timeouts.copy(),
            "smart_197_raw": self.pending.copy(),
            "smart_198_raw": self.uncorrectable.copy(),
            "smart_5_normalized": normalized,
            "smart_failed": normalized <= SMART5_THRESHOLD,
            "temperature_c": temperature,
            "read_latency_ms": latency,
            "errors_delta_1d": errors - self.errors_history[1],
            "errors_delta_7d": errors - self.errors_history[7],
            "latency_ratio": ratio,
            "failed": failed,
        }
        self.today += 1
        self._new_drives(np.flatnonzero(failed))
        return row

    def day(self) -> dict[str, np.ndarray]:
        """The next published day: one array per field of `RECORDS`, one entry per drive."""
        return self._advance()

    def days(self, count: int) -> dict[str, np.ndarray]:
        """`count` days as one set of columns, plus `day` (0 = the first published day)."""
        first = self.today
        parts = [self._advance() for _ in range(count)]
        columns = {name: np.concatenate([p[name] for p in parts]) for name in RECORDS}
        columns["day"] = np.repeat(np.arange(first, first + count, dtype=np.int64), self.drives)
        return columns


def backblaze_rule(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Backblaze's rule of thumb: any raw value of SMART 5, 187, 188, 197 or 198 above 0."""
    return ((columns["smart_5_raw"] > 0) | (columns["smart_187_raw"] > 0)
            | (columns["smart_188_raw"] > 0) | (columns["smart_197_raw"] > 0)
            | (columns["smart_198_raw"] > 0))


def smart_threshold_rule(columns: dict[str, np.ndarray]) -> np.ndarray:
    """SMART's own verdict: a normalised value at or below its threshold."""
    return columns["smart_failed"].astype(bool)


class SimDisks(Subsystem):
    """The population as a subsystem: one tick is one day, its records the drive-days."""

    backend = "sim.disks"
    #: a drive fails within 30 days; the default rule is SMART's own threshold trip
    targets = {"failure": Target(
        "failure", key="drive_id", event="failed", rule="smart_failed", horizon_ticks=30,
        miss_cost=100.0, false_alarm_cost=1.0,
        description="the drive fails within horizon_ticks days; rule: SMART's threshold "
                    "trip (smartctl -H FAILED)")}
    description = "simulated drive population (SMART, failures), one record per drive-day"
    records = RECORDS

    def __init__(self, name: str = "sim.disks", seed: int = 0, drives: int = 2000,
                 tick_seconds: float = 1.0) -> None:
        self.name = name
        self.tick_seconds = tick_seconds
        self.seed = seed
        self.objective = Objective("failures", "drives", "min")
        self.knobs = {}
        self.features = {"drives": "int64", "failures": "int64", "smart_failed": "int64",
                         "backblaze_flagged": "int64"}
        self.population = DrivePopulation(drives=drives, seed=seed)

    def step(self, knobs: dict) -> Sample:
        """Publish one simulated day of every drive."""
        columns = self.population.day()
        failures = int(columns["failed"].sum())
        features = {"drives": self.population.drives, "failures": failures,
                    "smart_failed": int(columns["smart_failed"].sum()),
                    "backblaze_flagged": int(backblaze_rule(columns).sum())}
        return Sample(features=features, objective=float(failures),
                      records=_structured(columns))


def _structured(columns: dict[str, np.ndarray]) -> np.ndarray:
    """The day's columns as one numpy structured array (the record contract's form)."""
    n = len(columns["drive_id"])
    out = np.empty(n, dtype=[(name, _NUMPY[kind]) for name, kind in RECORDS.items()])
    for name in RECORDS:
        out[name] = columns[name]
    return out


_NUMPY = {"uint32": np.uint32, "uint8": np.uint8, "int32": np.int32, "int64": np.int64,
          "bool": np.bool_, "float64": np.float64}

#: `[[subsystem]] backend = "sim.disks"`: every setting and its range
SETTINGS: Schema = {
    "name": text(64),
    "seed": number(0, 2**63 - 1, integer=True),
    "drives": number(1, 1_000_000, integer=True),
    "tick_seconds": tick_seconds(),
}

DESCRIPTION = ("simulated population of hard drives whose SMART attributes evolve and that "
               "sometimes fail (Backblaze's published statistics), one record per drive-day")
defaults_from(SETTINGS, SimDisks.__init__)


def check(settings: dict) -> tuple[dict, list[str]]:
    """The checked constructor arguments and the one subsystem name; SettingError."""
    kwargs = check_settings(settings, SETTINGS)
    kwargs.pop("state_dir", None)
    return kwargs, [kwargs.get("name", "sim.disks")]


def factory(settings: dict) -> list[SimDisks]:
    """`[[subsystem]] backend = "sim.disks"`: one subsystem."""
    kwargs, _ = check(settings)
    return [SimDisks(**kwargs)]


__all__ = ["BACKEND", "DrivePopulation", "SimDisks", "RECORDS", "SIM_VERSION", "backblaze_rule",
           "smart_threshold_rule"]


BACKEND = Backend(name="sim.disks", description=DESCRIPTION, settings=SETTINGS,
                  check=check, factory=factory, kinds=("predictor",),
                  example=lambda env: {"drives": 64, "tick_seconds": 0.01})
