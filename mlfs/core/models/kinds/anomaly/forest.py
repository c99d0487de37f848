"""An anomaly model's policy: an isolation forest as bounded JSON, verified, scored in numpy.

A trainer uploads its fitted forest (scikit-learn's `IsolationForest`) into the model's
`policy`.  The upload is untrusted, so it is never a pickle (unpickling runs code):
it is JSON arrays per tree, read strictly here before anything is scored, in the way
`mlfs.base.verifier` reads LightGBM text and the kernel's BPF verifier reads a program:
every node is visited once, every index and number checked, size and depth bounded,
and anything else refused with EINVAL and a reason naming the tree, node and field.

The format (`FORMAT`, version 1), one JSON object, ASCII, no other keys::

    {"format": "mlfs.isolation_forest", "version": 1,
     "features": ["smart_5_raw", ...],       # record columns, in the order `feature` indexes
     "samples": 256,                          # the subsample each tree was grown on
     "alert_score": 0.62,                     # score at or above which a row is an anomaly
     "trees": [{"feature":   [0, -1, ...],    # split column per node; -1 on a leaf
                "threshold": [3.5, 0, ...],   # go left when value <= threshold
                "left":      [1, -1, ...],    # children; -1 on a leaf; always > the node
                "right":     [2, -1, ...],
                "size":      [256, 17, ...]}, # training rows per node (a leaf's: its c(n))
               ...]}

The score of a row is the paper's (Liu, Ting, Zhou 2008) and scikit-learn's:
``2 ** (-mean path length / c(samples))``, a path's length being the edges from the
root to its leaf plus ``c(leaf size)``, the average path length of an unsuccessful
search in a binary search tree of that many rows.  It lies in (0, 1]; scikit-learn's
`score_samples` is its negative.  As scikit-learn's trees do, values are compared as
float32 (tests/unit/test_anomaly_forest.py pins equality with `score_samples`).  A
missing value (NaN) goes right at every split.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from mlfs.base.errors import invalid

FORMAT = "mlfs.isolation_forest"
VERSION = 1
KEYS = {"format", "version", "features", "samples", "alert_score", "trees"}
TREE_KEYS = ("feature", "threshold", "left", "right", "size")

# Bounds.  What trainers/anomaly/learner.py produces: 100 trees grown on 256 rows, so at
# most 511 nodes and a depth of 8 (scikit-learn's ceil(log2(samples))), ~0.6 MB of JSON.
# The bounds leave a factor of 4 or more for a trainer of one's own, while one tick's
# scoring stays small (MAX_SCORE_STEPS).
MAX_FOREST_BYTES = 8 << 20
MAX_TREES = 1000
MAX_NODES = 8191  # per tree: 4096 leaves
MAX_TOTAL_NODES = 1_000_000
MAX_DEPTH = 32  # edges from the root to a leaf
MAX_SAMPLES = 1 << 20
MAX_FEATURES = 256
MAX_NAME = 128
#: node steps (rows x trees x depth) one tick may take; rows past it are not scored
#: (NaN: no anomaly, counted).  A step is a few vectorised numpy operations: ~4 ns.
MAX_SCORE_STEPS = 32_000_000
#: rows scored per numpy pass (a rows x trees index matrix: 4096 x 1000 x 8 B = 32 MB)
CHUNK_ROWS = 4096


def average_path_length(size: np.ndarray | float) -> np.ndarray:
    """c(n): the average path length of an unsuccessful search among n rows (0 for n <= 1,
    1 for n = 2), as the paper and scikit-learn define it."""
    n = np.asarray(size, dtype=np.float64)
    out = np.zeros_like(n)
    out[n == 2] = 1.0
    big = n > 2
    out[big] = 2.0 * (np.log(n[big] - 1.0) + np.euler_gamma) - 2.0 * (n[big] - 1.0) / n[big]
    return out


@dataclass(frozen=True)
class Verified:
    """A forest the verifier accepted: flat node arrays over all trees, ready to score."""

    features: tuple[str, ...]
    samples: int
    alert_score: float
    trees: int
    depth: int  # the deepest path over all trees
    roots: np.ndarray  # int64, the first node of each tree in the flat arrays
    feature: np.ndarray  # int64 per node; 0 on leaves (never read there)
    threshold: np.ndarray  # float64 per node
    left: np.ndarray  # int64 per node, flat index; the node itself on a leaf
    right: np.ndarray
    leaf_path: np.ndarray  # float64 per node: depth + c(size) on a leaf, 0 elsewhere
    normaliser: float  # trees x c(samples)


def _refuse_constant(name: str):
    raise invalid(f"forest: {name} is not a number JSON allows here")


def _int_list(value, where: str, count: int | None = None) -> list[int]:
    if not isinstance(value, list) or (count is not None and len(value) != count):
        need = "a list" if count is None else f"a list of {count} numbers"
        raise invalid(f"forest: {where} is not {need}")
    for i, item in enumerate(value):
        if type(item) is not int:
            raise invalid(f"forest: {where}[{i}] is not an integer")
    return value


def verify_forest(text: bytes) -> Verified:
    """Read `text` strictly; Refused (EINVAL) with the first broken rule."""
    if len(text) > MAX_FOREST_BYTES:
        raise invalid(f"forest over {MAX_FOREST_BYTES} bytes")
    try:
        decoded = text.decode("ascii")
    except UnicodeDecodeError:
        raise invalid("forest is not ASCII (JSON with \\u escapes)") from None
    try:
        doc = json.loads(decoded, parse_constant=_refuse_constant)
    except RecursionError:
        raise invalid("forest: JSON nested too deeply") from None
    except ValueError as exc:  # (NaN and Infinity are refused by _refuse_constant)
        raise invalid(f"forest is not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise invalid("forest is not a JSON object")
    if set(doc) != KEYS:
        missing, extra = sorted(KEYS - set(doc)), sorted(set(doc) - KEYS)
        raise invalid(f"forest keys: missing {missing}, unknown {extra}" if missing
                      else f"forest: unknown key {extra[0]!r}")
    if doc["format"] != FORMAT or doc["version"] != VERSION:
        raise invalid(f"forest: format must be {FORMAT!r} version {VERSION}")
    features = doc["features"]
    if (not isinstance(features, list) or not 1 <= len(features) <= MAX_FEATURES
            or not all(isinstance(f, str) and 0 < len(f) <= MAX_NAME for f in features)):
        raise invalid(f"forest: features must be 1..{MAX_FEATURES} names of 1..{MAX_NAME} "
                      "characters")
    if len(set(features)) != len(features):
        raise invalid("forest: a feature is named twice")
    samples = doc["samples"]
    if type(samples) is not int or not 2 <= samples <= MAX_SAMPLES:
        raise invalid(f"forest: samples must be an integer in 2..{MAX_SAMPLES}")
    alert = doc["alert_score"]
    if type(alert) not in (int, float) or not 0.0 < alert <= 1.0:
        raise invalid("forest: alert_score must be a number in (0, 1]")
    trees = doc["trees"]
    if not isinstance(trees, list) or not 1 <= len(trees) <= MAX_TREES:
        raise invalid(f"forest: trees must be a list of 1..{MAX_TREES}")
    parts = []
    total = 0
    for t, tree in enumerate(trees):
        parts.append(_tree(tree, t, len(features), samples))
        total += len(parts[-1][0])
        if total > MAX_TOTAL_NODES:
            raise invalid(f"forest: over {MAX_TOTAL_NODES} nodes in all")
    return _flatten(tuple(features), samples, float(alert), parts)


def _tree(tree, t: int, n_features: int, samples: int):
    """One tree's arrays, checked: (feature, threshold, left, right, size, depth)."""
    if not isinstance(tree, dict) or set(tree) != set(TREE_KEYS):
        raise invalid(f"forest: tree {t} must have exactly the keys {', '.join(TREE_KEYS)}")
    left = tree["left"]
    if not isinstance(left, list) or not 1 <= len(left) <= MAX_NODES:
        raise invalid(f"forest: tree {t} has 0 or over {MAX_NODES} nodes")
    n = len(left)
    feature = _int_list(tree["feature"], f"tree {t} feature", n)
    left = _int_list(left, f"tree {t} left", n)
    right = _int_list(tree["right"], f"tree {t} right", n)
    size = _int_list(tree["size"], f"tree {t} size", n)
    threshold = tree["threshold"]
    if not isinstance(threshold, list) or len(threshold) != n:
        raise invalid(f"forest: tree {t} threshold is not a list of {n} numbers")
    parent = [-1] * n
    depth = [0] * n
    deepest = 0
    for i in range(n):
        where = f"tree {t} node {i}"
        value = threshold[i]
        if type(value) not in (int, float) or not math.isfinite(value):
            raise invalid(f"forest: {where} threshold is not a finite number")
        if not 1 <= size[i] <= samples:
            raise invalid(f"forest: {where} size {size[i]} is not in 1..samples")
        if i and parent[i] < 0:
            raise invalid(f"forest: {where} is no node's child (every node but the root "
                          "is one node's child, after it)")
        if left[i] == -1 and right[i] == -1:
            if feature[i] != -1:
                raise invalid(f"forest: {where} is a leaf with feature {feature[i]} (use -1)")
            continue
        if not 0 <= feature[i] < n_features:
            raise invalid(f"forest: {where} feature {feature[i]} is not in "
                          f"0..{n_features - 1}")
        for side, child in (("left", left[i]), ("right", right[i])):
            if not i < child < n:
                raise invalid(f"forest: {where} {side} child {child} is not after it and "
                              "inside the tree")
            if parent[child] >= 0:
                raise invalid(f"forest: {where} {side} child {child} has two parents")
            parent[child] = i
            depth[child] = depth[i] + 1
        if depth[i] + 1 > MAX_DEPTH:
            raise invalid(f"forest: tree {t} deeper than {MAX_DEPTH}")
        deepest = max(deepest, depth[i] + 1)
        if size[left[i]] + size[right[i]] != size[i]:
            raise invalid(f"forest: {where} size is not its children's sum")
    return feature, threshold, left, right, size, depth, deepest


def _flatten(features: tuple[str, ...], samples: int, alert: float, parts) -> Verified:
    """All trees in one set of arrays, children as flat indices (a leaf points at itself,
    so a row that reached its leaf stays there while deeper trees finish)."""
    roots, offset = [], 0
    cols: dict[str, list] = {"feature": [], "threshold": [], "left": [], "right": [],
                             "leaf_path": []}
    deepest = 0
    for feature, threshold, left, right, size, depth, tree_depth in parts:
        n = len(left)
        roots.append(offset)
        leaf = np.asarray(left) == -1
        index = np.arange(offset, offset + n)
        cols["feature"].append(np.where(leaf, 0, feature))
        cols["threshold"].append(np.asarray(threshold, dtype=np.float64))
        cols["left"].append(np.where(leaf, index, np.asarray(left) + offset))
        cols["right"].append(np.where(leaf, index, np.asarray(right) + offset))
        cols["leaf_path"].append(np.where(leaf, np.asarray(depth, dtype=np.float64)
                                          + average_path_length(np.asarray(size)), 0.0))
        deepest = max(deepest, tree_depth)
        offset += n
    flat = {k: np.concatenate(v) for k, v in cols.items()}
    return Verified(features, samples, alert, len(parts), deepest,
                    np.asarray(roots, dtype=np.int64), flat["feature"].astype(np.int64),
                    flat["threshold"], flat["left"].astype(np.int64),
                    flat["right"].astype(np.int64), flat["leaf_path"],
                    len(parts) * float(average_path_length(samples)))


def score(forest: Verified, matrix: np.ndarray) -> np.ndarray:
    """The anomaly score in (0, 1] of each row of `matrix` (columns in `forest.features`
    order): every row descends every tree at once, `depth` steps, in chunks of rows."""
    x = np.asarray(matrix, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != len(forest.features):
        raise ValueError(f"a matrix of {len(forest.features)} columns is needed")
    out = np.empty(len(x))
    for start in range(0, len(x), CHUNK_ROWS):
        chunk = x[start:start + CHUNK_ROWS]
        rows = np.arange(len(chunk))[:, None]
        node = np.broadcast_to(forest.roots, (len(chunk), forest.trees)).copy()
        for _ in range(forest.depth):
            # float32 values against float64 thresholds, as scikit-learn's trees compare
            goes_left = chunk[rows, forest.feature[node]] <= forest.threshold[node]
            node = np.where(goes_left, forest.left[node], forest.right[node])
        paths = forest.leaf_path[node].sum(axis=1)
        out[start:start + len(chunk)] = (np.exp2(-paths / forest.normaliser)
                                         if forest.normaliser > 0 else 1.0)
    return out


def max_rows(forest: Verified) -> int:
    """Rows one tick may score within MAX_SCORE_STEPS."""
    return max(1, MAX_SCORE_STEPS // max(1, forest.trees * max(1, forest.depth)))


__all__ = ["FORMAT", "VERSION", "Verified", "average_path_length", "max_rows", "score",
           "verify_forest"]
