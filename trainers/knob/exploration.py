"""Which setting to try next, and which to run: the knob model's search of its grid.

Kept apart from the fit because exploration is where a learner spends the host's
throughput: every setting it tries in learning mode runs on real ticks.  So what it
tries is bounded -- coverage of each kind of state (`local_counts`), a trust region
around the best setting measured there (`trust_region`), widened only to settings
next to a measured one (`next_to_measured`) -- and the same search finds the best
setting to recommend (`best`: the whole grid, or one knob at a time when the grid is
too large to list, `coordinate_search`).

The model is passed in as `predict(features, codes)` (the current booster's
prediction of one state under each setting); the rows come from the learner's
`TrainingWindow`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .dataset import TrainingWindow
from .encoding import KnobSpace, grid_distance

#: coverage's "states like this one": rows within this many standard deviations (root
#: mean square over the features) of the state (`Exploration.local_counts`)
STATE_RADIUS = 1.5

#: the model: its prediction of one state (features) under each row of knob codes
Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Exploration:
    """The search of one model's knob grid (see the module docstring)."""

    def __init__(self, space: KnobSpace, rows: TrainingWindow) -> None:
        self.space = space
        self.rows = rows
        #: the features' standardization of coverage's distances, set by each fit
        self.mean = np.zeros(space.n_features)
        self.scale = np.ones(space.n_features)

    def standardize_on(self, X: np.ndarray) -> None:
        """Standardize coverage's distances on the features of the rows a fit used."""
        feats = X[:, : self.space.n_features]
        self.mean = np.nanmean(feats, axis=0) if len(X) else self.mean
        scale = np.nanstd(feats, axis=0)
        self.scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
        self.mean = np.where(np.isfinite(self.mean), self.mean, 0.0)

    # ---- the best setting -------------------------------------------------
    def best(self, predict: Predict, features: np.ndarray) -> tuple[np.ndarray, float]:
        """The best setting's codes for this state and its prediction."""
        space = self.space
        if space.full_grid:
            pred = predict(features, space.combo_codes)
            i = space.best_index(pred, space.combo_codes)
            return space.combo_codes[i], float(pred[i])
        return self.coordinate_search(predict, features, space.default_setting)

    def coordinate_search(self, predict: Predict, features: np.ndarray,
                          start: Sequence[float]) -> tuple[np.ndarray, float]:
        """Best setting one knob at a time, for grids too large to enumerate."""
        space = self.space
        current = np.array(start, dtype=np.float64)
        best = math.nan
        for _ in range(3):
            changed = False
            for j, knob in enumerate(space.knobs):
                values = np.array([space.encode(knob, v) for v in space.grids[j]])
                codes = np.repeat(current[None, :], len(values), axis=0)
                codes[:, j] = values
                pred = predict(features, codes)
                i = space.best_index(pred, codes)
                best = float(pred[i])
                if codes[i, j] != current[j]:
                    current[j] = codes[i, j]
                    changed = True
            if not changed:
                break
        return current, best

    # ---- coverage ---------------------------------------------------------
    def local_counts(self, features: np.ndarray, codes: np.ndarray, k: int = 200
                     ) -> np.ndarray:
        """How often each candidate setting was measured in states like this one.

        Measured: on the rows the fit uses (`TrainingWindow.training_set`).  A row
        taken while a carry-over knob settled is left out of the fit, so it must not
        count here either: an exploration cut short by a phase change before its
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
        X, _, _ = self.rows.training_set()
        if not len(X):
            return np.zeros(len(codes))
        n_features = self.space.n_features
        z = (X[:, :n_features] - self.mean) / self.scale
        z0 = (features - self.mean) / self.scale
        d = np.nansum((np.nan_to_num(z, nan=0.0) - np.nan_to_num(z0, nan=0.0)) ** 2, axis=1)
        k = min(k, len(d))
        near = np.argpartition(d, k - 1)[:k]
        near = near[d[near] <= STATE_RADIUS**2 * n_features]
        tried = X[near, n_features:]
        return (tried[:, None, :] == codes[None, :, :]).all(axis=2).sum(axis=0)

    def trust_region(self, predict: Predict, features: np.ndarray, counts: np.ndarray,
                     cover: int, adopted_centre: np.ndarray | None) -> np.ndarray:
        """The mask of the candidate grid (`combo_codes`) at most one grid step from the
        best setting measured in states like this one: the best-predicted among those
        with at least `cover` rows (one at least) here (`counts`, `local_counts` of
        every candidate); the default is always among them (its ticks measure it
        everywhere), and exact ties go to the setting nearest the default (`best_index`).

        Not from what this host's trees would run here: in a phase they have not seen
        that is a guess from other phases, and a region around a guess is no trust
        region.  An adopted fleet policy's choice (`adopted_centre`) is the centre while
        it is adopted: it was fitted on what other hosts measured, that knowledge is why
        a newcomer adopts it, and `challenge` drops it once this host's rows predict
        better (centred on this host's measurements instead, newcomers reached
        recommendation later than hosts learning alone, 1,121 against 929.5 ticks, and
        did worse on 7 of 10 seeds; docs/results/learning-34.md)."""
        space = self.space
        if adopted_centre is not None:
            centre = adopted_centre
        else:
            measured = space.combo_codes[(counts >= max(1, cover)) | space.combo_is_default]
            centre = measured[space.best_index(predict(features, measured), measured)]
        return grid_distance(space.combo_codes, centre, space.encoded_grids) <= 1

    def next_to_measured(self, counts: np.ndarray, cover: int) -> np.ndarray:
        """The mask of the candidate grid (`combo_codes`) at most one grid step from a
        setting measured in states like this one (`counts` as `trust_region` reads
        them, the default always): how far exploration may widen past the trust
        region.  A setting next to a measured one is a small step from something known;
        one further out is known only by extrapolation."""
        space = self.space
        measured = space.combo_codes[(counts >= max(1, cover)) | space.combo_is_default]
        mask = np.zeros(len(space.combo_codes), dtype=bool)
        for setting in measured:
            mask |= grid_distance(space.combo_codes, setting, space.encoded_grids) <= 1
        return mask

    def uncovered(self, predict: Predict, features: np.ndarray, cover: int,
                  adopted_centre: np.ndarray | None) -> bool:
        """Whether a setting in the trust region (not the default) was measured on
        fewer than `cover` rows in states like this one (`KnobLearner.uncovered`)."""
        space = self.space
        counts = self.local_counts(features, space.combo_codes)
        near = self.trust_region(predict, features, counts, cover, adopted_centre)
        return bool((counts[near & ~space.combo_is_default] < cover).any())

    # ---- a setting to try -------------------------------------------------
    def explore(self, predict: Predict | None, features: np.ndarray,
                rng: np.random.Generator, recommended: Callable[[], np.ndarray], *,
                adopted: bool, bonus: float = 0.3, noise: float = 0.05, cover: int = 0
                ) -> np.ndarray:
        """The codes of a setting worth trying, never the default one
        (`KnobLearner.explore` says how it is chosen); `recommended()` gives the
        codes the policy would run here (only called with a model)."""
        space = self.space
        default = np.array(space.default_setting)
        if not space.full_grid:
            base = recommended() if predict is not None else default.copy()
            return self._one_knob_off(base, default, rng)
        keep = ~space.combo_is_default
        if not keep.any():
            return default
        codes = space.combo_codes[keep]
        if predict is None:
            return codes[int(rng.integers(len(codes)))]
        sign = 1.0 if space.goal == "max" else -1.0
        pred = sign * predict(features, codes)
        scale = abs(float(np.max(pred)))  # the best candidate's magnitude
        if not math.isfinite(scale) or scale <= 0:
            y = self.rows.y
            scale = float(np.std(y)) if len(y) > 1 else 1.0
        scale = scale if scale > 0 else 1.0
        counts_all = self.local_counts(features, space.combo_codes)
        counts = counts_all[keep]
        optimistic = pred + bonus * scale / np.sqrt(1.0 + counts)
        # coverage within a trust region: next to the best-known setting on the grid,
        # or where the model's optimism still reaches the best prediction (uncertain);
        # never a setting the model already knows to be far worse (readahead 0 on a
        # scan: covering every candidate in every state kept sim.readahead seeds 1, 3, 6
        # in learning at 0.78-0.87 of the oracle, the regression bisected to 6193b1f)
        # centred on the best setting measured in this kind of state (`trust_region`)
        centre = recommended() if adopted else None
        near = self.trust_region(predict, features, counts_all, cover, centre)[keep]
        unseen = np.flatnonzero((counts < cover) & near)
        if len(unseen):
            return codes[int(rng.choice(unseen))]
        # the upper-confidence pick within the trust region, widened where the model is
        # unsure (its optimism still reaches the best prediction) only to settings next
        # to one measured here, as SafeOpt grows its safe set: the trees extrapolate
        # flat, so an unmeasured far setting predicts like its measured neighbour and its
        # optimism outbids every measured one (widened to those, the simulator's seed
        # 21 tried 1-4 KiB in a sequential phase at x0.17-0.19 the default; on 60 seeds
        # the mean time to recommendation went 998 -> 899 ticks, docs/results/learning-34.md)
        reachable = self.next_to_measured(counts_all, cover)[keep]
        score = np.where(near | (reachable & (optimistic >= np.max(pred))), optimistic, -np.inf)
        score += rng.normal(0.0, noise * scale, size=len(score))
        return codes[int(np.argmax(score))]

    def _one_knob_off(self, base: np.ndarray, default: np.ndarray,
                      rng: np.random.Generator) -> np.ndarray:
        """Too many combinations to list: a random knob moved off `base` (the best
        setting, or the default before a fit), neither of the two if it can help it."""
        space = self.space
        codes = base.copy()
        for _ in range(100):
            j = int(rng.integers(len(space.knobs)))
            grid = space.grids[j]
            codes[j] = space.encode(space.knobs[j], grid[int(rng.integers(len(grid)))])
            if not (np.array_equal(codes, default) or np.array_equal(codes, base)):
                break
        return codes
