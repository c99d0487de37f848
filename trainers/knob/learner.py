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

`KnobLearner` holds the current booster and composes one part per concept:
the subsystem's columns and knob grid (`encoding.KnobSpace`), the rows aligned to
decision time (`dataset.TrainingWindow`), the LightGBM fits (`fit.BoosterFitting`),
the fleet challenge of an adopted prior (`challenge.judge`) and the search of the
grid -- exploration, trust region, coordinate search (`exploration.Exploration`).

Nothing here touches a mount; the worker (`trainers.knob.worker`) feeds it tables.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import lightgbm as lgb
import numpy as np
import pyarrow as pa

from mlfs.abi import KnobValue, candidate_values, column_name, knob_column

from .challenge import CHALLENGE_BLOCK, ROLLED_OUT_MODES, drop_verdict, judge
from .dataset import TrainingWindow
from .encoding import MAX_CANDIDATES, KnobSpace, missing_features
from .exploration import STATE_RADIUS, Exploration
from .fit import BoosterFitting, recorded_mae

__all__ = [
    "CHALLENGE_BLOCK",
    "KnobLearner",
    "MAX_CANDIDATES",
    "ROLLED_OUT_MODES",
    "STATE_RADIUS",
    "candidate_values",
    "column_name",
    "drop_verdict",
    "knob_column",
    "missing_features",
]


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

        `lag`: 1 pairs each row's knobs and objective with the features of the tick
        before, the state the proxy decided on (trainers/knob/dataset.py); 0 does not.
        """
        self.info = dict(info)
        self.space = KnobSpace(info, knobs, features)
        self.training = TrainingWindow(self.space, window, feedback_window, lag)
        self.fitting = BoosterFitting(self.space, num_boost_round=num_boost_round,
                                      seed=seed, relative=relative, params=params)
        self.exploration = Exploration(self.space, self.training)
        self.seed = seed
        self.booster: lgb.Booster | None = None
        #: the booster came from elsewhere (`adopt`): challenged, never refitted from scratch
        #: until learning alone predicts this host better (`challenge`)
        self.adopted = False
        #: the adopted booster as it came (the prior every `challenge` starts from)
        self._prior: lgb.Booster | None = None
        self.stats: dict[str, Any] = {}

    # ---- what the worker and the fleet read ---------------------------------
    @property
    def knobs(self) -> list[str]:
        """The controlled knobs, in info order (the proxy's candidate order)."""
        return self.space.knobs

    @property
    def knob_specs(self) -> dict[str, dict]:
        return self.space.knob_specs

    @property
    def features(self) -> list[str]:
        """The features the model uses, in info order."""
        return self.space.features

    @property
    def feature_columns(self) -> list[str]:
        return self.space.feature_columns

    @property
    def knob_columns(self) -> list[str]:
        return self.space.knob_columns

    @property
    def columns(self) -> list[str]:
        """The booster's feature names: the feature columns, then `knob_<name>`."""
        return self.space.columns

    @property
    def grids(self) -> list[list[KnobValue]]:
        """Each controlled knob's candidate values (the proxy's grid)."""
        return self.space.grids

    @property
    def goal(self) -> str:
        return self.space.goal

    @property
    def params(self) -> dict[str, Any]:
        """The LightGBM parameters of a fresh fit."""
        return self.fitting.params

    @property
    def num_boost_round(self) -> int:
        return self.fitting.num_boost_round

    @property
    def window(self) -> int:
        """Dataset rows kept for training."""
        return self.training.window

    @property
    def latest_features(self) -> dict[str, float]:
        """The newest state known, by feature column: what decisions default to."""
        return self.training.latest_features

    @property
    def latest_tick(self) -> int | None:
        return self.training.latest_tick

    @property
    def max_tick(self) -> int | None:
        """The newest tick of any row or feedback seen."""
        return self.training.max_tick

    @property
    def rows_since_fit(self) -> int:
        """Dataset rows kept since the last fresh fit."""
        return self.training.rows_since_fit

    @property
    def rows(self) -> int:
        """Dataset rows in the training window."""
        return len(self.training.y)

    @property
    def fitted(self) -> bool:
        return self.booster is not None

    @property
    def explored_rows(self) -> int:
        """Training rows whose knob setting differs from the default one."""
        return self.training.explored_rows

    @property
    def knob_aware(self) -> bool:
        """Whether the booster splits on a knob at all (else every candidate ties)."""
        if self.booster is None:
            return False
        splits = self.booster.feature_importance("split")[self.space.n_features:]
        return bool(splits.sum() > 0)

    # ---- data -------------------------------------------------------------
    def add_dataset(self, table: pa.Table) -> int:
        """Append dataset rows (one sealed portion); returns rows kept for training
        (`TrainingWindow.add_dataset`)."""
        return self.training.add_dataset(table)

    def add_feedback(self, table: pa.Table) -> int:
        """Append feedback rows (features at decision time, knobs applied, observed)."""
        if table.num_rows == 0:
            return 0
        X, y, ticks, _ = self.training.parse_feedback(table)
        self.training.store_feedback(X, y, ticks)
        return len(y)

    def note_features(self, tick: int, features: Mapping[str, Any]) -> bool:
        """The subsystem's `features` file: the last tick's features, the state the
        proxy decides a policy's tick on.  Newer than the rows' (`latest_tick`), it is
        the state exploration and recommendations decide on from now; returns whether
        it was.  Rows come sealed, up to a seal interval late: a trainer that chose on
        them explored the last phase's neighbourhood for the first ticks of a new one
        (1,024 and 2,048 KiB at x0.26 in a strided phase, learning bench seed 49).  A
        null value is missing (NaN, as in the rows); a feature not there: not used."""
        return self.training.note_features(tick, features)

    def training_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(X, label, weight) exactly as `fit` trains on them: decision-time rows,
        the label LightGBM sees, the per-setting weights.  The fleet trainer
        (mlfs/fleet/train.py) builds its distributed training set with this, so a
        fleet policy has the local policy's features, target and format."""
        X, y, _ = self.training.training_set()
        if not len(y):
            return X, y, np.empty(0)
        return X, self.fitting.label(y), self.training.weights(X)

    # ---- fitting ----------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train a fresh booster on the window; validate on the newest 20% first
        (`BoosterFitting.fit`).  Below 20 rows nothing changes."""
        started = time.perf_counter()
        X, y, _ = self.training.training_set()
        if len(y) < 20:
            return {"fitted": False, "rows": len(y), "reason": "too few rows"}
        self.booster, stats = self.fitting.fit(X, y, self.training.weights(X))
        self.exploration.standardize_on(X)
        stats["explored_rows"] = self.explored_rows
        stats["seconds"] = round(time.perf_counter() - started, 4)
        self.training.rows_since_fit = 0
        self.stats = stats
        return stats

    def challenge(self, rolled_out: bool = False) -> dict[str, Any]:
        """An adopted (fleet) policy against learning alone, on this host's own rows.

        A prior is worth what it predicts here.  Four candidates are trained on this
        host's older 80 % of rows and predict the newest 20 % (time-ordered, as `fit`
        validates): the prior as it came; the prior tuned in level (`tune`: this
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
        here, and its choices were worse than the prior's (`level_only`).  Each
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
        X, y, _ = self.training.training_set()
        if len(y) < 100:
            return {"dropped": False, "reason": "too few rows", "rows": len(y)}
        w = self.training.weights(X)
        out = judge(self.fitting, self._prior, X, y, w, rolled_out)
        if out["chosen"] == "local":
            self.adopted = False
            out["fit"] = self.fit()
        elif out["chosen"] == "tuned":
            self.booster = self.fitting.tune(self._prior, X, y, w)
        else:
            self.booster = self._prior
        return out

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

        An adopted prior is corrected in level only (`level_only`): its ranking of
        the settings is the fleet's until `challenge` drops it.

        Small leaves fitted to a few hundred rows overfit easily, and an
        in-sample check would accept anything; so the correction is first
        trained on a random 75% of the window and kept only if it does not
        worsen the error on the other 25% (`holdout_before`/`holdout_after`).
        """
        if feedback.num_rows:
            X, y, ticks, err = self.training.parse_feedback(feedback)
        else:
            X, y, ticks, err = (np.empty((0, self.space.width)), np.empty(0),
                                np.empty(0, dtype=np.int64), np.empty(0))
        self.training.store_feedback(X, y, ticks)
        stats: dict[str, Any] = {"rows": len(y), "corrected": False,
                                 "recorded_mae": recorded_mae(err)}
        if self.booster is None or len(y) == 0:
            return stats
        corrected = self.fitting.correct(
            self.booster, (X, y), self.training.recent_feedback(2000), adopted=self.adopted,
            rng_seed=self.seed + len(self.training.fy), rounds=rounds, max_trees=max_trees,
            stats=stats)
        if corrected is not None:
            self.booster = corrected
        return stats

    # ---- decisions --------------------------------------------------------
    def feature_vector(self, latest: Mapping[str, Any] | None) -> np.ndarray:
        """Features keyed by column name (as the proxy has them) or by info name;
        None: the newest state known (`latest_features`)."""
        return self.space.feature_vector(self.latest_features if latest is None else latest)

    def _predict_codes(self, features: np.ndarray, codes: np.ndarray) -> np.ndarray:
        assert self.booster is not None
        return self.booster.predict(self.space.rows(features, codes),
                                    num_threads=self.fitting.threads)

    def predict(self, latest_features: Mapping[str, Any] | None,
                knobs: Mapping[str, Any]) -> float:
        """The predicted objective of one knob setting (the `expect=` to send)."""
        if self.booster is None:
            return math.nan
        codes = self.space.encode_setting(knobs)[None, :]
        return float(self._predict_codes(self.feature_vector(latest_features), codes)[0])

    def recommend(self, latest_features: Mapping[str, Any] | None = None
                  ) -> tuple[dict[str, KnobValue], float]:
        """The best knob setting for this state and its predicted objective.

        Evaluates the candidate grid and takes the argmax (argmin for goal
        "min"), exact ties going to the setting nearest the default, as the
        policy will; on a grid too large to list, one knob at a time from the
        default.  `latest_features` defaults to the newest state known.
        """
        if self.booster is None:
            raise RuntimeError("recommend() before a successful fit()")
        codes, value = self.exploration.best(self._predict_codes,
                                             self.feature_vector(latest_features))
        return self.space.decode_setting(codes), value

    def _recommended_codes(self, latest_features: Mapping[str, Any] | None) -> np.ndarray:
        """What the policy would run here (`recommend`), encoded."""
        return self.space.encode_setting(self.recommend(latest_features)[0])

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
        0.3 times the best prediction's magnitude, shrinking as
        1/sqrt(1 + n) with n the times it was tried in similar states, plus
        Gaussian noise of 0.05 times that magnitude (Thompson-like tie
        breaking).  Relative scales, because measurement noise (what a
        residual RMSE would measure) says nothing about what the model does
        not know yet.

        Both pick within the trust region (`Exploration.trust_region`): one grid step
        from the best setting measured in states like this one.  The upper-confidence
        pick widens it where the model is unsure, but only to settings one step
        from a measured one (`next_to_measured`): a far setting is reached
        through measured neighbours (safe exploration, as SafeOpt's safe set
        grows), never on the trees' flat extrapolation alone.  On a grid too large
        to list: a random knob moved off the recommended setting.
        """
        predict = None if self.booster is None else self._predict_codes
        codes = self.exploration.explore(
            predict, self.feature_vector(latest_features), rng,
            lambda: self._recommended_codes(latest_features), adopted=self.adopted,
            cover=cover)
        return self.space.decode_setting(codes)

    def uncovered(self, latest_features: Mapping[str, Any] | None, cover: int) -> bool:
        """Whether a setting next to the best one measured here (not the default) was
        measured on fewer than `cover` rows in states like this one: what exploration's
        coverage would try first.  False before a fit or on grids too large to list."""
        if self.booster is None or not self.space.full_grid:
            return False
        centre = self._recommended_codes(latest_features) if self.adopted else None
        return self.exploration.uncovered(self._predict_codes,
                                          self.feature_vector(latest_features), cover, centre)

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
