"""The knob model's LightGBM fits: a fresh booster, a feedback correction, a tuned prior.

A knob model is a LightGBM regression on exactly the dataset's column names, so
one booster is the trainer's recommender, the proxy's policy and the base that
feedback keeps boosting.  This module owns how such boosters are trained -- the
parameters, the label, the validation of a fresh fit, the held-out check of a
correction, the trees added to an adopted prior -- and nothing else: it gets rows
(`trainers/knob/dataset.py`) and returns boosters and statistics; `KnobLearner`
decides which booster is current.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import lightgbm as lgb
import numpy as np

from .encoding import KnobSpace


def default_params(seed: int, relative: bool,
                   params: Mapping[str, Any] | None) -> dict[str, Any]:
    """LightGBM parameters of a knob model, `params` overriding."""
    out: dict[str, Any] = {
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
        out["objective"] = "gamma"
    out.update(params or {})
    return out


class BoosterFitting:
    """How boosters of one knob model are trained (`KnobLearner` keeps the current one)."""

    def __init__(self, space: KnobSpace, *, num_boost_round: int, seed: int,
                 relative: bool, params: Mapping[str, Any] | None) -> None:
        self.space = space
        self.num_boost_round = int(num_boost_round)
        self.seed = seed
        self.relative = relative
        self.params = default_params(seed, relative, params)

    @property
    def threads(self) -> int:
        return self.params["num_threads"]

    def label(self, y: np.ndarray) -> np.ndarray:
        """The label LightGBM sees: with `relative`, floored to a positive value
        (gamma regression needs y > 0; an idle tick's 0 MiB/s becomes 0.1% of the median)."""
        if not self.relative or not len(y):
            return y
        positive = y[y > 0]
        floor = 1e-3 * float(np.median(positive)) if len(positive) else 1e-6
        return np.maximum(y, max(floor, 1e-12))

    def train(self, X: np.ndarray, y: np.ndarray, w: np.ndarray, rounds: int) -> lgb.Booster:
        """A fresh booster of `rounds` trees."""
        data = lgb.Dataset(X, label=self.label(y), weight=w, feature_name=self.space.columns,
                           free_raw_data=True, params={"verbose": -1})
        return lgb.train(self.params, data, num_boost_round=rounds)

    def extend(self, booster: lgb.Booster, params: dict, X: np.ndarray, y: np.ndarray,
               rounds: int) -> lgb.Booster:
        """`rounds` more trees on top of `booster`, fitted to its residuals."""
        data = lgb.Dataset(X, label=self.label(y), feature_name=self.space.columns,
                           free_raw_data=True, params={"verbose": -1})
        return lgb.train(params, data, num_boost_round=rounds, init_model=booster)

    def tune(self, prior: lgb.Booster, X: np.ndarray, y: np.ndarray, w: np.ndarray, *,
             level_only: bool = True) -> lgb.Booster:
        """The prior with `num_boost_round // 2` more trees fitted to its residuals here,
        split on the state only (`level_only`) unless `level_only` is False."""
        data = lgb.Dataset(X, label=self.label(y), weight=w, feature_name=self.space.columns,
                           free_raw_data=True, params={"verbose": -1})
        params = self.level_only(self.params) if level_only else self.params
        return lgb.train(params, data,
                         num_boost_round=max(1, self.num_boost_round // 2),
                         init_model=prior)

    def level_only(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` for trees added to an adopted prior: they may split on the features,
        never on a knob, so they move a state's predictions of every setting alike --
        this host's level -- and the argmax stays the fleet's.  A host's rows are
        mostly the prior's own choices: trees free to split on a knob lowered or raised
        the settings it chose and re-ranked them against settings never measured here
        (fleet cold start: the corrected prior worse than the prior as it came by up to
        0.008 of the oracle; docs/results/learning-34.md, "The fleet prior's
        ranking")."""
        return {**params, "feature_contri": [1.0] * self.space.n_features
                + [0.0] * len(self.space.knobs)}

    # ---- a fresh booster --------------------------------------------------
    def fit(self, X: np.ndarray, y: np.ndarray, w: np.ndarray
            ) -> tuple[lgb.Booster, dict[str, Any]]:
        """A fresh booster on all rows, validated first on the newest 20%.

        The holdout is time-ordered (the last ticks), because the question that
        matters is how well the past predicts the near future of a drifting
        workload; a random split would flatter the model.  The returned model
        is then refitted on all rows, so the newest ticks are not wasted.
        """
        n = len(y)
        stats: dict[str, Any] = {"fitted": True, "rows": n}
        n_val = n // 5 if n >= 100 else 0
        if n_val:
            cut = n - n_val
            model = self.train(X[:cut], y[:cut], w[:cut], self.num_boost_round)
            pred = model.predict(X[cut:], num_threads=self.threads)
            err = y[cut:] - pred
            stats["val_rows"] = n_val
            stats["val_mae"] = float(np.mean(np.abs(err)))
            stats["val_rmse"] = float(np.sqrt(np.mean(err**2)))
            stats["val_mae_naive"] = float(np.mean(np.abs(y[cut:] - np.mean(y[:cut]))))
        booster = self.train(X, y, w, self.num_boost_round)
        gain = booster.feature_importance("split")
        stats["knob_splits"] = int(gain[self.space.n_features:].sum())
        stats["trees"] = booster.num_trees()
        return booster, stats

    # ---- a feedback correction --------------------------------------------
    def correct(self, booster: lgb.Booster, batch: tuple[np.ndarray, np.ndarray],
                window: tuple[np.ndarray, np.ndarray], *, adopted: bool, rng_seed: int,
                rounds: int, max_trees: int, stats: dict[str, Any]) -> lgb.Booster | None:
        """`rounds` small trees on the feedback `window` (X, observed) added to
        `booster`, or None when they are not kept; `stats` gets the errors on the
        `batch` (X, observed) and on the held-out quarter of the window
        (`KnobLearner.correct` says why).  An adopted prior is corrected in level
        only (`level_only`)."""
        started = time.perf_counter()
        X, y = batch
        before = booster.predict(X, num_threads=self.threads)
        stats["mae_before"] = stats["mae_after"] = float(np.mean(np.abs(y - before)))
        if booster.num_trees() + rounds > max_trees:
            stats["reason"] = "tree budget spent; waiting for a refit"
            return None
        wX, wy = window
        stats["window_rows"] = len(wy)
        if len(wy) < 20:
            stats["reason"] = "too few feedback rows"
            return None
        params = self.level_only(self.params) if adopted else dict(self.params)
        params.update(num_leaves=7, learning_rate=0.1,
                      min_data_in_leaf=max(3, min(20, len(wy) // 20)))
        held = np.random.default_rng(rng_seed).random(len(wy)) < 0.25
        trial = self.extend(booster, params, wX[~held], wy[~held], rounds)
        base = booster.predict(wX[held], num_threads=self.threads)
        stats["holdout_before"] = float(np.mean(np.abs(wy[held] - base)))
        stats["holdout_after"] = float(np.mean(np.abs(
            wy[held] - trial.predict(wX[held], num_threads=self.threads))))
        corrected = None
        if stats["holdout_after"] <= stats["holdout_before"]:
            corrected = self.extend(booster, params, wX, wy, rounds)
            stats["corrected"] = True
            after = corrected.predict(X, num_threads=self.threads)
            stats["mae_after"] = float(np.mean(np.abs(y - after)))
        else:
            stats["reason"] = "correction did not generalise to held-out feedback"
        stats["trees"] = (booster if corrected is None else corrected).num_trees()
        stats["seconds"] = round(time.perf_counter() - started, 4)
        return corrected


def recorded_mae(err: np.ndarray) -> float:
    """Mean |error| as the proxy recorded it (NaN where it recorded none)."""
    finite = err[np.isfinite(err)]
    return float(np.mean(np.abs(finite))) if len(finite) else math.nan
