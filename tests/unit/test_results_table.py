"""The results page's table and README's headlines are what the archived raw outputs give
(issue 33, item 6; issue 51).

`python -m tests.bench.results` writes the full table in docs/results/README.md and
README's headlines from the archives in bench-results/; a figure edited by hand in either,
or an archive changed without regenerating, fails here.  docs/ holds no raw output.
"""

from __future__ import annotations

import json

import pytest

from tests.bench import results, scoring


def test_results_page_and_readme_are_what_the_committed_outputs_give() -> None:
    ok, diff = results.check()
    assert ok, "not what `python -m tests.bench.results` writes:\n" + diff


def test_a_results_page_figure_edited_by_hand_fails_the_check() -> None:
    index = (results.ROOT / results.INDEX).read_text()
    head, rest = index.split(results.BEGIN, 1)
    inside, tail = rest.split(results.END, 1)
    row = next(line for line in inside.splitlines() if line.startswith("| dirty ratios on"))
    cells = row.split(" | ")
    cells[3] = "×1.15 [1.09–1.20]"  # the arithmetic rule's figure, by hand
    edited = head + results.BEGIN + inside.replace(row, " | ".join(cells)) + results.END + tail
    ok, diff = results.check_text((results.ROOT / "README.md").read_text(), index=edited)
    assert not ok and "×1.15 [1.09–1.20]" in diff


def test_a_readme_headline_edited_by_hand_fails_the_check() -> None:
    import re

    readme = (results.ROOT / "README.md").read_text()
    block = readme.split(results.HEAD_BEGIN, 1)[1].split(results.HEAD_END, 1)[0]
    figure = re.search(r"\n- \*\*[^*]+\*\*[^\n]*?(×\d+\.\d+|\d+\.\d+%?)", block)
    assert figure, block  # a headline carries a measured figure
    line = figure.group(0)
    edited_line = line[:-len(figure.group(1))] + "×9.99"
    assert edited_line != line
    ok, diff = results.check_text(readme.replace(line, edited_line, 1))
    assert not ok and "×9.99" in diff


def test_readme_has_at_most_eight_headlines_each_with_command_and_page() -> None:
    readme = (results.ROOT / "README.md").read_text()
    block = readme.split(results.HEAD_BEGIN, 1)[1].split(results.HEAD_END, 1)[0]
    items = block.split("\n- ")[1:]
    assert 1 <= len(items) <= 8
    for item in map(" ".join, map(str.split, items)):  # a wrapped line is one line
        assert "`python -m tests.bench." in item or "`mlfs " in item, item
        assert "([details](docs/" in item, item


def test_the_table_needs_its_markers() -> None:
    with pytest.raises(ValueError):
        results.render("# README without markers\n", "table")


def test_docs_hold_no_raw_output_and_stay_small() -> None:
    docs = results.ROOT / "docs"
    files = [p for p in docs.rglob("*") if p.is_file()]
    raw = [p for p in files if p.suffix in (".parquet", ".log", ".xz", ".gz", ".txt")]
    assert not raw, raw
    assert not (docs / "bench").exists()
    assert sum(p.stat().st_size for p in files) < 2_000_000
    assert all(p.suffix == ".md" for p in (docs / "results").rglob("*") if p.is_file())


def test_every_link_of_the_results_and_subsystem_pages_resolves() -> None:
    """A raw output a page links is its archive in bench-results/; every other link is a
    file of the repository (tests/test_packaging.py checks docs/*.md the same way)."""
    import re

    pages = [*(results.ROOT / results.PAGES).glob("*.md"),
             *(results.ROOT / "docs/subsystems").glob("*.md"),
             results.ROOT / results.LAB / "README.md"]
    assert len(pages) > 10
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http:", "https:", "#")):
                continue
            resolved = (page.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(results.ROOT) and resolved.exists(), \
                (page.name, target)


def test_every_built_in_backend_has_its_page_linked_from_readme() -> None:
    import importlib
    import tomllib

    project = tomllib.loads((results.ROOT / "pyproject.toml").read_text())["project"]
    names = project["entry-points"]["mlfs.backends"]
    readme = (results.ROOT / "README.md").read_text()
    for name in names:
        page = results.ROOT / "docs/subsystems" / f"{name}.md"
        assert page.is_file(), name
        assert f"](docs/subsystems/{name}.md)" in readme, name
        text = page.read_text()
        for section in ("## What it reads", "## What it sets", "## Settings", "## Rights",
                        "## How to use it"):
            assert section in text, (name, section)
        module = importlib.import_module(names[name])
        for key in getattr(module, "SETTINGS", {}):  # every setting the backend checks
            assert f"| `{key}` |" in text, (name, key)


def test_dirty_runs_are_rescored_by_the_one_rule_from_their_per_phase_ratios() -> None:
    run = results.Outputs().json("dirty-win-14/run1.json")
    got = results.fio_run_scores(run)
    mlfs = run["ratio"]["mlfs"]
    assert got["mlfs"] == pytest.approx(scoring.overall(
        {p: mlfs[p] for p in run["phases"]}))
    # the overall this run printed is the arithmetic rule's (x1.20); the one rule reads x1.15
    assert round(got["printed"], 2) == 1.20 and round(got["mlfs"], 2) == 1.15


def test_a_row_without_committed_output_says_so(tmp_path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    row = results.fleet_demo(results.Outputs(tmp_path))  # a tree with no archive
    assert results.NO_OUTPUT in row.result and row.vs_default == results.NONE


def test_the_fleet_demo_row_reads_the_demos_own_summary_line() -> None:
    row = results.fleet_demo(results.Outputs())
    assert results.NO_OUTPUT not in row.result and "fleet-demo-" in row.result


def test_the_learning_row_reads_the_json_archived_last_or_latest_json(tmp_path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                        "user.email=t@t", *args], check=True, capture_output=True)

    git("init", "-q")
    runs = tmp_path / "runs" / "learning-34"
    runs.mkdir(parents=True)
    seeds = [{"seed": 0, "second_half": {}}]
    for name in ("ffff000.json", "aaaa000.json"):  # archived in this order
        (runs / name).write_text(json.dumps(seeds))
        results.pack([runs], root=tmp_path)
        (runs / name).unlink()
    accept = lambda d: isinstance(d, list)  # noqa: E731
    assert results.Outputs(tmp_path).newest("learning-34", accept) is None  # not tracked
    git("add", ".")
    git("commit", "-qm", "archives")
    out = results.Outputs(tmp_path)
    assert out.newest("learning-34", accept) == "learning-34/aaaa000.json"
    assert out.glob("learning-34/*.json") == ["learning-34/aaaa000.json",
                                              "learning-34/ffff000.json"]
    (runs / "latest.json").write_text(json.dumps(seeds))
    results.pack([runs], root=tmp_path)
    git("add", ".")
    git("commit", "-qm", "latest")
    assert results.Outputs(tmp_path).newest("learning-34", accept) == "learning-34/latest.json"


def test_a_loose_output_goes_to_its_experiments_archive() -> None:
    assert results.archive_of("readahead-win-seed1.json") == "bench-results/readahead-win.tar.xz"
    assert results.archive_of("dirty-win-12/run1.json") == "bench-results/dirty-win-12.tar.xz"
    assert results.archive_of("kmsg-dedup.txt") == "bench-results/kmsg-dedup.tar.xz"
    assert results.archive_of("bio-capture-runs/x.py") == "bench-results/bio-capture.tar.xz"


def test_the_against_fixed_commands_are_the_options_their_runs_stored() -> None:
    """README's table prints one command per experiment; every archived run that stored its
    options must be what that command runs (`against_fixed.command_differs`), and the
    table is not written when one is not."""
    from tests.bench import against_fixed, fio_win, readahead_win

    checked = 0
    out = results.Outputs()
    for folder, _, _, command in against_fixed.EXPERIMENTS:
        for path in out.glob(f"{folder}/run*.json"):
            run = out.json(path)
            if "args" in run:
                assert against_fixed.command_differs(command, run["args"]) == {}, path
                checked += 1
    assert checked >= 12  # the fio_win runs of five experiments store their options
    stored = vars(fio_win.parse_args("queue", ["--phases", "oltp,backup-read",
                                               "--seconds", "3"]))
    assert against_fixed.command_differs("tests.bench.queue_win --seconds 3", stored) == {
        "phases": (None, ("oltp", "backup-read"))}
    stored = vars(readahead_win.parse_args(["--quick"]))
    assert set(against_fixed.command_differs("tests.bench.readahead_win", stored)) == {
        "file_mib", "memory_mib", "phase_seconds", "cycles", "repeats", "grid",
        "train_seconds"}
