"""How a knob model sees a subsystem: its columns, its knob grid, its encoded values.

The proxy applies a policy's argmax over the same candidate grid, with the same
tie-break, on the same column names, so everything that fixes the model's view of
the subsystem -- which features and knobs, in which order, how a knob value becomes
a number and back, which settings are candidates -- is decided once, here, from
`MOUNT/<subsystem>/info`, and read by every other part of the learner (the rows,
the fit, the exploration).  It holds no rows and no booster.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mlfs.abi import (
    Knob,
    KnobValue,
    candidate_values,
    column_name,
    distance_from_default,
    knob_column,
)

#: beyond this many knob combinations the grid is searched one knob at a time
MAX_CANDIDATES = 4096


def missing_features(info: Mapping[str, Any], features: Sequence[str]) -> list[str]:
    """The names in `features` that the subsystem described by `info` does not publish."""
    available = info.get("features") or {}
    return sorted({f for f in features if f not in available})


def as_float_column(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as float64 with nulls as NaN (LightGBM's missing value)."""
    column = table.column(name)
    if pa.types.is_null(column.type):
        return np.full(table.num_rows, np.nan)
    return np.asarray(
        column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64
    )


def table_ticks(table: pa.Table) -> np.ndarray:
    """The `tick` column as int64, a null tick as -1 (a row no alignment can use)."""
    if "tick" not in table.column_names:
        raise ValueError("table has no 'tick' column")
    return np.asarray(table.column("tick").cast(pa.int64()).fill_null(-1).to_numpy(),
                      dtype=np.int64)


def grid_distance(codes: np.ndarray, centre: np.ndarray,
                  grids: Sequence[np.ndarray]) -> np.ndarray:
    """Steps on the candidate grid from `centre` to each row of `codes` (the largest
    over the knobs).  Ranked on each knob's whole grid (`grids`, encoded, ascending),
    not on the values `codes` happens to hold: exploration passes the candidates
    without the default, and ranked among those 64 and 256 KiB were one step apart
    across the missing 128 (the trust region of 64 took in 256 and its coverage
    tried it as often as 32)."""
    steps = np.zeros(len(codes), dtype=np.int64)
    for j, grid in enumerate(grids):
        ranks = np.searchsorted(grid, codes[:, j])
        steps = np.maximum(steps, np.abs(ranks - int(np.searchsorted(grid, centre[j]))))
    return steps


def _chosen_knobs(all_knobs: Mapping[str, Any], knobs: Sequence[str] | None) -> list[str]:
    """The controlled knobs in info order, so the candidate product matches the proxy's."""
    names = list(all_knobs) if knobs is None else list(knobs)
    unknown = [k for k in names if k not in all_knobs]
    if unknown or not names:
        raise ValueError(f"unknown or no knobs: {unknown or names}")
    return [k for k in all_knobs if k in names]


def _chosen_features(info: Mapping[str, Any], features: Sequence[str] | None) -> list[str]:
    """The features the model may use, in info order, as for the knobs."""
    if features is not None:
        missing = missing_features(info, features)
        if missing or not features:
            raise ValueError(f"not features of this subsystem: {missing or 'none given'}")
    return [f for f in info["features"] if features is None or f in features]


class KnobSpace:
    """The columns, knob grid and encoding of one knob model, from the subsystem's info.

    A model row is the features (`feature_columns`, raw values) then the controlled
    knobs (`knob_columns`): an int knob as its value, a choice as its index.
    """

    def __init__(self, info: Mapping[str, Any], knobs: Sequence[str] | None = None,
                 features: Sequence[str] | None = None) -> None:
        all_knobs: dict[str, dict] = dict(info["knobs"])
        self.knobs: list[str] = _chosen_knobs(all_knobs, knobs)
        self.knob_specs = {k: dict(all_knobs[k]) for k in self.knobs}
        # the same Knob the proxy holds, so grid and tie-break are the proxy's own
        self.knob_defs = {k: Knob.from_info(k, spec) for k, spec in self.knob_specs.items()}
        self.features: list[str] = _chosen_features(info, features)
        self.feature_columns = [column_name(f) for f in self.features]
        self.knob_columns = [knob_column(k) for k in self.knobs]
        self.columns = self.feature_columns + self.knob_columns
        objective = info.get("objective") or {}
        self.goal: str = objective.get("goal", "max")
        if self.goal not in ("max", "min"):
            raise ValueError(f"objective goal {self.goal!r} is neither max nor min")
        #: carry-over per controlled knob (`Knob.settle_ticks`)
        self.settle: dict[str, int] = {k: self.knob_defs[k].settle_ticks for k in self.knobs}
        self.grids: list[list[KnobValue]] = [candidate_values(self.knob_defs[k])
                                             for k in self.knobs]
        self.encoded_grids = [np.unique([self.encode(k, v) for v in grid])
                              for k, grid in zip(self.knobs, self.grids, strict=True)]
        self.default_setting = tuple(self.encode(k, self.knob_specs[k].get("default"))
                                     for k in self.knobs)
        self.full_grid = math.prod(len(g) for g in self.grids) <= MAX_CANDIDATES
        if self.full_grid:
            # itertools.product order = the proxy's candidate order (ties: nearest the default)
            self.combo_codes = np.array(
                [[self.encode(k, v) for k, v in zip(self.knobs, c, strict=True)]
                 for c in itertools.product(*self.grids)], dtype=np.float64)
        else:
            self.combo_codes = np.empty((0, len(self.knobs)))
        self.combo_is_default = (self.combo_codes == np.array(self.default_setting)).all(axis=1)

    @property
    def width(self) -> int:
        """Columns of a model row: the features, then the knobs."""
        return len(self.columns)

    @property
    def n_features(self) -> int:
        """Where the knobs start in a model row."""
        return len(self.features)

    # ---- one value --------------------------------------------------------
    def encode(self, knob: str, value: Any) -> float:
        """A knob value as the model sees it: ints raw, choices as their index."""
        spec = self.knob_specs[knob]
        if value is None:
            return math.nan
        if spec["type"] == "choice":
            try:
                return float(list(spec["choices"]).index(str(value)))
            except ValueError:
                return math.nan
        try:
            return float(value)
        except (TypeError, ValueError):
            return math.nan

    def decode(self, knob: str, code: float) -> KnobValue:
        """An encoded knob value back as the value the proxy sets."""
        spec = self.knob_specs[knob]
        if spec["type"] == "choice":
            return list(spec["choices"])[int(code)]
        return int(code)

    def decode_setting(self, codes: Sequence[float]) -> dict[str, KnobValue]:
        """A row of knob codes as {knob: value}."""
        return {k: self.decode(k, c) for k, c in zip(self.knobs, codes, strict=True)}

    def encode_setting(self, setting: Mapping[str, Any]) -> np.ndarray:
        """{knob: value} as a row of knob codes (a knob not there: NaN)."""
        return np.array([self.encode(k, setting.get(k)) for k in self.knobs])

    # ---- tables -----------------------------------------------------------
    def knob_matrix(self, table: pa.Table) -> np.ndarray:
        """The controlled knobs' columns of `table`, encoded; ValueError if one is absent."""
        out = np.empty((table.num_rows, len(self.knobs)))
        for j, (knob, column) in enumerate(zip(self.knobs, self.knob_columns, strict=True)):
            if column not in table.column_names:
                raise ValueError(f"table has no column {column!r}")
            if self.knob_specs[knob]["type"] == "choice":
                index = {c: float(i) for i, c in enumerate(self.knob_specs[knob]["choices"])}
                values = table.column(column).to_pylist()
                out[:, j] = [index.get(str(v), math.nan) if v is not None else math.nan
                             for v in values]
            else:
                out[:, j] = as_float_column(table, column)
        return out

    def feature_matrix(self, table: pa.Table) -> np.ndarray:
        """The model's feature columns of `table`; ValueError if one is absent."""
        out = np.empty((table.num_rows, len(self.features)))
        for j, column in enumerate(self.feature_columns):
            if column not in table.column_names:
                raise ValueError(f"table has no feature column {column!r}")
            out[:, j] = as_float_column(table, column)
        return out

    def feature_vector(self, latest: Mapping[str, Any]) -> np.ndarray:
        """Features keyed by column name (as the proxy has them) or by info name;
        missing or unreadable ones NaN."""
        vec = np.full(len(self.features), np.nan)
        for j, (name, column) in enumerate(zip(self.features, self.feature_columns,
                                               strict=True)):
            value = latest.get(column, latest.get(name))
            if value is not None:
                try:
                    vec[j] = float(value)
                except (TypeError, ValueError):
                    pass
        return vec

    def rows(self, features: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Model rows of one state under each knob setting in `codes`."""
        X = np.empty((len(codes), len(self.columns)))
        X[:, : len(self.features)] = features
        X[:, len(self.features):] = codes
        return X

    # ---- choosing ---------------------------------------------------------
    def best_index(self, scores: np.ndarray, codes: np.ndarray) -> int:
        """The best score; among exact ties the setting nearest the default.

        The proxy's rule (mlfs.abi.distance_from_default): trees predict
        the same for every value beyond their last split, and the grid's first
        value (read_ahead_kb 0) is not a safe guess for values never tried.
        """
        top = scores.max() if self.goal == "max" else scores.min()
        tied = np.flatnonzero(scores == top)
        return int(tied[np.argmin(self.distance(codes[tied]))])

    def distance(self, codes: np.ndarray) -> np.ndarray:
        """Each setting's distance from the default, summed over the knobs."""
        total = np.zeros(len(codes))
        for j, knob in enumerate(self.knobs):
            spec = self.knob_defs[knob]
            total += [distance_from_default(spec, self.decode(knob, c)) for c in codes[:, j]]
        return total
