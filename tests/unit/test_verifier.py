"""The policy verifier: every rule refuses a crafted text with a reason naming it.

Each crafted text starts from a real LightGBM model and changes one thing
(tree_sizes is recomputed, so the rule under test is the one that fires).
The last tests pin that every policy our own trainer produces verifies, and
what the proxy does with a running policy that fails or runs over budget.
"""

from __future__ import annotations

import re

import lightgbm as lgb
import numpy as np
import pytest

from mlfs.base import verifier
from mlfs.base.errors import Refused
from mlfs.base.verifier import verify
from mlfs.core.models import policy as policy_module
from tests.harness import fix_sizes

NAMES = ["sequential_ratio", "mem_pressure", "knob_read_ahead_kb"]


def train(rounds: int = 3, leaves: int = 4, objective: str = "regression", **params) -> str:
    rng = np.random.default_rng(0)
    x = rng.random((300, 3))
    y = 1 + x[:, 0] * 3 + x[:, 2] + rng.normal(0, 0.01, 300)
    data = lgb.Dataset(x, label=y, feature_name=NAMES, params={"verbose": -1})
    return lgb.train({"verbose": -1, "num_leaves": leaves, "objective": objective,
                      "min_data_in_leaf": 5, **params}, data,
                     num_boost_round=rounds).model_to_string()


@pytest.fixture(scope="module")
def text() -> str:
    return train()


def with_field(text: str, tree: int, field: str, value: str | None) -> str:
    """Tree `tree`'s `field` set to `value` (None: the line removed; absent: added)."""
    start = text.index(f"Tree={tree}\n")
    end = text.index("\n\n", start)
    block = text[start:end]
    line = re.compile(rf"^{field}=.*$", re.M)
    if line.search(block):
        block = line.sub("" if value is None else f"{field}={value}", block, count=1)
        block = block.replace("\n\n", "\n")
    else:
        block += f"\n{field}={value}"
    return fix_sizes(text[:start] + block + text[end:])


def with_header(text: str, field: str, value: str | None) -> str:
    line = re.compile(rf"^{field}=.*\n", re.M)
    head, sep, rest = text.partition("\n\n")
    head += "\n"
    if line.search(head):
        head = line.sub("" if value is None else f"{field}={value}\n", head, count=1)
    else:
        head += f"{field}={value}\n"
    return head.rstrip("\n") + sep + rest


def field(text: str, tree: int, name: str) -> str:
    start = text.index(f"Tree={tree}\n")
    return re.compile(rf"^{name}=(.*)$", re.M).search(text, start).group(1)


def refused(text: str | bytes) -> str:
    with pytest.raises(Refused) as caught:
        verify(text.encode() if isinstance(text, str) else text)
    assert caught.value.errno == 22
    return caught.value.reason


# ---- what is accepted --------------------------------------------------------

def test_a_model_lightgbm_wrote_verifies_and_the_verifier_reports_its_shape(text):
    model = verify(text.encode())
    assert model.feature_names == tuple(NAMES)
    assert model.objective == "regression"
    assert model.trees == 3 and model.leaves == 12
    assert 2 <= model.max_depth <= 3 and model.path_sum <= 9


def test_one_leaf_trees_gamma_and_a_text_without_tree_sizes_verify():
    flat = train(rounds=2, objective="gamma", min_data_in_leaf=1000)
    assert "num_leaves=1" in flat
    assert verify(flat.encode()).path_sum == 0
    assert verify(with_header(train(), "tree_sizes", None).encode()).trees == 3


# ---- the attacks of issue 10 ----------------------------------------------------

def test_a_split_feature_far_out_of_range_is_refused_naming_tree_node_and_field(text):
    features = field(text, 0, "split_feature").split()
    bad = with_field(text, 0, "split_feature", " ".join(features[:-1] + ["100000000"]))
    assert refused(bad) == (f"tree 0: split_feature[{len(features) - 1}]=100000000 is not "
                            "below the 3 declared features")
    assert "split_feature[0]=-1" in refused(with_field(
        text, 0, "split_feature", " ".join(["-1"] + features[1:])))


def test_a_child_pointer_back_to_an_ancestor_is_refused_as_a_cycle(text):
    right = field(text, 0, "right_child").split()
    left = field(text, 0, "left_child").split()
    node = next(i for i in range(len(right)) if int(right[i]) >= 0 or int(left[i]) >= 0)
    side = "right_child" if int(right[node]) >= 0 else "left_child"
    values = right if side == "right_child" else left
    child = int(values[node])
    values[child] = "0"  # the child points back at the root
    reason = refused(with_field(text, 0, side, " ".join(values)))
    assert reason == f"tree 0: {side}[{child}]=0 makes a cycle"


def test_the_three_node_attack_texts_of_the_issue_are_refused():
    head = ("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n"
            "max_feature_idx=2\nobjective=regression\nfeature_names=" + " ".join(NAMES) +
            "\nfeature_infos=none none none\n\n")

    def tree(split_feature: str, right: str) -> str:
        return (head + "Tree=0\nnum_leaves=3\nnum_cat=0\nsplit_feature=" + split_feature +
                "\nthreshold=0.5 0.5\ndecision_type=2 2\nleft_child=-1 -2\nright_child=" + right +
                "\nleaf_value=1 2 3\nshrinkage=1\n\n\nend of trees\n")

    assert verify(tree("0 1", "1 -3").encode()).leaves == 3  # the honest shape
    assert refused(tree("0 100000000", "1 -3")) == (
        "tree 0: split_feature[1]=100000000 is not below the 3 declared features")
    assert refused(tree("0 1", "1 0")) == "tree 0: right_child[1]=0 makes a cycle"


def test_every_truncation_before_the_end_of_the_trees_is_refused(text):
    end = text.index("end of trees") + len("end of trees")
    for cut in list(range(0, end, max(1, end // 150))) + [end - 1]:
        reason = refused(text[:cut])
        assert reason, cut


# ---- structure ------------------------------------------------------------------

@pytest.mark.parametrize("side", ["left_child", "right_child"])
def test_child_indices_out_of_range_are_refused(text, side):
    values = field(text, 0, side).split()
    assert "is not a node (0..2)" in refused(with_field(text, 0, side, " ".join(["3"] +
                                                                                  values[1:])))
    assert "is not a leaf (~0..~3)" in refused(with_field(text, 0, side, " ".join(["-5"] +
                                                                                    values[1:])))


def test_a_leaf_reached_twice_and_an_unreachable_node_are_refused(text):
    left = field(text, 0, "left_child").split()
    right = field(text, 0, "right_child").split()
    leaf = next(v for v in left + right if int(v) < 0)
    node = next(i for i in range(3) if int(right[i]) < 0 and right[i] != leaf)
    twice = right.copy()
    twice[node] = leaf
    assert "reached twice" in refused(with_field(text, 0, "right_child", " ".join(twice)))
    unreachable = with_field(with_field(text, 0, "left_child", "-1 -3 2"), 0, "right_child",
                             "-2 -4 1")
    assert refused(unreachable) == "tree 0: node 1 is not reachable from the root"


@pytest.mark.parametrize("name", ["split_feature", "threshold", "decision_type", "left_child",
                                  "right_child", "split_gain", "internal_value",
                                  "internal_count", "leaf_value", "leaf_weight", "leaf_count"])
def test_every_array_must_have_exactly_the_length_lightgbm_reads(text, name):
    values = field(text, 0, name).split()
    reason = refused(with_field(text, 0, name, " ".join(values[:-1])))
    assert reason == (f"tree 0: {name} has {len(values) - 1} values, num_leaves=4 needs "
                      f"{len(values)}")
    longer = refused(with_field(text, 0, name, " ".join(values + ["1"])))
    assert f"has {len(values) + 1} values" in longer


def test_required_tree_fields_and_unknown_ones(text):
    for name in ("num_leaves", "num_cat", "leaf_value", "split_feature", "threshold",
                 "left_child", "right_child"):
        assert refused(with_field(text, 1, name, None)) == f"tree 1: field {name!r} is missing"
    assert "unknown tree field 'magic'" in refused(with_field(text, 1, "magic", "1"))
    assert "not key=value" in refused(text.replace("is_linear=0", "is_linear", 1))


def test_numbers_thresholds_and_leaf_values_must_be_finite_numbers(text):
    thresholds = field(text, 0, "threshold").split()
    for bad in ("inf", "nan", "1e999", "1.5.5", "0x10", "1_0", ""):
        values = [bad] + thresholds[1:]
        reason = refused(with_field(text, 0, "threshold", " ".join(values)))
        assert "threshold" in reason, (bad, reason)
    leaves = field(text, 2, "leaf_value").split()
    assert refused(with_field(text, 2, "leaf_value", " ".join(leaves[:-1] + ["-inf"]))) == (
        "tree 2: leaf_value[3]='-inf' is not a number")
    assert "is not finite" in refused(with_field(text, 2, "leaf_value",
                                                 " ".join(leaves[:-1] + ["-1e400"])))
    assert "shrinkage" in refused(with_field(text, 2, "shrinkage", "nan"))
    assert "32-bit" in refused(with_field(text, 0, "left_child", "4294967297 -1 -2"))
    assert "doubled or trailing space" in refused(with_field(
        text, 0, "leaf_value", " ".join(leaves) + " "))


def test_decision_types_must_be_numerical_splits(text):
    kinds = field(text, 0, "decision_type").split()
    assert verifier.DECISION_TYPES == {0, 2, 4, 6, 8, 10}
    for bad in ("1", "3", "12", "14", "16", "-2"):
        reason = refused(with_field(text, 0, "decision_type", " ".join([bad] + kinds[1:])))
        assert reason.startswith(f"tree 0: decision_type[0]={bad} is not a numerical split")


def test_categorical_and_linear_trees_are_refused(text):
    assert "num_cat=1: categorical" in refused(with_field(text, 0, "num_cat", "1"))
    assert "cat_threshold: categorical" in refused(with_field(text, 0, "cat_threshold", "1"))
    assert "is_linear=1: linear" in refused(with_field(text, 0, "is_linear", "1"))
    assert "leaf_coeff: linear" in refused(with_field(text, 0, "leaf_coeff", "1"))
    assert "linear trees" in refused(text.replace("[linear_tree: 0]", "[linear_tree: 1]"))


def test_trees_must_be_numbered_in_order_and_tree_sizes_exact(text):
    assert "expected 'Tree=1'" in refused(fix_sizes(text.replace("Tree=1\n", "Tree=7\n")))
    sizes = re.search(r"^tree_sizes=(.*)$", text, re.M).group(1).split()
    wrong = with_header(text, "tree_sizes", " ".join([str(int(sizes[0]) + 1)] + sizes[1:]))
    assert refused(wrong).startswith("header: tree_sizes[0]=")
    assert "tree_sizes has 2 entries for 3 trees" in refused(with_header(
        text, "tree_sizes", " ".join(sizes[:2])))


# ---- the header -------------------------------------------------------------------

@pytest.mark.parametrize("name, value, reason", [
    ("version", "v9", "version='v9'"),
    ("num_class", "3", "num_class=3"),
    ("num_tree_per_iteration", "2", "num_tree_per_iteration must be 1"),
    ("max_feature_idx", "5", "feature_names has 3 names, max_feature_idx=5 declares 6"),
    ("max_feature_idx", "-1", "max_feature_idx=-1 is not in"),
    ("feature_names", "a a knob_read_ahead_kb", "a feature name is given twice"),
    ("feature_names", "a b", "feature_names has 2 names"),
    ("feature_infos", "none none", "feature_infos has 2 entries"),
    ("feature_infos", "none 1:2:3 none", "categorical features are not supported"),
    ("objective", "multiclass num_class:3", "is neither a regression objective nor binary"),
    ("objective", "binary sigmoid:0", "sigmoid:0 is outside (0, 100]"),
    ("objective", "binary sigmoid:1e9", "is outside (0, 100]"),
    ("objective", "binary alpha:1", "binary objective parameter 'alpha' is not sigmoid"),
    ("objective", "regression alpha:x", "objective parameter 'alpha:x'"),
    ("monotone_constraints", "0 2 0", "monotone_constraints must be 3 values"),
    ("label_index", "x", "label_index='x' is not an integer"),
    ("magic", "1", "unknown header field 'magic'"),
])
def test_header_fields_are_checked(text, name, value, reason):
    assert reason in refused(with_header(text, name, value))


def test_a_binary_classifier_verifies_and_gives_a_probability():
    rng = np.random.default_rng(1)
    x = rng.random((400, 3))
    y = (x[:, 0] + 0.2 * rng.standard_normal(400) > 0.6).astype(float)
    data = lgb.Dataset(x, label=y, feature_name=NAMES, params={"verbose": -1})
    booster = lgb.train({"verbose": -1, "num_leaves": 4, "objective": "binary",
                         "min_data_in_leaf": 5}, data, num_boost_round=5)
    model = verify(booster.model_to_string())
    assert model.objective == "binary"
    assert verifier.gives_probability(model)
    assert not verifier.gives_probability(verify(train()))
    from mlfs.abi import Knob

    knob = Knob("read_ahead_kb", "int", 128, 0, 4096)
    with pytest.raises(Refused) as caught:  # a knob model runs regressions only
        policy_module.Policy(booster.model_to_string().encode(), {"read_ahead_kb": knob},
                             ["read_ahead_kb"], NAMES[:2], "max")
    assert "gives a probability (a predictor's policy)" in caught.value.reason


@pytest.mark.parametrize("name", ["version", "num_class", "max_feature_idx", "objective",
                                  "feature_names", "feature_infos"])
def test_required_header_fields(text, name):
    assert refused(with_header(text, name, None)) == f"header: field {name!r} is missing"


def test_a_header_field_twice_and_a_first_line_other_than_tree_are_refused(text):
    assert "given twice" in refused(text.replace("num_class=1\n", "num_class=1\nnum_class=1\n"))
    assert refused("booster\n" + text[5:]).startswith("line 1: not a LightGBM text model")


# ---- the text itself and what follows the trees ------------------------------------

def test_bytes_other_than_printable_ascii_and_newline_are_refused(text):
    for bad in (b"\r", b"\x00", b"\xff", b"\t"):
        data = text.encode().replace(b"num_cat=0", b"num_cat=0" + bad, 1)
        assert "is not printable ASCII" in refused(data)


def test_the_size_bound_is_checked_first():
    assert "over 16777216" in refused(b"tree\n" + b"x" * (16 << 20))


def test_the_trailer_accepts_only_what_lightgbm_writes(text):
    assert "unexpected 'parser:'" in refused(text + "parser:\nx\nend of parser\n")
    assert "pandas_categorical must be null or []" in refused(
        text.replace("pandas_categorical:null", 'pandas_categorical:[["a"]]'))
    assert "is not a [name: value] parameter" in refused(
        text.replace("[boosting: gbdt]", "boosting=gbdt"))
    assert "no 'end of parameters' line" in refused(text[:text.index("end of parameters")])


# ---- bounds ---------------------------------------------------------------------------

def chain(leaves: int) -> str:
    """One tree, a chain: node i splits to leaf i and node i+1 (depth leaves-1)."""
    nodes = leaves - 1
    left = " ".join(str(~i) for i in range(nodes))
    right = " ".join([str(i + 1) for i in range(nodes - 1)] + [str(~nodes)])
    head = ("tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n"
            "max_feature_idx=2\nobjective=regression\nfeature_names=" + " ".join(NAMES) +
            "\nfeature_infos=none none none\n\n")
    return (head + f"Tree=0\nnum_leaves={leaves}\nnum_cat=0\nsplit_feature=" +
            " ".join(["0"] * nodes) + "\nthreshold=" + " ".join(["0.5"] * nodes) +
            "\ndecision_type=" + " ".join(["2"] * nodes) + f"\nleft_child={left}\n"
            f"right_child={right}\nleaf_value=" + " ".join(["1"] * leaves) +
            "\nshrinkage=1\n\n\nend of trees\n")


def test_depth_leaves_trees_and_path_sum_are_bounded(monkeypatch):
    assert verify(chain(verifier.MAX_DEPTH + 1).encode()).max_depth == verifier.MAX_DEPTH
    assert refused(chain(verifier.MAX_DEPTH + 2)) == (
        f"tree 0: node {verifier.MAX_DEPTH} is at depth {verifier.MAX_DEPTH + 1}, "
        f"over {verifier.MAX_DEPTH}")
    assert "num_leaves=1025 is not in 1..1024" in refused(chain(1025))
    monkeypatch.setattr(verifier, "MAX_TREES", 2)
    assert refused(train(rounds=3)) == "policy has more than 2 trees"
    monkeypatch.setattr(verifier, "MAX_TREES", 2000)
    monkeypatch.setattr(verifier, "MAX_PATH_SUM", 5)
    assert "a prediction may visit" in refused(train(rounds=3))
    monkeypatch.setattr(verifier, "MAX_TOTAL_LEAVES", 10)
    assert "policy has 12 leaves in all, over 10" == refused(train(rounds=3))


def test_a_16_mib_array_is_refused_by_its_count(text):
    """Counted by splitting, not a regex (which took 30 s on this array; ~0.4 s now)."""
    leaves = field(text, 0, "leaf_value")
    huge = text.replace("leaf_value=" + leaves, "leaf_value=" + " ".join(["1.5"] * (3 << 20)), 1)
    assert "leaf_value has 3145728 values" in refused(huge)


# ---- our own trainer, and the proxy's use --------------------------------------------

def test_every_policy_our_trainer_produces_verifies():
    """Fits, gamma fits and corrections up to the trainer's tree budget all verify."""
    from mlfs.trainers.knob.learner import KnobLearner

    from tests.harness import INFO, make_dataset, make_feedback

    seen = []
    for relative in (False, True):
        learner = KnobLearner(INFO, relative=relative)
        for k in range(3):
            learner.add_dataset(make_dataset(1000, seed=10 + k, start_tick=1000 * k,
                                             explore_share=0.25))
        assert learner.fit()["fitted"]
        seen.append(verify(learner.policy_text().encode()))
        for seed in range(3):
            learner.correct(make_feedback(learner, 300, seed=3 + seed, bias=1.3))
        seen.append(verify(learner.policy_text().encode()))
    for model in seen:
        assert model.trees <= 600 and model.max_depth <= 14  # num_leaves 15, max_trees 600
        assert model.path_sum * 3 <= verifier.MAX_PATH_SUM
    assert any(after.trees > before.trees for before, after in zip(seen[::2], seen[1::2],
                                                                   strict=True))
    # the trainer's worst case (600 trees of 15 leaves, each 14 deep) within a third
    assert 600 * 3 <= verifier.MAX_TREES and 600 * 14 * 3 <= verifier.MAX_PATH_SUM
    assert 15 * 3 <= verifier.MAX_LEAVES and 14 * 3 <= verifier.MAX_DEPTH


def test_a_policy_over_the_decision_bound_is_refused_before_it_runs(text, monkeypatch):
    from mlfs.abi import Knob

    knob = Knob("read_ahead_kb", "int", 128, 0, 4096)
    monkeypatch.setattr(policy_module, "MAX_DECISION_NODES", 10)
    with pytest.raises(Refused) as caught:
        policy_module.Policy(text.encode(), {"read_ahead_kb": knob}, ["read_ahead_kb"],
                             NAMES[:2], "max")
    assert "a decision would visit up to" in caught.value.reason


def test_the_check_process_runs_the_verifier_and_imports_this_package(text, tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)  # another cwd: the package must still be this one
    assert policy_module.check_in_subprocess(text.encode())["verified"] is True
    bad = with_field(text, 0, "right_child", "0 -3 -4")
    with pytest.raises(Refused) as caught:
        policy_module.check_in_subprocess(bad.encode())
    assert caught.value.reason == "tree 0: right_child[0]=0 makes a cycle"


def test_the_check_reads_its_answer_after_what_lightgbm_prints_to_stdout(text):
    """Red-team pass 2: `objective=huber alpha:-1e-400` makes LightGBM print a warning
    to stdout before the check's JSON, which was refused as "gave no answer"."""
    odd = re.sub(r"objective=\S+", "objective=huber alpha:-1e-400 sqrt", text, count=1)
    answer = policy_module.check_in_subprocess(odd.encode())
    assert answer["trees"] == 3 and answer["verified"]
