"""README's "## Measured" table is what the committed raw outputs give (issue 33, item 6).

`python -m tests.bench.results` writes the table from docs/bench/'s JSON
files; a figure edited by hand in README, or a raw output changed without
regenerating, fails here.
"""

from __future__ import annotations

import json

import pytest

from tests.bench import results, scoring


def test_readme_table_is_what_the_committed_outputs_give() -> None:
    ok, diff = results.check()
    assert ok, "README.md's table is not what `python -m tests.bench.results` writes:\n" + diff


def test_a_readme_figure_edited_by_hand_fails_the_check() -> None:
    readme = (results.ROOT / "README.md").read_text()
    head, rest = readme.split(results.BEGIN, 1)
    inside, tail = rest.split(results.END, 1)
    row = next(line for line in inside.splitlines() if line.startswith("| dirty ratios on"))
    cells = row.split(" | ")
    cells[3] = "×1.15 [1.09–1.20]"  # the arithmetic rule's figure, by hand
    edited = head + results.BEGIN + inside.replace(row, " | ".join(cells)) + results.END + tail
    ok, diff = results.check_text(edited)
    assert not ok and "×1.15 [1.09–1.20]" in diff


def test_the_table_needs_its_markers() -> None:
    with pytest.raises(ValueError):
        results.render("# README without markers\n", "table")


def test_dirty_runs_are_rescored_by_the_one_rule_from_their_per_phase_ratios() -> None:
    rel = "docs/bench/dirty-win-14/run1.json"
    run = json.loads((results.ROOT / rel).read_text())
    got = results.fio_run_scores(run)
    mlfs = run["ratio"]["mlfs"]
    assert got["mlfs"] == pytest.approx(scoring.overall(
        {p: mlfs[p] for p in run["phases"]}))
    # the overall this run printed is the arithmetic rule's (x1.20); the one rule reads x1.15
    assert round(got["printed"], 2) == 1.20 and round(got["mlfs"], 2) == 1.15


def test_a_row_without_committed_output_says_so(tmp_path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    row = results.fleet_demo(results.Outputs(tmp_path))  # a tree with no demo output
    assert results.NO_OUTPUT in row.result and row.vs_default == results.NONE


def test_the_fleet_demo_row_reads_the_demos_own_summary_line() -> None:
    row = results.fleet_demo(results.Outputs())
    assert results.NO_OUTPUT not in row.result and "fleet-demo-" in row.result


def test_the_learning_row_reads_the_json_committed_last_or_latest_json(tmp_path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                        "user.email=t@t", *args], check=True, capture_output=True)

    folder = tmp_path / "docs/bench/learning-34"
    folder.mkdir(parents=True)
    git("init", "-q")
    seeds = [{"seed": 0, "second_half": {}}]
    for name in ("ffff000.json", "aaaa000.json"):  # committed in this order
        (folder / name).write_text(json.dumps(seeds))
        git("add", ".")
        git("commit", "-qm", name)
    (folder / "untracked.json").write_text(json.dumps(seeds))
    out = results.Outputs(tmp_path)
    accept = lambda d: isinstance(d, list)  # noqa: E731
    assert out.newest("docs/bench/learning-34", accept) == "docs/bench/learning-34/aaaa000.json"
    (folder / "latest.json").write_text(json.dumps(seeds))
    git("add", ".")
    git("commit", "-qm", "latest")
    assert results.Outputs(tmp_path).newest("docs/bench/learning-34", accept) == \
        "docs/bench/learning-34/latest.json"
