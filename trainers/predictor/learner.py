"""Learning a predictor: will an entity's event happen within the next `horizon` ticks?

An `EventLearner` is a LightGBM binary classifier over a record dataset's columns (one
row per entity and tick, e.g. one per drive-day), whose policy the proxy runs as it is:
the output of the uploaded text is the probability, so the model must take raw column
values and nothing else, and its calibration must live in the trees.

Class imbalance.  Events are rare (a drive fails about once in 60 drive-years, so under
0.2 % of drive-days are positive at a 30-day horizon).  Weighting positives up
(`is_unbalance`, `scale_pos_weight`) would teach the trees odds that are wrong by the
weight, and the proxy would alert on them as if they were probabilities.  Instead the
negatives are *down-sampled* at rate r (every positive kept) and the fitted log-odds,
which are too high by exactly -ln r, are corrected by adding ln r to every leaf of the
first tree: a constant shift of the raw score, written into the policy itself.  A
held-out check (`calibration`) compares mean predicted and observed rates per bin.

Window features.  A row says how a drive is today; what gives a failure away is often how
it has been: errors on several of the last days, the first of them weeks ago, a latency
above its own month.  `default_windows` picks window features (`mlfs.abi`'s grammar,
`<field>__mean30` and the like) that `fit_predictor` computes from each entity's rows;
the policy names them, and the proxy computes them tick by tick from the same rule.  On
sim.disks, at the threshold rule's false-alarm rate, the same fit catches x1.82 of the
rule's failures without them and x5.09 with them, x6.31 with leaves of 100 rows
(docs/results/predict-sim-disks.md).

Labels come from the rows themselves (`mlfs.base.outcomes` defines the same rule for
scoring; it is restated here because a trainer imports only the client and the ABI):
a row is positive when its entity's next event comes 1..horizon ticks later; the event's
own row is left out of training.
"""

from __future__ import annotations

import math
import re
import time

import lightgbm as lgb
import numpy as np
from mlfs.trainers.fitting import stop_at

from mlfs.abi import window_feature, window_features

__all__ = ["CHALLENGE_HOLDOUT", "EventLearner", "MIN_POSITIVES", "NEGATIVES_PER_POSITIVE",
           "NUM_LEAVES", "ROUNDS", "SAMPLED_LEAF_ROWS", "calibrated", "calibration", "challenge",
           "classifier_params",
           "default_windows", "fit_predictor", "known_rows", "label_rows", "log_loss",
           "negative_rate", "policy_probabilities"]

#: negatives kept per positive row (the rest are down-sampled; see the module docstring).
#: 200 was tried on sim.disks and ranked far worse at low false-alarm rates (recall 0.000
#: at 1e-5 per drive-day where 50 gave 0.534, and the top decile over-predicted, 0.0110
#: against 0.0073 observed: bench-results/predict-sim-disks-negatives200.txt); not understood
NEGATIVES_PER_POSITIVE = 50
#: boosting rounds and leaves per tree of `mlfs train`'s predictor.  100 rounds of 15
#: leaves left the highest scores one tied block on sim.disks (recall 0.021 at SMART's
#: false-alarm rate); 200 of 31 split it (0.351 on the same rows, docs/results)
ROUNDS = 200
NUM_LEAVES = 31
#: rows a leaf needs in a fit on down-sampled negatives.  Such a fit sees one negative in
#: 1/r, so a leaf of LightGBM's usual 20 rows can hold a failure or two and a handful of
#: negatives that each stand for 1/r others: its score is extreme and the very top of the
#: ranking is noise (at 20, recall at SMART's false-alarm rate 0.351 against the offline
#: model's 0.397; at 5, 0.000).  At 100, 0.435 (docs/results/predict-sim-disks.md).  A fit on
#: every negative keeps 20: the offline model at 100 fell to 0.142
SAMPLED_LEAF_ROWS = 100

_NEVER = np.iinfo(np.int64).max
_LEAF_VALUE = re.compile(r"^leaf_value=(.*)$", re.M)


def label_rows(keys: np.ndarray, ticks: np.ndarray, events: np.ndarray,
               horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(label, usable): label 1 when the key's next event is 1..horizon ticks later.

    `usable` is False on the event's own row (it warns nobody).  Rows that are too close
    to the end of the data to know their outcome are the caller's to drop.
    """
    keys = np.asarray(keys)
    ticks = np.asarray(ticks, dtype=np.int64)
    events = np.asarray(events, dtype=bool)
    order = np.lexsort((ticks, keys))
    k, t = keys[order], ticks[order]
    pos = np.flatnonzero(events[order])
    nxt = np.full(len(order), _NEVER, dtype=np.int64)
    if len(pos):
        idx = np.searchsorted(pos, np.arange(len(order)), side="left")
        cand = pos[np.minimum(idx, len(pos) - 1)]
        nxt = np.where((idx < len(pos)) & (k[cand] == k), t[cand], _NEVER)
    gap = nxt - t
    label = (nxt != _NEVER) & (gap >= 1) & (gap <= horizon)
    usable = gap != 0
    out_label = np.empty(len(order), bool)
    out_usable = np.empty(len(order), bool)
    out_label[order] = label
    out_usable[order] = usable
    return out_label, out_usable


class EventLearner:
    """A calibrated LightGBM classifier on the named columns."""

    def __init__(self, features: list[str], negative_rate: float = 0.05, rounds: int = 150,
                 num_leaves: int = 15, seed: int = 0) -> None:
        if not 0.0 < negative_rate <= 1.0:
            raise ValueError("negative_rate must be in (0, 1]")
        self.features = list(features)
        self.negative_rate = negative_rate
        self.rounds = rounds
        self.num_leaves = num_leaves
        self.seed = seed
        self.booster: lgb.Booster | None = None
        self._text: str | None = None
        #: boosting rounds the last fit completed (fewer than `rounds`: cut at its deadline)
        self.trees = 0

    def _matrix(self, columns: dict[str, np.ndarray],
                rows: np.ndarray | None = None) -> np.ndarray:
        """The features of `rows` (all rows when None) as one float64 matrix.  Taking the
        rows before stacking matters: a fit keeps one row in 20 of a million, and the
        whole matrix took 12 s of the fit's 40 s on a 2-core machine."""
        return np.column_stack([np.asarray(columns[name] if rows is None
                                           else np.asarray(columns[name])[rows],
                                           dtype=np.float64)
                                for name in self.features])

    def fit(self, columns: dict[str, np.ndarray], label: np.ndarray,
            usable: np.ndarray | None = None, *, deadline: float | None = None
            ) -> EventLearner:
        """Fit on the usable rows: every positive, negatives down-sampled, then calibrate.
        With `deadline` (a `time.monotonic()` instant) boosting stops there, keeping the
        trees grown so far (`trees` < `rounds`: a fit cut short)."""
        label = np.asarray(label, dtype=bool)
        keep = np.ones(len(label), bool) if usable is None else np.asarray(usable, bool)
        rng = np.random.default_rng(self.seed)
        sampled = label | (rng.random(len(label)) < self.negative_rate)
        rows = np.flatnonzero(keep & sampled)
        x = self._matrix(columns, rows)
        y = label[rows].astype(np.float64)
        if y.sum() == 0 or y.sum() == len(y):
            raise ValueError("need both positive and negative rows to learn a predictor")
        data = lgb.Dataset(x, label=y, feature_name=self.features, params={"verbose": -1})
        params = dict(classifier_params(self.num_leaves, self.seed, self.negative_rate),
                      num_threads=1)
        callbacks = [stop_at(deadline)] if deadline is not None else None
        booster = lgb.train(params, data, num_boost_round=self.rounds, callbacks=callbacks)
        self.trees = booster.num_trees()
        self._text = calibrated(booster.model_to_string(), self.negative_rate)
        self.booster = lgb.Booster(model_str=self._text)
        return self

    def predict(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """Calibrated probabilities, one per row."""
        if self.booster is None:
            raise RuntimeError("fit first")
        return self.booster.predict(self._matrix(columns), num_threads=1)

    def policy_text(self) -> str:
        """The calibrated model as LightGBM text: what the proxy runs (binary objective)."""
        if self._text is None:
            raise RuntimeError("fit first")
        return self._text


def negative_rate(positives: int, negatives: int) -> float:
    """The down-sampling rate that keeps about NEGATIVES_PER_POSITIVE negatives a positive."""
    return min(1.0, NEGATIVES_PER_POSITIVE * positives / max(1, negatives))


def default_windows(columns: dict[str, np.ndarray], fields: list[str]) -> list[str]:
    """The window features the trainer adds to `fields` (mlfs.abi's grammar).

    A float field (a latency, a temperature) gets its mean over the last 7 and 30 rows:
    a level against the entity's own recent past.  An integer field that is zero on most
    rows (an error count, a SMART raw value) gets its means over 7 and 30 rows (the
    rate, and whether it accelerates), how many of the last 30 were above zero, and how
    long ago the first of the last 60 was: a degradation's extent, persistence and age.
    Booleans and other integers get none.
    """
    out: list[str] = []
    for name in fields:
        values = np.asarray(columns[name])
        if values.dtype == bool or not len(values):
            continue
        if values.dtype.kind == "f":
            out += [f"{name}__mean7", f"{name}__mean30"]
        elif values.dtype.kind in "iu" and (values == 0).mean() > 0.5:
            out += [f"{name}__mean7", f"{name}__mean30", f"{name}__pos30",
                    f"{name}__first60"]
    return out


def fit_predictor(columns: dict[str, np.ndarray], key: str, event: str, horizon: int,
                  fields: list[str], *, windows: list[str] | None = None, seed: int = 0,
                  rounds: int = ROUNDS, deadline: float | None = None
                  ) -> tuple[EventLearner | None, dict]:
    """What `mlfs train` fits for a predictor, from a record dataset's columns (with a
    `tick` column): labels, rows whose outcome is known, window features (`windows`, or
    `default_windows`), negatives down-sampled to NEGATIVES_PER_POSITIVE a positive,
    ROUNDS rounds of NUM_LEAVES leaves, calibrated.  Returns (learner, figures); the
    learner is None with fewer than MIN_POSITIVES positive rows.  `columns` gains the
    window features' arrays.  `deadline`: `EventLearner.fit`'s; figures["assembly_seconds"]:
    the time taken before boosting (a rate for the next fit's row budget)."""
    began = time.monotonic()
    ticks = np.asarray(columns["tick"], dtype=np.int64)
    label, usable = known_rows(columns, key, event, horizon)
    positives = int((label & usable).sum())
    figures = {"rows": int(usable.sum()), "positives": positives}
    if positives < MIN_POSITIVES or figures["rows"] == positives:
        return None, figures  # too few events, or no row old enough to be a known negative
    names = default_windows(columns, fields) if windows is None else list(windows)
    columns.update(window_features(columns[key], ticks, columns, names))
    rate = negative_rate(positives, figures["rows"] - positives)
    figures["assembly_seconds"] = time.monotonic() - began  # labels and windows; boosting next
    learner = EventLearner([*fields, *names], negative_rate=rate, rounds=rounds,
                           num_leaves=NUM_LEAVES, seed=seed)
    learner.fit(columns, label, usable, deadline=deadline)
    figures["negative_rate"] = rate
    figures["trees"] = learner.trees
    return learner, figures


#: positive rows before a first fit
MIN_POSITIVES = 20
#: the newest share of a host's labelled rows (by tick) on which a fleet predictor and the
#: host's own are judged (`challenge`)
CHALLENGE_HOLDOUT = 0.2


def known_rows(columns: dict[str, np.ndarray], key: str, event: str, horizon: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(label, usable) of `label_rows`, usable only where the outcome is known: a positive,
    or a row at least `horizon` ticks older than the newest (no event yet is no answer)."""
    ticks = np.asarray(columns["tick"], dtype=np.int64)
    label, usable = label_rows(columns[key], ticks, columns[event], horizon)
    usable &= label | (ticks <= ticks.max() - horizon)
    return label, usable


def log_loss(p: np.ndarray, label: np.ndarray) -> float:
    """Mean negative log-likelihood of the labels under the probabilities (clipped)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(label, dtype=bool)
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p))))


def policy_probabilities(text: str, columns: dict[str, np.ndarray], key: str) -> np.ndarray:
    """A predictor policy's probability for every row, its window features computed from
    each entity's rows (the rule the proxy runs, `mlfs.abi.window_features`)."""
    booster = lgb.Booster(model_str=text)
    names = list(booster.feature_name())
    missing = [n for n in names if n not in columns and window_feature(n) is None]
    if missing:
        raise ValueError(f"the policy reads columns these rows lack: {missing}")
    cols = dict(columns)
    cols.update(window_features(cols[key], cols["tick"], cols,
                                [n for n in names if n not in columns]))
    matrix = np.column_stack([np.asarray(cols[n], dtype=np.float64) for n in names])
    return booster.predict(matrix, num_threads=1)


def challenge(prior: str, columns: dict[str, np.ndarray], key: str, event: str,
              horizon: int, fields: list[str], *, seed: int = 0,
              deadline: float | None = None) -> dict:
    """A fleet predictor (`prior`, its policy text) against the host's own, on the host's rows.

    A prior is worth what it predicts here.  The host's own candidate is fitted on the
    older rows only (`fit_predictor`, as `mlfs train` fits); both predict the newest
    CHALLENGE_HOLDOUT of the rows whose outcome is known, and the lower log loss wins.
    `chosen` is "prior" while the host has too few positive rows of its own to fit a
    candidate on the older rows, or none among the newest to judge by (a prior that never
    alerts would otherwise win on quiet weeks); then "local" only on a lower loss.
    """
    ticks = np.asarray(columns["tick"], dtype=np.int64)
    label, usable = known_rows(columns, key, event, horizon)
    out: dict = {"chosen": "prior", "rows": int(usable.sum())}
    if not usable.any():
        return out | {"why": "no row whose outcome is known"}
    cut = int(np.quantile(ticks[usable], 1.0 - CHALLENGE_HOLDOUT))
    newest = usable & (ticks > cut)
    out["holdout_rows"] = int(newest.sum())
    out["holdout_positives"] = int((label & newest).sum())
    if not out["holdout_positives"]:
        return out | {"why": "no positive row (an event within the horizon) among the "
                             "newest rows to judge by"}
    older = {name: np.asarray(values)[ticks <= cut] for name, values in columns.items()}
    local, figures = fit_predictor(older, key, event, horizon, fields, seed=seed,
                                   deadline=deadline)
    if local is None:
        return out | {"why": f"{figures['positives']} positive rows of its own among the "
                             f"older ones, under {MIN_POSITIVES}"}
    cols = dict(columns)
    cols.update(window_features(cols[key], ticks, cols, local.features[len(fields):]))
    judged = {name: np.asarray(values)[newest] for name, values in cols.items()}
    out["prior_log_loss"] = log_loss(policy_probabilities(prior, columns, key)[newest],
                                     label[newest])
    out["local_log_loss"] = log_loss(local.predict(judged), label[newest])
    if out["local_log_loss"] < out["prior_log_loss"]:
        out["chosen"] = "local"
    out["why"] = (f"log loss on the newest {out['holdout_rows']} rows "
                  f"({out['holdout_positives']} positive): prior {out['prior_log_loss']:.5f}, "
                  f"this host's own {out['local_log_loss']:.5f}")
    return out


def classifier_params(num_leaves: int = 15, seed: int = 0, negative_rate: float = 1.0) -> dict:
    """LightGBM's parameters for a predictor (the fleet trainer fits with the same); a fit
    on negatives down-sampled at `negative_rate` < 1 gets leaves of SAMPLED_LEAF_ROWS."""
    leaf_rows = SAMPLED_LEAF_ROWS if negative_rate < 1.0 else 20
    return {"objective": "binary", "verbose": -1, "num_leaves": num_leaves,
            "learning_rate": 0.05, "min_data_in_leaf": leaf_rows, "feature_fraction": 0.9,
            "bagging_fraction": 0.9, "bagging_freq": 1, "seed": seed, "deterministic": True}


def calibrated(text: str, negative_rate: float) -> str:
    """A binary model fitted on negatives down-sampled at `negative_rate`, with its log-odds
    corrected in the first tree (ln r added to every leaf): true probabilities."""
    return _shift_first_tree(text, math.log(negative_rate))


def calibration(p: np.ndarray, label: np.ndarray, bins: int = 10) -> list[tuple[float, float, int]]:
    """(mean predicted, observed rate, rows) per quantile bin of `p`."""
    p = np.asarray(p, dtype=float)
    label = np.asarray(label, dtype=float)
    edges = np.unique(np.quantile(p, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
    out = []
    for b in range(len(edges) - 1):
        sel = which == b
        if sel.any():
            out.append((float(p[sel].mean()), float(label[sel].mean()), int(sel.sum())))
    return out


def _shift_first_tree(text: str, shift: float) -> str:
    """`text` with `shift` added to every leaf of Tree=0 (a constant raw-score offset)."""
    start = text.index("Tree=0\n")
    end = text.index("\n\n", start)
    block = text[start:end]
    match = _LEAF_VALUE.search(block)
    if match is None:
        raise ValueError("Tree=0 has no leaf_value line")
    values = [float(v) + shift for v in match.group(1).split()]
    line = "leaf_value=" + " ".join(repr(v) for v in values)
    block = block[:match.start()] + line + block[match.end():]
    # tree_sizes in the header give each tree's byte length: recompute them
    new = text[:start] + block + text[end:]
    return _fix_tree_sizes(new)


def _fix_tree_sizes(text: str) -> str:
    """tree_sizes recomputed the way LightGBM writes them (bytes from Tree= to Tree=)."""
    starts = [m.start() for m in re.finditer(r"^Tree=\d+$", text, re.M)]
    end = text.find("\nend of trees") + 1
    sizes = [b - a for a, b in zip(starts, starts[1:] + [end], strict=True)]
    return re.sub(r"^tree_sizes=.*$", "tree_sizes=" + " ".join(map(str, sizes)), text,
                  count=1, flags=re.M)
