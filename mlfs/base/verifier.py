"""The policy verifier: a strict reading of LightGBM's text model format.

A policy is untrusted text that the daemon will hand to lib_lightgbm, a C++
library that trusts its input: its loader (`GBDT::LoadModelFromString`,
`Tree::Tree(const char*, size_t*)`) reads arrays without checking their
length, jumps to byte offsets taken from `tree_sizes`, and its predictor
follows child pointers and indexes the feature row with `split_feature`
without a bound.  A feature index out of range segfaults the daemon, a child
pointer back to an ancestor spins forever, a truncated text aborts the
process from inside an OpenMP region.

So, as the kernel's BPF verifier does for a program, `verify` reads the whole
text itself before LightGBM ever sees it, walks every node of every tree
exactly once, checks every index and every number, bounds size and depth, and
refuses anything else with a reason that names the line, tree, node and field.
What it accepts is a subset of what LightGBM writes (`model_to_string`):
numerical splits only (no categorical, no linear trees), one output (a
regression objective, or LightGBM's `binary` objective for a predictor, whose
output is a probability), `\\n` line ends.  A prediction over an accepted text
visits at most `depth` nodes per tree, all in range, so its time is bounded
by construction (`VerifiedModel.path_sum` nodes per row).

The rules and bounds are written out for operators in docs/policy-verifier.md.
Pure Python, no numpy or LightGBM here: the check subprocess imports it first.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from mlfs.base.errors import invalid

MAX_POLICY_BYTES = 16 << 20

# Bounds.  What trainers/knob/learner.py produces (measured with
# tests/unit/test_verifier.py::test_every_policy_our_trainer_produces_verifies):
# 150 trees from a fit, at most 600 after corrections (its `max_trees`), 15
# leaves per tree (7 for correction trees), so a depth of at most 14, about
# 9,000 leaves and a path sum (the nodes one row visits) of at most 8,400.
# The bounds leave a factor of 3 or more on each for a trainer of one's own
# (more rounds, num_leaves up to 1024) while keeping the worst prediction
# small: MAX_PATH_SUM nodes per candidate row.
MAX_TREES = 2000
MAX_LEAVES = 1024  # per tree
MAX_TOTAL_LEAVES = 250_000  # about 25 MB of parsed arrays in LightGBM at most
MAX_DEPTH = 48  # internal nodes on one root-to-leaf path
MAX_PATH_SUM = 30_000  # sum over trees of the deepest path: the worst nodes per row
MAX_FEATURES = 4096

HEADER_KEYS = {"version", "num_class", "num_tree_per_iteration", "label_index",
               "max_feature_idx", "objective", "average_output", "feature_names",
               "monotone_constraints", "feature_infos", "tree_sizes"}
HEADER_REQUIRED = ("version", "num_class", "label_index", "max_feature_idx", "objective",
                   "feature_names", "feature_infos")
VERSIONS = ("v3", "v4")
# one output per row, a number in the objective's units: the regression family
OBJECTIVES = {"regression", "regression_l1", "huber", "fair", "poisson", "quantile", "mape",
              "gamma", "tweedie"}
# one output per row, a probability: a predictor's policy (LightGBM's `binary sigmoid:S`,
# the raw score passed through 1/(1+exp(-S*x)); calibration lives in the trees)
PROBABILITY_OBJECTIVES = {"binary"}
# the sigmoid's slope: LightGBM writes 1; anything outside (0, 100] is not a probability model
MAX_SIGMOID = 100.0

LEAF_ARRAYS = ("leaf_value", "leaf_weight", "leaf_count")  # num_leaves values
NODE_ARRAYS = ("split_feature", "split_gain", "threshold", "decision_type", "left_child",
               "right_child", "internal_value", "internal_weight", "internal_count")
TREE_KEYS = {"num_leaves", "num_cat", "is_linear", "shrinkage", *LEAF_ARRAYS, *NODE_ARRAYS}
TREE_REQUIRED = ("num_leaves", "num_cat", "leaf_value")
SPLIT_REQUIRED = ("split_feature", "threshold", "left_child", "right_child")
CATEGORICAL_KEYS = {"cat_boundaries", "cat_threshold"}
LINEAR_KEYS = {"leaf_const", "num_features", "leaf_features", "leaf_coeff"}
INT_ARRAYS = {"split_feature", "decision_type", "left_child", "right_child", "leaf_count",
              "internal_count"}
# read by the predictor: must be finite; the rest is bookkeeping (gain, weights)
FINITE_ARRAYS = {"threshold", "leaf_value"}

# decision_type bits: 1 categorical (refused), 2 default-left, 4..8 missing type
# (0 none, 1 zero, 2 nan; 3 is not a type).  So: 0 2 4 6 8 10.
DECISION_TYPES = frozenset(d for d in range(16) if not d & 1 and (d >> 2) & 3 != 3)

INT32 = 1 << 31
_INT = re.compile(r"-?[0-9]{1,10}\Z")
_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]{1,4})?\Z")
_SPECIAL = {"inf", "-inf", "+inf", "nan", "-nan"}
_TEXT = re.compile(rb"[\x20-\x7e\n]*\Z")
_NAME = re.compile(r"[^\s=\[\]:]{1,256}\Z")
_INFO = re.compile(r"none\Z|\[[^\[\]:\s]+:[^\[\]:\s]+\]\Z")
_PARAMETER = re.compile(r"\[[a-z0-9_]+: [^\n]*\]\Z")
_IMPORTANCE = re.compile(r"[^\s=]+=[0-9]+\Z")


@dataclass(frozen=True)
class VerifiedModel:
    """What the verifier learnt about an accepted policy."""

    feature_names: tuple[str, ...]
    objective: str
    trees: int
    leaves: int  # over all trees
    max_depth: int  # the deepest root-to-leaf path of any tree (internal nodes)
    path_sum: int  # sum of each tree's deepest path: the most nodes one prediction visits


class _Lines:
    """The text's lines with their byte offsets, read front to back."""

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self.offsets = [0] * len(self.lines)
        offset = 0
        for i, line in enumerate(self.lines):
            self.offsets[i] = offset
            offset += len(line) + 1
        self.i = 0

    def peek(self) -> str | None:
        return self.lines[self.i] if self.i < len(self.lines) else None

    def take(self, missing: str = "'end of trees'") -> str:
        line = self.peek()
        if line is None:
            raise invalid(f"policy ends early (truncated?): no {missing} line")
        self.i += 1
        return line

    def skip_blank(self) -> None:
        while self.peek() == "":
            self.i += 1

    @property
    def number(self) -> int:
        """1-based number of the line last taken."""
        return self.i


def _int(token: str, where: str) -> int:
    if not _INT.match(token):
        raise invalid(f"{where}={token[:40]!r} is not an integer")
    value = int(token)
    if not -INT32 <= value < INT32:
        raise invalid(f"{where}={token[:40]} is out of the 32-bit range")
    return value


def _float(token: str, where: str, finite: bool) -> float:
    if not _FLOAT.match(token):
        if finite or token not in _SPECIAL:
            raise invalid(f"{where}={token[:40]!r} is not a number")
        return math.nan
    value = float(token)
    if finite and not math.isfinite(value):
        raise invalid(f"{where}={token[:40]} is not finite")
    return value


def _tokens(value: str, where: str) -> list[str]:
    """Values separated by single spaces (LightGBM's own separator), none empty."""
    if value == "":
        return []
    tokens = value.split(" ")
    if "" in tokens:
        raise invalid(f"{where}: empty value (doubled or trailing space)")
    return tokens


def _array(value: str, where: str, expected: int, leaves: int, integers: bool,
           finite: bool) -> list:
    """A field of `expected` numbers.

    The common case is checked in C (a character set, then int/float on each
    token); only a failure goes token by token, to name the culprit.  (A
    regular expression over a 16 MiB line took 30 s, measured.)
    """
    tokens = _tokens(value, where)
    if len(tokens) != expected:
        raise invalid(f"{where} has {len(tokens)} values, num_leaves={leaves} needs {expected}")
    try:
        if integers:
            if value.strip("0123456789- "):
                raise ValueError
            numbers = list(map(int, tokens))
            if numbers and not -INT32 <= min(numbers) <= max(numbers) < INT32:
                raise ValueError
            return numbers
        if value.strip("0123456789.eE+- "):
            raise ValueError
        numbers = list(map(float, tokens))
        if finite and not all(map(math.isfinite, numbers)):
            raise ValueError
        return numbers
    except ValueError:
        pass
    for i, token in enumerate(tokens):
        if integers:
            _int(token, f"{where}[{i}]")
        else:
            _float(token, f"{where}[{i}]", finite)
    return [float(t) for t in tokens]  # only bookkeeping arrays with inf/nan get here


def _key_value(line: str, where: str) -> tuple[str, str]:
    key, sep, value = line.partition("=")
    if not sep:
        raise invalid(f"{where}: {line[:60]!r} is not key=value")
    if "=" in value:
        raise invalid(f"{where}: {line[:60]!r} has more than one '='")
    return key, value


def verify(data: bytes | str) -> VerifiedModel:
    """Read a LightGBM text model strictly; return what it is, or raise Refused."""
    if isinstance(data, str):
        data = data.encode("utf-8", errors="replace")
    if len(data) > MAX_POLICY_BYTES:
        raise invalid(f"policy of {len(data)} bytes is over {MAX_POLICY_BYTES}")
    if not _TEXT.match(data):
        bad = next(i for i, b in enumerate(data) if not (0x20 <= b <= 0x7E or b == 0x0A))
        raise invalid(f"policy byte {bad} (0x{data[bad]:02x}) is not printable ASCII "
                      "(LightGBM text format, \\n line ends)")
    if not data.endswith(b"\n"):
        raise invalid("policy does not end with a newline (truncated?)")
    lines = _Lines(data.decode("ascii"))
    header = _header(lines)
    names = header["feature_names"]
    trees, starts = [], []
    while (line := lines.peek()) is not None and line.startswith("Tree="):
        starts.append(lines.offsets[lines.i])
        index = len(trees)
        if line != f"Tree={index}":
            raise invalid(f"line {lines.i + 1}: {line[:40]!r}, expected 'Tree={index}'")
        if index >= MAX_TREES:
            raise invalid(f"policy has more than {MAX_TREES} trees")
        lines.take()
        trees.append(_tree(lines, index, len(names)))
        lines.skip_blank()
    if lines.peek() != "end of trees":
        if lines.peek() is None:
            raise invalid("policy ends early (truncated?): no 'end of trees' line")
        raise invalid(f"line {lines.i + 1}: {lines.peek()[:40]!r}, expected 'Tree={len(trees)}' "
                      "or 'end of trees'")
    if not trees:
        raise invalid("policy has no trees")
    starts.append(lines.offsets[lines.i])
    lines.take()
    _check_tree_sizes(header.get("tree_sizes"), starts)
    _trailer(lines)
    leaves = sum(t[0] for t in trees)
    if leaves > MAX_TOTAL_LEAVES:
        raise invalid(f"policy has {leaves} leaves in all, over {MAX_TOTAL_LEAVES}")
    path_sum = sum(t[1] for t in trees)
    if path_sum > MAX_PATH_SUM:
        raise invalid(f"a prediction may visit {path_sum} nodes (sum of tree depths), "
                      f"over {MAX_PATH_SUM}")
    return VerifiedModel(tuple(names), header["objective"], len(trees), leaves,
                         max(t[1] for t in trees), path_sum)


def _header(lines: _Lines) -> dict:
    if lines.take() != "tree":
        raise invalid("line 1: not a LightGBM text model (expected 'tree')")
    raw: dict[str, str] = {}
    while (line := lines.take()) != "":
        where = f"line {lines.number}"
        if line == "average_output":
            key, value = line, ""
        else:
            key, value = _key_value(line, where)
        if key not in HEADER_KEYS:
            raise invalid(f"{where}: unknown header field {key[:40]!r}")
        if key in raw:
            raise invalid(f"{where}: header field {key!r} given twice")
        raw[key] = value
    for key in HEADER_REQUIRED:
        if key not in raw:
            raise invalid(f"header: field {key!r} is missing")
    lines.skip_blank()
    header: dict = {}
    if raw["version"] not in VERSIONS:
        raise invalid(f"header: version={raw['version'][:20]!r} is not one of {VERSIONS}")
    if _int(raw["num_class"], "header: num_class") != 1:
        raise invalid(f"header: num_class={raw['num_class']}, a policy has one output (1)")
    if _int(raw.get("num_tree_per_iteration", "1"), "header: num_tree_per_iteration") != 1:
        raise invalid("header: num_tree_per_iteration must be 1")
    if _int(raw["label_index"], "header: label_index") < 0:
        raise invalid("header: label_index is negative")
    max_feature_idx = _int(raw["max_feature_idx"], "header: max_feature_idx")
    if not 0 <= max_feature_idx < MAX_FEATURES:
        raise invalid(f"header: max_feature_idx={max_feature_idx} is not in "
                      f"0..{MAX_FEATURES - 1}")
    count = max_feature_idx + 1
    names = _tokens(raw["feature_names"], "header: feature_names")
    if len(names) != count:
        raise invalid(f"header: feature_names has {len(names)} names, max_feature_idx="
                      f"{max_feature_idx} declares {count}")
    for name in names:
        if not _NAME.match(name):
            raise invalid(f"header: feature name {name[:40]!r} is not a column name")
    if len(set(names)) != len(names):
        raise invalid("header: a feature name is given twice")
    header["feature_names"] = names
    infos = _tokens(raw["feature_infos"], "header: feature_infos")
    if len(infos) != count:
        raise invalid(f"header: feature_infos has {len(infos)} entries, not {count}")
    for info in infos:
        if not _INFO.match(info):
            raise invalid(f"header: feature_infos entry {info[:40]!r} is neither 'none' nor "
                          "[min:max] (categorical features are not supported)")
    if "monotone_constraints" in raw:
        signs = _tokens(raw["monotone_constraints"], "header: monotone_constraints")
        if len(signs) != count or any(s not in ("-1", "0", "1") for s in signs):
            raise invalid(f"header: monotone_constraints must be {count} values of -1, 0, 1")
    header["objective"] = _objective(raw["objective"])
    if "tree_sizes" in raw:
        header["tree_sizes"] = [_int(t, "header: tree_sizes")
                                for t in _tokens(raw["tree_sizes"], "header: tree_sizes")]
    return header


def _objective(value: str) -> str:
    words = _tokens(value, "header: objective")
    known = OBJECTIVES | PROBABILITY_OBJECTIVES
    if not words or words[0] not in known:
        raise invalid(f"header: objective={value[:40]!r} is neither a regression objective nor "
                      f"binary ({' '.join(sorted(known))})")
    for word in words[1:]:
        key, sep, number = word.partition(":")
        if not re.fullmatch(r"[a-z_]+", key) or (sep and not _FLOAT.match(number)) or (
                not sep and word != "sqrt"):
            raise invalid(f"header: objective parameter {word[:40]!r} is not key:number")
        if words[0] in PROBABILITY_OBJECTIVES and key != "sigmoid":
            raise invalid(f"header: binary objective parameter {key[:40]!r} is not sigmoid")
        if key == "sigmoid" and not 0.0 < float(number) <= MAX_SIGMOID:
            raise invalid(f"header: sigmoid:{number[:20]} is outside (0, {MAX_SIGMOID:g}]")
    return words[0]


def gives_probability(model: VerifiedModel) -> bool:
    """True when the policy's output is a probability (a predictor's), not an objective value."""
    return model.objective in PROBABILITY_OBJECTIVES


def _tree(lines: _Lines, index: int, features: int) -> tuple[int, int]:
    """One `Tree=` block: its fields, then the walk. Returns (leaves, depth)."""
    tag = f"tree {index}"
    fields: dict[str, str] = {}
    while (line := lines.take()) != "":
        where = f"line {lines.number} ({tag})"
        key, value = _key_value(line, where)
        if key in CATEGORICAL_KEYS:
            raise invalid(f"{tag}: {key}: categorical splits are not supported")
        if key in LINEAR_KEYS:
            raise invalid(f"{tag}: {key}: linear trees are not supported")
        if key not in TREE_KEYS:
            raise invalid(f"{where}: unknown tree field {key[:40]!r}")
        if key in fields:
            raise invalid(f"{where}: field {key!r} given twice")
        fields[key] = value
    for key in TREE_REQUIRED:
        if key not in fields:
            raise invalid(f"{tag}: field {key!r} is missing")
    leaves = _int(fields["num_leaves"], f"{tag}: num_leaves")
    if not 1 <= leaves <= MAX_LEAVES:
        raise invalid(f"{tag}: num_leaves={leaves} is not in 1..{MAX_LEAVES}")
    if _int(fields["num_cat"], f"{tag}: num_cat") != 0:
        raise invalid(f"{tag}: num_cat={fields['num_cat']}: categorical splits are not "
                      "supported")
    if _int(fields.get("is_linear", "0"), f"{tag}: is_linear") != 0:
        raise invalid(f"{tag}: is_linear={fields['is_linear']}: linear trees are not supported")
    if "shrinkage" in fields:
        _float(fields["shrinkage"], f"{tag}: shrinkage", finite=True)
    if leaves > 1:
        for key in SPLIT_REQUIRED:
            if key not in fields:
                raise invalid(f"{tag}: field {key!r} is missing")
    arrays: dict[str, list] = {}
    for key, value in fields.items():
        if key in LEAF_ARRAYS:
            expected = leaves
            if leaves == 1 and key == "leaf_weight" and value == "":
                continue  # LightGBM writes a one-leaf tree's weight empty, and never reads it
        elif key in NODE_ARRAYS:
            expected = leaves - 1
        else:
            continue
        arrays[key] = _array(value, f"{tag}: {key}", expected, leaves, key in INT_ARRAYS,
                             key in FINITE_ARRAYS)
    if leaves == 1:
        return 1, 0
    for node, feature in enumerate(arrays["split_feature"]):
        if not 0 <= feature < features:
            raise invalid(f"{tag}: split_feature[{node}]={feature} is not below the {features} "
                          "declared features")
    for node, kind in enumerate(arrays.get("decision_type", ())):
        if kind not in DECISION_TYPES:
            raise invalid(f"{tag}: decision_type[{node}]={kind} is not a numerical split "
                          f"({' '.join(map(str, sorted(DECISION_TYPES)))})")
    return leaves, _walk(tag, leaves, arrays["left_child"], arrays["right_child"])


def _walk(tag: str, leaves: int, left: list[int], right: list[int]) -> int:
    """Visit every node from the root once; return the deepest path (internal nodes).

    Child c >= 0 is internal node c (< num_leaves-1), c < 0 is leaf ~c.  A
    child already visited is a cycle when it is an ancestor, else a node with
    two parents; either would make LightGBM loop or double count.
    """
    nodes = leaves - 1
    parent = [-2] * nodes  # -2: not reached yet; the root's parent is -1
    parent[0] = -1
    leaf_seen = bytearray(leaves)
    deepest = 0
    stack = [(0, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise invalid(f"{tag}: node {node} is at depth {depth}, over {MAX_DEPTH}")
        deepest = max(deepest, depth)
        for side, children in (("left_child", left), ("right_child", right)):
            child = children[node]
            where = f"{tag}: {side}[{node}]={child}"
            if child >= 0:
                if child >= nodes:
                    raise invalid(f"{where} is not a node (0..{nodes - 1})")
                if parent[child] != -2:
                    ancestor, up = node, 0
                    while ancestor >= 0 and ancestor != child and up <= nodes:
                        ancestor, up = parent[ancestor], up + 1
                    if ancestor == child:
                        raise invalid(f"{where} makes a cycle")
                    raise invalid(f"{where}: node {child} is reached twice")
                parent[child] = node
                stack.append((child, depth + 1))
            else:
                leaf = ~child
                if leaf >= leaves:
                    raise invalid(f"{where} is not a leaf (~0..~{leaves - 1})")
                if leaf_seen[leaf]:
                    raise invalid(f"{where}: leaf {leaf} is reached twice")
                leaf_seen[leaf] = 1
    for node in range(nodes):
        if parent[node] == -2:
            raise invalid(f"{tag}: node {node} is not reachable from the root")
    for leaf in range(leaves):
        if not leaf_seen[leaf]:
            raise invalid(f"{tag}: leaf {leaf} is not reachable from the root")
    return deepest


def _check_tree_sizes(sizes: list[int] | None, starts: list[int]) -> None:
    """LightGBM jumps to each tree by these byte counts: they must be exact."""
    if sizes is None:
        return
    trees = len(starts) - 1
    if len(sizes) != trees:
        raise invalid(f"header: tree_sizes has {len(sizes)} entries for {trees} trees")
    for i, size in enumerate(sizes):
        actual = starts[i + 1] - starts[i]
        if size != actual:
            raise invalid(f"header: tree_sizes[{i}]={size}, tree {i} is {actual} bytes")


def _trailer(lines: _Lines) -> None:
    """After the trees: importances, parameters, pandas_categorical, each optional.

    LightGBM reads `[linear_tree: 1]` from the parameters (refused) and a
    `parser:` section (not accepted here); the Python package json-decodes
    the last line when it starts with `pandas_categorical:` (only null or []).
    """
    lines.skip_blank()
    if lines.peek() == "feature_importances:":
        lines.take()
        while (line := lines.peek()) not in (None, ""):
            if not _IMPORTANCE.match(line):
                raise invalid(f"line {lines.i + 1}: {line[:40]!r} is not a feature importance")
            lines.take()
        lines.skip_blank()
    if lines.peek() == "parameters:":
        lines.take()
        while (line := lines.take("'end of parameters'")) != "end of parameters":
            if line and not _PARAMETER.match(line):
                raise invalid(f"line {lines.number}: {line[:40]!r} is not a [name: value] "
                              "parameter")
            if line.startswith("[linear_tree: ") and line != "[linear_tree: 0]":
                raise invalid(f"line {lines.number}: linear trees are not supported")
        lines.skip_blank()
    if (line := lines.peek()) is not None and line.startswith("pandas_categorical:"):
        if line not in ("pandas_categorical:null", "pandas_categorical:[]"):
            raise invalid(f"line {lines.i + 1}: pandas_categorical must be null or [] "
                          "(categorical features are not supported)")
        lines.take()
        lines.skip_blank()
    if lines.peek() is not None:
        raise invalid(f"line {lines.i + 1}: unexpected {lines.peek()[:40]!r} after the trees")
