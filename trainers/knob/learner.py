"""The FUSE-free learning core of the mlfs trainer.

A `KnobLearner` learns, for one subsystem, how the objective of a tick depends
on the state the tick started from (the feature columns) and on the knob
values applied during it.  It is a LightGBM regression on exactly the dataset's
column names, so the same booster serves three purposes:

* the trainer asks it for the best knob setting (`recommend`) or for an
  informative one to try (`explore`);
* the trainer uploads it, unchanged, as the proxy's *policy* (`policy_text`):
  the proxy predicts every candidate setting from the latest features and
  applies the argmax itself, so the model must take raw column values and
  nothing else (trees are invariant to monotone transforms of their inputs,
  so raw knob values cost nothing);
* the proxy's feedback (observed objective of each ML tick) continues the
  boosting (`correct`): new trees fit the residuals of the current ones.

Alignment.  The proxy decides the knobs of tick *t* from the features of the
latest finished tick, *t - 1*, and records those decision-time features in the
feedback.  A dataset row, however, holds the features sampled *during* tick
*t*, which may already reflect the knob (a cache hit ratio does).  Training
on those would teach the model a relationship it can never use at decision
time, so by default (`lag=1`) dataset rows are re-aligned: the features of
tick t - 1 are paired with the knobs and objective of tick t, and a row whose
predecessor is missing (first row, a gap after a crash) is dropped.

Nothing here touches a mount; the worker (`trainers.worker`) feeds it tables.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import lightgbm as lgb
import numpy as np
import pyarrow as pa

from mlfs.abi import (
    Knob,
    KnobValue,
    Settling,
    candidate_values,
    column_name,
    distance_from_default,
    knob_column,
)
from mlfs.base.sequential import MIN_EPISODES, boundary

__all__ = [
    "KnobLearner",
    "ROLLED_OUT_MODES",
    "candidate_values",
    "column_name",
    "knob_column",
    "MAX_CANDIDATES",
]

#: beyond this many knob combinations the grid is searched one knob at a time
MAX_CANDIDATES = 4096
#: consecutive holdout rows that make one sample of `challenge`'s test: a row's error
#: is not independent of its neighbours' (one workload phase runs for many ticks), a
#: block of them is nearer to it; 20 rows are one second of the demo's ticks
CHALLENGE_BLOCK = 20
#: the modes a policy reaches only on the mode machine's anytime-valid evidence that it
#: beats the default (docs/ABI.md, "Mode switching"): there an adopted prior is winning
ROLLED_OUT_MODES = frozenset({"collaboration", "recommendation"})
#: coverage's "states like this one": rows within this many standard deviations (root
#: mean square over the features) of the state (`KnobLearner._local_counts`)
STATE_RADIUS = 1.5


def _grid_distance(codes: np.ndarray, centre: np.ndarray,
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


def _as_float_column(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as float64 with nulls as NaN (LightGBM's missing value)."""
    column = table.column(name)
    if pa.types.is_null(column.type):
        return np.full(table.num_rows, np.nan)
    return np.asarray(
        column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64
    )


def missing_features(info: Mapping[str, Any], features: Sequence[str]) -> list[str]:
    """The names in `features` that the subsystem described by `info` does not publish."""
    available = info.get("features") or {}
    return sorted({f for f in features if f not in available})


class KnobLearner:
    """Learns objective = f(features at decision time, knob values) for one subsystem.

    `info` is the parsed `MOUNT/<subsystem>/info`; `knobs` the knobs this model
    controls (default: all).  Memory is bounded: the last `window` dataset rows
    and `feedback_window` feedback rows are kept, older ones are dropped.
    """

    def __init__(
        self,
        info: Mapping[str, Any],
        knobs: Sequence[str] | None = None,
        *,
        features: Sequence[str] | None = None,
        window: int = 20_000,
        feedback_window: int = 5_000,
        lag: int = 1,
        num_boost_round: int = 150,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        relative: bool = False,
    ) -> None:
        """`relative`: fit relative rather than absolute error, for a positive
        objective spanning orders of magnitude (a real device's MiB/s).

        `features`: the subsystem features the model may use (default: all).
        Leave out those the controlled knobs themselves move within a phase,
        above all a near-copy of the objective: rows taken under one setting
        then carry its effect in their features, and the trees explain the
        objective by them instead of by the knob (see docs/training.md).
        """
        if lag not in (0, 1):
            raise ValueError("lag must be 0 or 1")
        self.info = dict(info)
        all_knobs: dict[str, dict] = dict(info["knobs"])
        names = list(all_knobs) if knobs is None else list(knobs)
        unknown = [k for k in names if k not in all_knobs]
        if unknown or not names:
            raise ValueError(f"unknown or no knobs: {unknown or names}")
        # info order, so the candidate product matches the proxy's
        self.knobs: list[str] = [k for k in all_knobs if k in names]
        self.knob_specs = {k: dict(all_knobs[k]) for k in self.knobs}
        # the same Knob the proxy holds, so grid and tie-break are the proxy's own
        self.knob_defs = {k: Knob.from_info(k, spec) for k, spec in self.knob_specs.items()}
        if features is not None:
            missing = missing_features(info, features)
            if missing or not features:
                raise ValueError(f"not features of this subsystem: {missing or 'none given'}")
        # info order, as for the knobs
        self.features: list[str] = [f for f in info["features"]
                                    if features is None or f in features]
        self.feature_columns = [column_name(f) for f in self.features]
        self.knob_columns = [knob_column(k) for k in self.knobs]
        self.columns = self.feature_columns + self.knob_columns
        objective = info.get("objective") or {}
        self.goal: str = objective.get("goal", "max")
        if self.goal not in ("max", "min"):
            raise ValueError(f"objective goal {self.goal!r} is neither max nor min")
        self.window = int(window)
        self.feedback_window = int(feedback_window)
        self.lag = lag
        self.num_boost_round = int(num_boost_round)
        self.seed = seed
        self.relative = relative
        self.params: dict[str, Any] = {
            "objective": "regression",
            "learning_rate": 0.1,
            "num_leaves": 15,
            "min_data_in_leaf": 10,
            "min_sum_hessian_in_leaf": 1e-3,
            "lambda_l2": 1.0,
            "max_bin": 63,
            "verbose": -1,
            "num_threads": 1,  # the daemon shares this 2-core machine; OpenMP spin-waits
            "seed": seed,
            "deterministic": True,
            "force_row_wise": True,
        }
        if relative:
            # Gamma regression: a log link, so the trees fit relative error (a 4x
            # knob effect counts the same in a phase at 15 MiB/s as in one at
            # 1500, where on squared error it would drown in the fast phase's
            # noise), while predict() still returns the objective's own units
            # (exp of the raw score): the policy's `expected` stays meaningful.
            self.params["objective"] = "gamma"
        self.params.update(params or {})

        #: carry-over per controlled knob (`Knob.settle_ticks`): rows taken while a
        #: change settles are left out of the fit (`_settled`)
        self.settle: dict[str, int] = {k: self.knob_defs[k].settle_ticks for k in self.knobs}
        self.grids: list[list[KnobValue]] = [candidate_values(self.knob_defs[k])
                                             for k in self.knobs]
        self._encoded_grids = [np.unique([self._encode(k, v) for v in grid])
                               for k, grid in zip(self.knobs, self.grids, strict=True)]
        self.default_setting = tuple(self._encode(k, self.knob_specs[k].get("default"))
                                     for k in self.knobs)
        n_combos = math.prod(len(g) for g in self.grids)
        self._full_grid = n_combos <= MAX_CANDIDATES
        if self._full_grid:
            # itertools.product order = the proxy's candidate order (ties: nearest the default)
            self._combo_codes = np.array(
                [[self._encode(k, v) for k, v in zip(self.knobs, c, strict=True)]
                 for c in itertools.product(*self.grids)], dtype=np.float64)
        else:
            self._combo_codes = np.empty((0, len(self.knobs)))
        self._combo_is_default = (self._combo_codes == np.array(self.default_setting)).all(axis=1)

        width = len(self.columns)
        self._X = np.empty((0, width))
        self._y = np.empty(0)
        self._tick = np.empty(0, dtype=np.int64)
        self._fX = np.empty((0, width))
        self._fy = np.empty(0)
        self._ftick = np.empty(0, dtype=np.int64)
        #: `_training_set`'s result until rows are added: coverage asks for it on
        #: every exploration, and the settle filter is a loop over the window
        self._training_cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._last_tick: int | None = None
        self._last_features: np.ndarray | None = None
        self.latest_features: dict[str, float] = {}
        self.latest_tick: int | None = None
        self.max_tick: int | None = None
        self.rows_since_fit = 0
        self.booster: lgb.Booster | None = None
        #: the booster came from elsewhere (`adopt`): challenged, never refitted from scratch
        #: until learning alone predicts this host better (`challenge`)
        self.adopted = False
        #: the adopted booster as it came (the prior every `challenge` starts from)
        self._prior: lgb.Booster | None = None
        self.stats: dict[str, Any] = {}
        self._mean = np.zeros(len(self.feature_columns))
        self._scale = np.ones(len(self.feature_columns))

    # ---- encoding ---------------------------------------------------------
    def _encode(self, knob: str, value: Any) -> float:
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

    def _decode(self, knob: str, code: float) -> KnobValue:
        spec = self.knob_specs[knob]
        if spec["type"] == "choice":
            return list(spec["choices"])[int(code)]
        return int(code)

    def _knob_matrix(self, table: pa.Table) -> np.ndarray:
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
                out[:, j] = _as_float_column(table, column)
        return out

    def _feature_matrix(self, table: pa.Table) -> np.ndarray:
        out = np.empty((table.num_rows, len(self.features)))
        for j, column in enumerate(self.feature_columns):
            if column not in table.column_names:
                raise ValueError(f"table has no feature column {column!r}")
            out[:, j] = _as_float_column(table, column)
        return out

    def _feature_vector(self, latest: Mapping[str, Any] | None) -> np.ndarray:
        """Features keyed by column name (as the proxy has them) or by info name."""
        latest = self.latest_features if latest is None else latest
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

    @staticmethod
    def _ticks(table: pa.Table) -> np.ndarray:
        if "tick" not in table.column_names:
            raise ValueError("table has no 'tick' column")
        return np.asarray(table.column("tick").cast(pa.int64()).fill_null(-1).to_numpy(),
                          dtype=np.int64)

    # ---- data -------------------------------------------------------------
    def add_dataset(self, table: pa.Table) -> int:
        """Append dataset rows (one sealed portion); returns rows kept for training.

        Rows are re-aligned to decision time (see the module docstring); the
        last row is remembered so the next portion's first row still has its
        predecessor.  Rows without an objective or a decodable knob are dropped.
        """
        if table.num_rows == 0:
            return 0
        if "objective" not in table.column_names:
            raise ValueError("table has no 'objective' column")
        ticks = self._ticks(table)
        order = np.argsort(ticks, kind="stable")
        ticks = ticks[order]
        feats = self._feature_matrix(table)[order]
        knobs = self._knob_matrix(table)[order]
        y = _as_float_column(table, "objective")[order]

        last = ticks[-1]
        if self.latest_tick is None or last >= self.latest_tick:
            self.latest_tick = int(last)
            self.latest_features = {c: float(v) for c, v in
                                    zip(self.feature_columns, feats[-1], strict=True)}
        self.max_tick = int(last) if self.max_tick is None else max(self.max_tick, int(last))

        if self.lag:
            prev = np.empty_like(feats)
            prev[1:] = feats[:-1]
            ok = np.zeros(len(ticks), dtype=bool)
            ok[1:] = ticks[1:] - ticks[:-1] == 1
            if self._last_tick is not None and ticks[0] - self._last_tick == 1:
                prev[0] = self._last_features
                ok[0] = True
            if self._last_tick is None or last > self._last_tick:
                self._last_tick = int(last)
                self._last_features = feats[-1].copy()
            feats = prev
        else:
            ok = np.ones(len(ticks), dtype=bool)
        ok &= np.isfinite(y) & np.isfinite(knobs).all(axis=1) & (ticks >= 0)
        X = np.hstack([feats, knobs])[ok]
        self._X = np.vstack([self._X, X])[-self.window:]
        self._y = np.concatenate([self._y, y[ok]])[-self.window:]
        self._tick = np.concatenate([self._tick, ticks[ok]])[-self.window:]
        self._training_cache = None
        kept = int(ok.sum())
        self.rows_since_fit += kept
        return kept

    def _parse_feedback(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                        np.ndarray]:
        label = "observed" if "observed" in table.column_names else "objective"
        if label not in table.column_names:
            raise ValueError("feedback has no 'observed' column")
        X = np.hstack([self._feature_matrix(table), self._knob_matrix(table)])
        y = _as_float_column(table, label)
        ticks = self._ticks(table)
        err = (_as_float_column(table, "error") if "error" in table.column_names
               else np.full(len(y), np.nan))
        ok = np.isfinite(y) & np.isfinite(X[:, len(self.features):]).all(axis=1)
        return X[ok], y[ok], ticks[ok], err[ok]

    def _store_feedback(self, X: np.ndarray, y: np.ndarray, ticks: np.ndarray) -> None:
        self._fX = np.vstack([self._fX, X])[-self.feedback_window:]
        self._fy = np.concatenate([self._fy, y])[-self.feedback_window:]
        self._ftick = np.concatenate([self._ftick, ticks])[-self.feedback_window:]
        self._training_cache = None

    def add_feedback(self, table: pa.Table) -> int:
        """Append feedback rows (features at decision time, knobs applied, observed)."""
        if table.num_rows == 0:
            return 0
        X, y, ticks, _ = self._parse_feedback(table)
        self._store_feedback(X, y, ticks)
        self._note_feedback_features(X, ticks)
        return len(y)

    def note_features(self, tick: int, features: Mapping[str, Any]) -> bool:
        """The subsystem's `features` file: the last tick's features, the state the
        proxy decides a policy's tick on.  Newer than the rows' (`latest_tick`), it is
        the state exploration and recommendations decide on from now; returns whether
        it was.  Rows come sealed, up to a seal interval late: a trainer that chose on
        them explored the last phase's neighbourhood for the first ticks of a new one
        (1,024 and 2,048 KiB at x0.26 in a strided phase, learning bench seed 49).  A
        null value is missing (NaN, as in the rows); a feature not there: not used."""
        if self.latest_tick is not None and tick <= self.latest_tick:
            return False
        try:
            values = {c: math.nan if features[c] is None else float(features[c])
                      for c in self.feature_columns}
        except (KeyError, TypeError, ValueError, OverflowError):
            return False
        self.latest_tick = int(tick)
        self.latest_features = values
        return True

    def _note_feedback_features(self, X: np.ndarray, ticks: np.ndarray) -> None:
        """Feedback arrives sooner than sealed dataset portions; its decision-time
        features of tick t are the sample of tick t - 1, the freshest state known."""
        if not len(ticks):
            return
        i = int(np.argmax(ticks))
        top = int(ticks[i])
        self.max_tick = top if self.max_tick is None else max(self.max_tick, top)
        if self.latest_tick is None or top - 1 > self.latest_tick:
            self.latest_tick = top - 1
            self.latest_features = {c: float(v) for c, v in zip(
                self.feature_columns, X[i, : len(self.features)], strict=True)}

    @property
    def rows(self) -> int:
        """Dataset rows in the training window."""
        return len(self._y)

    @property
    def fitted(self) -> bool:
        return self.booster is not None

    @property
    def explored_rows(self) -> int:
        """Training rows whose knob setting differs from the default one."""
        if not len(self._X):
            return 0
        knobs = self._X[:, len(self.features):]
        return int((knobs != np.array(self.default_setting)).any(axis=1).sum())

    def _settled(self, X: np.ndarray, ticks: np.ndarray) -> np.ndarray:
        """Which rows (sorted by tick) were measured under a settled setting.

        For a knob with carry-over (`settle_ticks` k > 0) a row counts only if
        the same value held on the k ticks before it (mlfs.abi.Settling, the
        rule the proxy's efficiency uses): the first ticks after a change
        still show what the previous value left behind (dirty pages it let
        in), and a fit that credits them to the new value learns the wrong
        sign.  A gap in the ticks starts the count again.
        """
        if not any(self.settle.values()):
            return np.ones(len(ticks), dtype=bool)
        settled = np.zeros(len(ticks), dtype=bool)
        settling = Settling(self.settle)
        previous: int | None = None
        for i, (codes, tick) in enumerate(zip(X[:, len(self.features):], ticks, strict=True)):
            if previous is not None and tick != previous + 1:
                settling = Settling(self.settle)
            settled[i] = not settling(dict(zip(self.knobs, codes.tolist(), strict=True)))
            previous = int(tick)
        return settled

    def _training_set(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dataset rows plus feedback rows of ticks the dataset window lacks, by
        tick, without those taken while a carry-over knob settled (`_settled`).
        Computed once per change of the rows; the arrays are read-only."""
        if self._training_cache is not None:
            return self._training_cache
        extra = ~np.isin(self._ftick, self._tick)
        X = np.vstack([self._X, self._fX[extra]])
        y = np.concatenate([self._y, self._fy[extra]])
        t = np.concatenate([self._tick, self._ftick[extra]])
        order = np.argsort(t, kind="stable")
        X, y, t = X[order], y[order], t[order]
        keep = self._settled(X, t)
        out = (X[keep], y[keep], t[keep])
        for array in out:
            array.setflags(write=False)
        self._training_cache = out
        return out

    def training_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(X, label, weight) exactly as `fit` trains on them: decision-time rows,
        the label LightGBM sees, the per-setting weights.  The fleet trainer
        (mlfs/fleet/train.py) builds its distributed training set with this, so a
        fleet policy has the local policy's features, target and format."""
        X, y, _ = self._training_set()
        if not len(y):
            return X, y, np.empty(0)
        return X, self._label(y), self._weights(X)

    def _weights(self, X: np.ndarray) -> np.ndarray:
        """Square-root inverse frequency of each knob setting.

        The default algorithm dominates the dataset (90% of ticks in learning
        mode); without this the trees spend their splits on the default setting
        and hardly resolve the explored ones, which are what the argmax compares.
        """
        knobs = X[:, len(self.features):]
        _, inverse, counts = np.unique(knobs, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        w = np.sqrt(len(X) / (len(counts) * counts[inverse]))
        return np.clip(w, 0.1, 10.0)

    def _label(self, y: np.ndarray) -> np.ndarray:
        """The label LightGBM sees: with `relative`, floored to a positive value
        (gamma regression needs y > 0; an idle tick's 0 MiB/s becomes 0.1% of the median)."""
        if not self.relative or not len(y):
            return y
        positive = y[y > 0]
        floor = 1e-3 * float(np.median(positive)) if len(positive) else 1e-6
        return np.maximum(y, max(floor, 1e-12))

    def _train(self, X: np.ndarray, y: np.ndarray, w: np.ndarray, rounds: int) -> lgb.Booster:
        data = lgb.Dataset(X, label=self._label(y), weight=w, feature_name=self.columns,
                           free_raw_data=True, params={"verbose": -1})
        return lgb.train(self.params, data, num_boost_round=rounds)

    # ---- fitting ----------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train a fresh booster on the window; validate on the newest 20% first.

        The holdout is time-ordered (the last ticks), because the question that
        matters is how well the past predicts the near future of a drifting
        workload; a random split would flatter the model.  The returned model
        is then refitted on all rows, so the newest ticks are not wasted.
        """
        started = time.perf_counter()
        X, y, _ = self._training_set()
        n = len(y)
        if n < 20:
            return {"fitted": False, "rows": n, "reason": "too few rows"}
        w = self._weights(X)
        stats: dict[str, Any] = {"fitted": True, "rows": n}
        n_val = n // 5 if n >= 100 else 0
        if n_val:
            cut = n - n_val
            model = self._train(X[:cut], y[:cut], w[:cut], self.num_boost_round)
            pred = model.predict(X[cut:], num_threads=self.params["num_threads"])
            err = y[cut:] - pred
            stats["val_rows"] = n_val
            stats["val_mae"] = float(np.mean(np.abs(err)))
            stats["val_rmse"] = float(np.sqrt(np.mean(err**2)))
            stats["val_mae_naive"] = float(np.mean(np.abs(y[cut:] - np.mean(y[:cut]))))
        self.booster = self._train(X, y, w, self.num_boost_round)
        feats = X[:, : len(self.features)]
        self._mean = np.nanmean(feats, axis=0) if n else self._mean
        scale = np.nanstd(feats, axis=0)
        self._scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
        self._mean = np.where(np.isfinite(self._mean), self._mean, 0.0)
        gain = self.booster.feature_importance("split")
        stats["knob_splits"] = int(gain[len(self.features):].sum())
        stats["trees"] = self.booster.num_trees()
        stats["explored_rows"] = self.explored_rows
        stats["seconds"] = round(time.perf_counter() - started, 4)
        self.rows_since_fit = 0
        self.stats = stats
        return stats

    def challenge(self, rolled_out: bool = False) -> dict[str, Any]:
        """An adopted (fleet) policy against learning alone, on this host's own rows.

        A prior is worth what it predicts here.  Four candidates are trained on this
        host's older 80 % of rows and predict the newest 20 % (time-ordered, as `fit`
        validates): the prior as it came; the prior tuned in level (`_tune`: this
        host's level in each state, the fleet's ranking of the settings); the prior
        tuned freely (the same trees, free to split on a knob too); and a booster of
        this host's rows alone.  The prior is dropped -- `fit` on all rows, and the
        learner is no longer adopted, for good -- only when learning alone predicts the
        newest rows better than each of the three that start from the prior, by a
        margin the data supports however often the host looks (`drop_verdict`): so a
        wrong prior cannot hold a host (issue 34 item 3), and a right one is not thrown
        away on a lucky holdout, nor on errors a correction of the prior would remove.
        Until then the policy is the prior as it came or tuned in level, whichever
        predicts better (`chosen`; the two choose alike): the free tuning only judges.
        Its trees re-rank the settings the prior chose against settings never measured
        here, and its choices were worse than the prior's (`_level_only`).  Each
        challenge starts again from the prior as it came.  Nothing happens below 100
        rows.

        `rolled_out`: the proxy runs the prior in collaboration or recommendation, so
        the mode machine holds anytime-valid evidence that its choices beat the
        default here.  Then a better prediction of the host's rows does not drop it
        (and the judges, the free tuning and learning alone, are not trained):
        predicting the rows is not choosing well (dropped priors that were winning
        ended up to 0.019 of the oracle below the prior as it came;
        docs/results/learning-34.md, "A prior that wins is not dropped").  A prior
        demoted to learning, or never promoted, is judged on its predictions again."""
        if not self.adopted or self._prior is None:
            return {"dropped": False, "reason": "not adopted"}
        X, y, _ = self._training_set()
        n = len(y)
        if n < 100:
            return {"dropped": False, "reason": "too few rows", "rows": n}
        cut = n - n // 5
        w = self._weights(X)
        threads = self.params["num_threads"]
        candidates = {"prior": self._prior, "tuned": self._tune(X[:cut], y[:cut], w[:cut])}
        if not rolled_out:  # the judges: only a prior that is not winning can be dropped
            candidates["free"] = self._tune(X[:cut], y[:cut], w[:cut], level_only=False)
            candidates["local"] = self._train(X[:cut], y[:cut], w[:cut],
                                              self.num_boost_round)
        errors = {name: np.abs(y[cut:] - booster.predict(X[cut:], num_threads=threads))
                  for name, booster in candidates.items()}
        rmse = {name: float(np.sqrt(np.mean(value ** 2))) for name, value in errors.items()}
        kept = min(("prior", "tuned"), key=lambda name: (rmse[name], name != "prior"))
        out: dict[str, Any] = {"rows": n, "chosen": kept, "dropped": False,
                               **{f"{name}_rmse": value for name, value in rmse.items()},
                               "defended_by": "rollout"}
        if not rolled_out:
            verdicts = {name: drop_verdict(errors["local"], errors[name])
                        for name in ("prior", "tuned", "free")}
            # the prior stands while any way of keeping it holds against learning alone
            defended = max(verdicts, key=lambda name: (not verdicts[name]["drop"],
                                                       verdicts[name]["z"] or math.inf))
            verdict = verdicts[defended]
            out.update(defended_by=defended, z=verdict["z"], boundary=verdict["boundary"],
                       blocks=verdict["blocks"])
            if verdict["drop"]:
                out.update(chosen="local", dropped=True)
        best = out["chosen"]
        if best == "local":
            self.adopted = False
            out["fit"] = self.fit()
        elif best == "tuned":
            self.booster = self._tune(X, y, w)
        else:
            self.booster = self._prior
        return out

    def _tune(self, X: np.ndarray, y: np.ndarray, w: np.ndarray, *,
              level_only: bool = True) -> lgb.Booster:
        """The prior with `num_boost_round // 2` more trees fitted to its residuals here,
        split on the state only (`_level_only`) unless `level_only` is False."""
        data = lgb.Dataset(X, label=self._label(y), weight=w, feature_name=self.columns,
                           free_raw_data=True, params={"verbose": -1})
        params = self._level_only(self.params) if level_only else self.params
        return lgb.train(params, data,
                         num_boost_round=max(1, self.num_boost_round // 2),
                         init_model=self._prior)

    def _level_only(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` for trees added to an adopted prior: they may split on the features,
        never on a knob, so they move a state's predictions of every setting alike --
        this host's level -- and the argmax stays the fleet's.  A host's rows are
        mostly the prior's own choices: trees free to split on a knob lowered or raised
        the settings it chose and re-ranked them against settings never measured here
        (fleet cold start: the corrected prior worse than the prior as it came by up to
        0.008 of the oracle; docs/results/learning-34.md, "The fleet prior's
        ranking")."""
        return {**params, "feature_contri": [1.0] * len(self.features)
                + [0.0] * len(self.knobs)}

    @property
    def knob_aware(self) -> bool:
        """Whether the booster splits on a knob at all (else every candidate ties)."""
        if self.booster is None:
            return False
        splits = self.booster.feature_importance("split")[len(self.features):]
        return bool(splits.sum() > 0)

    def correct(self, feedback: pa.Table, *, rounds: int = 10,
                max_trees: int = 600) -> dict[str, Any]:
        """Error back-propagation: continue boosting on the proxy's feedback.

        The rows are stored, then `rounds` small trees are added to the current
        booster (`init_model`), trained on the recent feedback window with the
        observed objective as label — LightGBM starts from the booster's own
        predictions, so the new trees fit exactly the residuals.  The window,
        not only this batch, keeps a small batch from dragging the model around.
        Returns mean |error| on this batch: as the proxy recorded it
        (`recorded_mae`, against the expectation it acted on), and under the
        booster before and after the correction.

        An adopted prior is corrected in level only (`_level_only`): its ranking of
        the settings is the fleet's until `challenge` drops it.

        Small leaves fitted to a few hundred rows overfit easily, and an
        in-sample check would accept anything; so the correction is first
        trained on a random 75% of the window and kept only if it does not
        worsen the error on the other 25% (`holdout_before`/`holdout_after`).
        """
        X, y, ticks, err = self._parse_feedback(feedback) if feedback.num_rows else (
            np.empty((0, len(self.columns))), np.empty(0), np.empty(0, dtype=np.int64),
            np.empty(0))
        self._store_feedback(X, y, ticks)
        self._note_feedback_features(X, ticks)
        finite = err[np.isfinite(err)]
        stats: dict[str, Any] = {
            "rows": len(y), "corrected": False,
            "recorded_mae": float(np.mean(np.abs(finite))) if len(finite) else math.nan,
        }
        if self.booster is None or len(y) == 0:
            return stats
        started = time.perf_counter()
        threads = self.params["num_threads"]
        before = self.booster.predict(X, num_threads=threads)
        stats["mae_before"] = stats["mae_after"] = float(np.mean(np.abs(y - before)))
        if self.booster.num_trees() + rounds > max_trees:
            stats["reason"] = "tree budget spent; waiting for a refit"
            return stats
        wX, wy, wt = self._fX[-2000:], self._fy[-2000:], self._ftick[-2000:]
        order = np.argsort(wt, kind="stable")
        keep = self._settled(wX[order], wt[order])
        wX, wy = wX[order][keep], wy[order][keep]
        stats["window_rows"] = len(wy)
        if len(wy) < 20:
            stats["reason"] = "too few feedback rows"
            return stats
        params = self._level_only(self.params) if self.adopted else dict(self.params)
        params.update(num_leaves=7, learning_rate=0.1,
                      min_data_in_leaf=max(3, min(20, len(wy) // 20)))
        rng = np.random.default_rng(self.seed + len(self._fy))
        held = rng.random(len(wy)) < 0.25
        trial = self._continue(params, wX[~held], wy[~held], rounds)
        base = self.booster.predict(wX[held], num_threads=threads)
        stats["holdout_before"] = float(np.mean(np.abs(wy[held] - base)))
        stats["holdout_after"] = float(np.mean(np.abs(
            wy[held] - trial.predict(wX[held], num_threads=threads))))
        if stats["holdout_after"] <= stats["holdout_before"]:
            self.booster = self._continue(params, wX, wy, rounds)
            stats["corrected"] = True
            after = self.booster.predict(X, num_threads=threads)
            stats["mae_after"] = float(np.mean(np.abs(y - after)))
        else:
            stats["reason"] = "correction did not generalise to held-out feedback"
        stats["trees"] = self.booster.num_trees()
        stats["seconds"] = round(time.perf_counter() - started, 4)
        return stats

    def _continue(self, params: dict, X: np.ndarray, y: np.ndarray, rounds: int
                  ) -> lgb.Booster:
        """`rounds` more trees on top of the current booster, fitted to its residuals."""
        data = lgb.Dataset(X, label=self._label(y), feature_name=self.columns,
                           free_raw_data=True, params={"verbose": -1})
        return lgb.train(params, data, num_boost_round=rounds, init_model=self.booster)

    # ---- decisions --------------------------------------------------------
    def _rows(self, features: np.ndarray, codes: np.ndarray) -> np.ndarray:
        X = np.empty((len(codes), len(self.columns)))
        X[:, : len(self.features)] = features
        X[:, len(self.features):] = codes
        return X

    def _predict_codes(self, features: np.ndarray, codes: np.ndarray) -> np.ndarray:
        assert self.booster is not None
        return self.booster.predict(self._rows(features, codes),
                                    num_threads=self.params["num_threads"])

    def _best_index(self, scores: np.ndarray, codes: np.ndarray) -> int:
        """The best score; among exact ties the setting nearest the default.

        The proxy's rule (mlfs.abi.distance_from_default): trees predict
        the same for every value beyond their last split, and the grid's first
        value (read_ahead_kb 0) is not a safe guess for values never tried.
        """
        top = scores.max() if self.goal == "max" else scores.min()
        tied = np.flatnonzero(scores == top)
        return int(tied[np.argmin(self._distance(codes[tied]))])

    def _distance(self, codes: np.ndarray) -> np.ndarray:
        total = np.zeros(len(codes))
        for j, knob in enumerate(self.knobs):
            spec = self.knob_defs[knob]
            total += [distance_from_default(spec, self._decode(knob, c)) for c in codes[:, j]]
        return total

    def _decode_setting(self, codes: Sequence[float]) -> dict[str, KnobValue]:
        return {k: self._decode(k, c) for k, c in zip(self.knobs, codes, strict=True)}

    def _coordinate_search(self, features: np.ndarray,
                           start: Sequence[float]) -> tuple[np.ndarray, float]:
        """Best setting one knob at a time, for grids too large to enumerate."""
        current = np.array(start, dtype=np.float64)
        best = math.nan
        for _ in range(3):
            changed = False
            for j, knob in enumerate(self.knobs):
                values = np.array([self._encode(knob, v) for v in self.grids[j]])
                codes = np.repeat(current[None, :], len(values), axis=0)
                codes[:, j] = values
                pred = self._predict_codes(features, codes)
                i = self._best_index(pred, codes)
                best = float(pred[i])
                if codes[i, j] != current[j]:
                    current[j] = codes[i, j]
                    changed = True
            if not changed:
                break
        return current, best

    def predict(self, latest_features: Mapping[str, Any] | None,
                knobs: Mapping[str, Any]) -> float:
        """The predicted objective of one knob setting (the `expect=` to send)."""
        if self.booster is None:
            return math.nan
        codes = np.array([[self._encode(k, knobs.get(k)) for k in self.knobs]])
        return float(self._predict_codes(self._feature_vector(latest_features), codes)[0])

    def recommend(self, latest_features: Mapping[str, Any] | None = None
                  ) -> tuple[dict[str, KnobValue], float]:
        """The best knob setting for this state and its predicted objective.

        Evaluates the candidate grid and takes the argmax (argmin for goal
        "min"), exact ties going to the setting nearest the default, as the
        policy will.  `latest_features`
        defaults to the newest dataset row seen.
        """
        if self.booster is None:
            raise RuntimeError("recommend() before a successful fit()")
        features = self._feature_vector(latest_features)
        if self._full_grid:
            pred = self._predict_codes(features, self._combo_codes)
            i = self._best_index(pred, self._combo_codes)
            return self._decode_setting(self._combo_codes[i]), float(pred[i])
        codes, value = self._coordinate_search(features, self.default_setting)
        return self._decode_setting(codes), value

    def _local_counts(self, features: np.ndarray, codes: np.ndarray, k: int = 200
                      ) -> np.ndarray:
        """How often each candidate setting was measured in states like this one.

        Measured: on the rows the fit uses (`_training_set`).  A row taken while
        a carry-over knob settled is left out of the fit, so it must not count
        here either: an exploration cut short by a phase change before its
        setting settled has told the model nothing, and counted it would stop
        coverage from trying the setting there again (docs/results/dirty-ratios.md,
        "fifth try": the 1 % background ratio in the checkpoint phase, 7 rows, none
        settled).

        States like this one: the `k` nearest rows in standardized feature space,
        and of those only the ones within 1.5 standard deviations (root mean
        square over the features).  The `k` nearest alone reach into the next phase as long
        as this one has fewer than `k` rows: at tick 331 of bench-results/dirty-win-12
        run 2 the checkpoint phase had 127 settled rows, the 200 nearest took 73 of
        the scratch phase's, whose 5 rows at 1 % counted for checkpoint, and 1 % was
        never tried there.  Two phases that differ in a feature lie at least two of
        its standard deviations apart (the spread of two values mixed in any
        proportion is at most half their distance), so the radius keeps them apart
        when that feature is the only one; it is not smaller because a feature that
        is noise within a phase puts two of its rows sqrt(2) deviations apart.
        """
        X, _, _ = self._training_set()
        if not len(X):
            return np.zeros(len(codes))
        z = (X[:, : len(self.features)] - self._mean) / self._scale
        z0 = (features - self._mean) / self._scale
        d = np.nansum((np.nan_to_num(z, nan=0.0) - np.nan_to_num(z0, nan=0.0)) ** 2, axis=1)
        k = min(k, len(d))
        near = np.argpartition(d, k - 1)[:k]
        near = near[d[near] <= STATE_RADIUS**2 * len(self.features)]
        tried = X[near, len(self.features):]
        return (tried[:, None, :] == codes[None, :, :]).all(axis=2).sum(axis=0)

    def explore(self, latest_features: Mapping[str, Any] | None,
                rng: np.random.Generator, cover: int = 0) -> dict[str, KnobValue]:
        """A knob setting worth trying in learning mode; never the default one.

        Before the first fit: uniform over the candidate grid.  After: first
        coverage, then an upper-confidence pick.  Coverage: a candidate seen on
        fewer than `cover` rows in states like this one (the nearest rows in
        standardized feature space) is tried before any other, so that every
        setting is measured at least once per kind of state (a phase); without
        it a tree model extrapolates flat from the nearest value it saw and the
        UCB below may never reach a setting whose gain shows only in one
        phase (bench-results/dirty-win-4: the 1 % background ratio never tried in
        the checkpoint phase).  Its cost is bounded: `cover` rows per
        candidate per state.  The schedule passes half an exploration's ticks.

        The upper-confidence pick covers the knob space where it is still
        unknown without paying again and again for settings already known to
        be bad (which would hold the measured efficiency, and so the mode,
        down).  The score of a candidate is its prediction plus a bonus of
        `bonus` times the best prediction's magnitude, shrinking as
        1/sqrt(1 + n) with n the times it was tried in similar states, plus
        Gaussian noise of `noise` times that magnitude (Thompson-like tie
        breaking).  Relative scales, because measurement noise (what a
        residual RMSE would measure) says nothing about what the model does
        not know yet.

        Both pick within the trust region (`_trust_region`): one grid step from
        the best setting measured in states like this one.  The upper-confidence
        pick widens it where the model is unsure, but only to settings one step
        from a measured one (`_next_to_measured`): a far setting is reached
        through measured neighbours (safe exploration, as SafeOpt's safe set
        grows), never on the trees' flat extrapolation alone.
        """
        return self._explore(latest_features, rng, cover=cover)

    def _explore(self, latest_features: Mapping[str, Any] | None, rng: np.random.Generator,
                 bonus: float = 0.3, noise: float = 0.05, cover: int = 0
                 ) -> dict[str, KnobValue]:
        default = np.array(self.default_setting)
        if not self._full_grid:
            # too many combinations: move a random knob off the best setting
            if self.booster is not None:
                base = self._recommended_codes(latest_features)
            else:
                base = default.copy()
            codes = base.copy()
            for _ in range(100):
                j = int(rng.integers(len(self.knobs)))
                grid = self.grids[j]
                codes[j] = self._encode(self.knobs[j], grid[int(rng.integers(len(grid)))])
                if not (np.array_equal(codes, default) or np.array_equal(codes, base)):
                    break
            return self._decode_setting(codes)
        keep = ~self._combo_is_default
        if not keep.any():
            return self._decode_setting(default)
        codes = self._combo_codes[keep]
        if self.booster is None:
            return self._decode_setting(codes[int(rng.integers(len(codes)))])
        features = self._feature_vector(latest_features)
        sign = 1.0 if self.goal == "max" else -1.0
        pred = sign * self._predict_codes(features, codes)
        scale = abs(float(np.max(pred)))  # the best candidate's magnitude
        if not math.isfinite(scale) or scale <= 0:
            scale = float(np.std(self._y)) if len(self._y) > 1 else 1.0
        scale = scale if scale > 0 else 1.0
        counts_all = self._local_counts(features, self._combo_codes)
        counts = counts_all[keep]
        optimistic = pred + bonus * scale / np.sqrt(1.0 + counts)
        # coverage within a trust region: next to the best-known setting on the grid,
        # or where the model's optimism still reaches the best prediction (uncertain);
        # never a setting the model already knows to be far worse (readahead 0 on a
        # scan: covering every candidate in every state kept sim.readahead seeds 1, 3, 6
        # in learning at 0.78-0.87 of the oracle, the regression bisected to 6193b1f)
        # centred on the best setting measured in this kind of state (`_trust_region`)
        near = self._trust_region(latest_features, features, counts_all, cover)[keep]
        unseen = np.flatnonzero((counts < cover) & near)
        if len(unseen):
            return self._decode_setting(codes[int(rng.choice(unseen))])
        # the upper-confidence pick within the trust region, widened where the model is
        # unsure (its optimism still reaches the best prediction) only to settings next
        # to one measured here, as SafeOpt grows its safe set: the trees extrapolate
        # flat, so an unmeasured far setting predicts like its measured neighbour and its
        # optimism outbids every measured one (widened to those, the simulator's seed
        # 21 tried 1-4 KiB in a sequential phase at x0.17-0.19 the default; on 60 seeds
        # the mean time to recommendation went 998 -> 899 ticks, docs/results/learning-34.md)
        reachable = self._next_to_measured(counts_all, cover)[keep]
        score = np.where(near | (reachable & (optimistic >= np.max(pred))), optimistic, -np.inf)
        score += rng.normal(0.0, noise * scale, size=len(score))
        return self._decode_setting(codes[int(np.argmax(score))])

    def _recommended_codes(self, latest_features: Mapping[str, Any] | None) -> np.ndarray:
        """What the policy would run here (`recommend`), encoded."""
        return np.array([self._encode(k, v) for k, v in
                         self.recommend(latest_features)[0].items()])

    def _trust_region(self, latest_features: Mapping[str, Any] | None, features: np.ndarray,
                      counts: np.ndarray, cover: int) -> np.ndarray:
        """The mask of the candidate grid (`_combo_codes`) at most one grid step from the
        best setting measured in states like this one: the best-predicted among those
        with at least `cover` rows (one at least) here (`counts`, `_local_counts` of
        every candidate); the default is always among them (its ticks measure it
        everywhere), and exact ties go to the setting nearest the default (`_best_index`).

        Not from what this host's trees would run here: in a phase they have not seen
        that is a guess from other phases, and a region around a guess is no trust
        region.  An adopted fleet policy's choice is the centre while it is adopted: it
        was fitted on what other hosts measured, that knowledge is why a newcomer adopts
        it, and `challenge` drops it once this host's rows predict better (centred on
        this host's measurements instead, newcomers reached recommendation later than
        hosts learning alone, 1,121 against 929.5 ticks, and did worse on 7 of 10 seeds;
        docs/results/learning-34.md)."""
        if self.adopted:
            centre = self._recommended_codes(latest_features)
        else:
            measured = self._combo_codes[(counts >= max(1, cover)) | self._combo_is_default]
            centre = measured[self._best_index(self._predict_codes(features, measured),
                                               measured)]
        return _grid_distance(self._combo_codes, centre, self._encoded_grids) <= 1

    def _next_to_measured(self, counts: np.ndarray, cover: int) -> np.ndarray:
        """The mask of the candidate grid (`_combo_codes`) at most one grid step from a
        setting measured in states like this one (`counts` as `_trust_region` reads
        them, the default always): how far exploration may widen past the trust
        region.  A setting next to a measured one is a small step from something known;
        one further out is known only by extrapolation."""
        measured = self._combo_codes[(counts >= max(1, cover)) | self._combo_is_default]
        mask = np.zeros(len(self._combo_codes), dtype=bool)
        for setting in measured:
            mask |= _grid_distance(self._combo_codes, setting, self._encoded_grids) <= 1
        return mask

    def uncovered(self, latest_features: Mapping[str, Any] | None, cover: int) -> bool:
        """Whether a setting next to the best one measured here (not the default) was
        measured on fewer than `cover` rows in states like this one: what exploration's
        coverage would try first.  False before a fit or on grids too large to list."""
        if self.booster is None or not self._full_grid:
            return False
        features = self._feature_vector(latest_features)
        counts = self._local_counts(features, self._combo_codes)
        near = self._trust_region(latest_features, features, counts, cover)
        return bool((counts[near & ~self._combo_is_default] < cover).any())

    # ---- the policy -------------------------------------------------------
    def adopt(self, text: str) -> None:
        """Start from a booster trained elsewhere (a fleet policy, mlfs/fleet/pull.py):
        recommendations and the uploaded policy use it; feedback corrections
        (`correct`) boost it on this host's residuals in level only between
        challenges, and each `challenge` keeps it, tunes it in level or drops it for
        learning alone.
        ValueError unless its columns are exactly this learner's."""
        booster = lgb.Booster(model_str=text)
        if booster.feature_name() != self.columns:
            raise ValueError(f"policy columns {booster.feature_name()} are not this model's "
                             f"{self.columns}")
        self.booster = self._prior = booster
        self.adopted = True

    def policy_text(self) -> str:
        """The booster in LightGBM text format, for `models/<m>/policy`.

        Its feature names are exactly the dataset columns it uses (features,
        then `knob_<name>` of the controlled knobs), raw values, no transform.
        """
        if self.booster is None:
            raise RuntimeError("policy_text() before a successful fit()")
        return self.booster.model_to_string()


def drop_verdict(local_loss: np.ndarray, kept_loss: np.ndarray,
                 block: int = CHALLENGE_BLOCK) -> dict[str, Any]:
    """Whether learning alone predicts better than the kept prior by a margin that stays
    valid however often it is asked (`KnobLearner.challenge`, every refit).

    The samples are the per-row differences of loss (local - kept; `challenge` passes
    absolute errors: squared error is carried by a few rows) on the same holdout rows,
    averaged over blocks of `block` consecutive rows; their z (mean over its standard
    error) must fall below minus the normal-mixture boundary of mlfs/base/sequential.py --
    the test the proxy's mode machine decides with -- at `MIN_EPISODES` blocks or more.
    A lower RMSE alone is not enough: on a few hundred rows it swings either way with
    the phase the holdout happened to catch, and a drop cannot be taken back."""
    differences = np.asarray(local_loss, dtype=np.float64) - np.asarray(kept_loss,
                                                                        dtype=np.float64)
    usable = len(differences) // block * block
    means = differences[:usable].reshape(-1, block).mean(axis=1)
    needed = boundary(len(means))
    out: dict[str, Any] = {"drop": False, "blocks": len(means), "z": None,
                           "boundary": round(needed, 3)}
    if len(means) < MIN_EPISODES:
        return out
    spread = float(means.std(ddof=1)) / np.sqrt(len(means))
    if not spread > 0:
        return out
    z = float(means.mean()) / spread
    out["z"] = round(z, 3)
    out["drop"] = z <= -needed
    return out
