"""The rows a knob model learns from: dataset portions and feedback, aligned and bounded.

Alignment.  The proxy decides the knobs of tick *t* from the features of the
latest finished tick, *t - 1*, and records those decision-time features in the
feedback.  A dataset row, however, holds the features sampled *during* tick
*t*, which may already reflect the knob (a cache hit ratio does).  Training
on those would teach the model a relationship it can never use at decision
time, so by default (`lag=1`) dataset rows are re-aligned: the features of
tick t - 1 are paired with the knobs and objective of tick t, and a row whose
predecessor is missing (first row, a gap after a crash) is dropped.

Kept apart from the fit because three readers share these rows -- the fit, the
feedback correction and exploration's coverage -- and because they also say
which state is the newest (`latest_features`), which the trainer decides on.
Memory is bounded: the last `window` dataset rows and `feedback_window`
feedback rows are kept, older ones are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from mlfs.abi import Settling

from .encoding import KnobSpace, as_float_column, table_ticks

#: rows, labels, ticks
Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


class TrainingWindow:
    """Dataset and feedback rows of one model, decision-time aligned, by tick."""

    def __init__(self, space: KnobSpace, window: int, feedback_window: int,
                 lag: int) -> None:
        if lag not in (0, 1):
            raise ValueError("lag must be 0 or 1")
        self.space = space
        self.window = int(window)
        self.feedback_window = int(feedback_window)
        self.lag = lag
        width = space.width
        self.X = np.empty((0, width))
        self.y = np.empty(0)
        self.tick = np.empty(0, dtype=np.int64)
        self.fX = np.empty((0, width))
        self.fy = np.empty(0)
        self.ftick = np.empty(0, dtype=np.int64)
        #: `training_set`'s result until rows are added: coverage asks for it on
        #: every exploration, and the settle filter is a loop over the window
        self._training_cache: Rows | None = None
        self._last_tick: int | None = None
        self._last_features: np.ndarray | None = None
        self.latest_features: dict[str, float] = {}
        self.latest_tick: int | None = None
        self.max_tick: int | None = None
        self.rows_since_fit = 0

    # ---- dataset portions -------------------------------------------------
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
        ticks = table_ticks(table)
        order = np.argsort(ticks, kind="stable")
        ticks = ticks[order]
        feats = self.space.feature_matrix(table)[order]
        knobs = self.space.knob_matrix(table)[order]
        y = as_float_column(table, "objective")[order]
        self._note_newest_row(ticks, feats)
        feats, ok = self._aligned(ticks, feats)
        ok &= np.isfinite(y) & np.isfinite(knobs).all(axis=1) & (ticks >= 0)
        X = np.hstack([feats, knobs])[ok]
        self.X = np.vstack([self.X, X])[-self.window:]
        self.y = np.concatenate([self.y, y[ok]])[-self.window:]
        self.tick = np.concatenate([self.tick, ticks[ok]])[-self.window:]
        self._training_cache = None
        kept = int(ok.sum())
        self.rows_since_fit += kept
        return kept

    def _note_newest_row(self, ticks: np.ndarray, feats: np.ndarray) -> None:
        """The portion's last row is the newest state unless a newer one is known."""
        last = ticks[-1]
        if self.latest_tick is None or last >= self.latest_tick:
            self.latest_tick = int(last)
            self.latest_features = {c: float(v) for c, v in
                                    zip(self.space.feature_columns, feats[-1], strict=True)}
        self.max_tick = int(last) if self.max_tick is None else max(self.max_tick, int(last))

    def _aligned(self, ticks: np.ndarray, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The decision-time features of each row (those of its predecessor with
        `lag`), and which rows have them."""
        if not self.lag:
            return feats, np.ones(len(ticks), dtype=bool)
        last = ticks[-1]
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
        return prev, ok

    # ---- feedback ---------------------------------------------------------
    def parse_feedback(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray]:
        """(X, observed, ticks, recorded error) of the feedback rows that have an
        observed objective and decodable knobs."""
        label = "observed" if "observed" in table.column_names else "objective"
        if label not in table.column_names:
            raise ValueError("feedback has no 'observed' column")
        X = np.hstack([self.space.feature_matrix(table), self.space.knob_matrix(table)])
        y = as_float_column(table, label)
        ticks = table_ticks(table)
        err = (as_float_column(table, "error") if "error" in table.column_names
               else np.full(len(y), np.nan))
        ok = np.isfinite(y) & np.isfinite(X[:, self.space.n_features:]).all(axis=1)
        return X[ok], y[ok], ticks[ok], err[ok]

    def store_feedback(self, X: np.ndarray, y: np.ndarray, ticks: np.ndarray) -> None:
        """Append parsed feedback rows and note the newest decision-time state."""
        self.fX = np.vstack([self.fX, X])[-self.feedback_window:]
        self.fy = np.concatenate([self.fy, y])[-self.feedback_window:]
        self.ftick = np.concatenate([self.ftick, ticks])[-self.feedback_window:]
        self._training_cache = None
        self._note_feedback_features(X, ticks)

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
                self.space.feature_columns, X[i, : self.space.n_features], strict=True)}

    def note_features(self, tick: int, features: Mapping[str, Any]) -> bool:
        """The subsystem's `features` file as the newest state, if it is newer
        (`KnobLearner.note_features` says why)."""
        if self.latest_tick is not None and tick <= self.latest_tick:
            return False
        try:
            values = {c: math.nan if features[c] is None else float(features[c])
                      for c in self.space.feature_columns}
        except (KeyError, TypeError, ValueError, OverflowError):
            return False
        self.latest_tick = int(tick)
        self.latest_features = values
        return True

    def recent_feedback(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The newest `count` feedback rows (as stored) by tick, settled ones only."""
        wX, wy, wt = self.fX[-count:], self.fy[-count:], self.ftick[-count:]
        order = np.argsort(wt, kind="stable")
        keep = self.settled(wX[order], wt[order])
        return wX[order][keep], wy[order][keep]

    # ---- what the fit reads -----------------------------------------------
    @property
    def explored_rows(self) -> int:
        """Dataset rows whose knob setting differs from the default one."""
        if not len(self.X):
            return 0
        knobs = self.X[:, self.space.n_features:]
        return int((knobs != np.array(self.space.default_setting)).any(axis=1).sum())

    def settled(self, X: np.ndarray, ticks: np.ndarray) -> np.ndarray:
        """Which rows (sorted by tick) were measured under a settled setting.

        For a knob with carry-over (`settle_ticks` k > 0) a row counts only if
        the same value held on the k ticks before it (mlfs.abi.Settling, the
        rule the proxy's efficiency uses): the first ticks after a change
        still show what the previous value left behind (dirty pages it let
        in), and a fit that credits them to the new value learns the wrong
        sign.  A gap in the ticks starts the count again.
        """
        settle = self.space.settle
        if not any(settle.values()):
            return np.ones(len(ticks), dtype=bool)
        settled = np.zeros(len(ticks), dtype=bool)
        settling = Settling(settle)
        previous: int | None = None
        knobs = self.space.knobs
        for i, (codes, tick) in enumerate(zip(X[:, self.space.n_features:], ticks,
                                              strict=True)):
            if previous is not None and tick != previous + 1:
                settling = Settling(settle)
            settled[i] = not settling(dict(zip(knobs, codes.tolist(), strict=True)))
            previous = int(tick)
        return settled

    def training_set(self) -> Rows:
        """Dataset rows plus feedback rows of ticks the dataset window lacks, by
        tick, without those taken while a carry-over knob settled (`settled`).
        Computed once per change of the rows; the arrays are read-only."""
        if self._training_cache is not None:
            return self._training_cache
        extra = ~np.isin(self.ftick, self.tick)
        X = np.vstack([self.X, self.fX[extra]])
        y = np.concatenate([self.y, self.fy[extra]])
        t = np.concatenate([self.tick, self.ftick[extra]])
        order = np.argsort(t, kind="stable")
        X, y, t = X[order], y[order], t[order]
        keep = self.settled(X, t)
        out = (X[keep], y[keep], t[keep])
        for array in out:
            array.setflags(write=False)
        self._training_cache = out
        return out

    def weights(self, X: np.ndarray) -> np.ndarray:
        """Square-root inverse frequency of each knob setting.

        The default algorithm dominates the dataset (90% of ticks in learning
        mode); without this the trees spend their splits on the default setting
        and hardly resolve the explored ones, which are what the argmax compares.
        """
        knobs = X[:, self.space.n_features:]
        _, inverse, counts = np.unique(knobs, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        w = np.sqrt(len(X) / (len(counts) * counts[inverse]))
        return np.clip(w, 0.1, 10.0)
