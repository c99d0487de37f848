"""The `mlfs` command line as a user meets it: --version, --help, config, exit codes.

Every behaviour runs the real command in a subprocess; none needs a mount.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from mlfs import __version__
from mlfs.cli import EXAMPLES, build_parser
from mlfs.config import default_text
from tests.harness import REPO, mlfs_command


def run(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(mlfs_command(*args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, **kwargs)


def helper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlfs.mount_helper", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            yield from action.choices.items()


def test_version_prints_the_package_version_and_exits_0():
    done = run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"mlfs {__version__}\n", "")


def test_top_level_help_names_every_command_with_examples():
    done = run("--help")
    assert done.returncode == 0
    description = done.stdout.split("positional arguments")[0]
    commands = dict(_subparsers(build_parser()))
    assert len(commands) >= 8
    for name in commands:
        assert name in description, f"{name} missing from the description"
    assert "examples:" in done.stdout and "mlfs demo" in done.stdout


def test_every_option_of_every_command_has_help_and_every_command_examples():
    missing = []
    for name, sub in _subparsers(build_parser()):
        for action in sub._actions:  # noqa: SLF001
            if action.help is None or not str(action.help).strip():
                missing.append(f"{name} {action.option_strings or action.dest}")
        if name != "config":
            assert sub.epilog and "examples:" in sub.epilog, f"{name}: no examples"
            assert sub.epilog == EXAMPLES[name]
            shown = run(name, "--help")
            assert shown.returncode == 0 and EXAMPLES[name].splitlines()[1] in shown.stdout
        for action_name, action_parser in _subparsers(sub):
            for action in action_parser._actions:  # noqa: SLF001
                if not action.help:
                    missing.append(f"{name} {action_name} {action.dest}")
    assert not missing, "options without help text: " + ", ".join(missing)


def test_config_default_prints_the_embedded_default_that_config_check_accepts(tmp_path):
    done = run("config", "default")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == default_text()
    path = tmp_path / "mlfs.toml"
    path.write_text(done.stdout)
    checked = run("config", "check", str(path))
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")


@pytest.mark.parametrize("text, says", [
    ("[mount]\nmetrics_port = \n", "Invalid value"),         # TOML syntax
    ("[mount]\nmetrics_port = 70000\n", "metrics_port"),      # a range
    ("[mounts]\n", "unknown section"),                        # a typo'd section
])
def test_config_check_prints_one_line_naming_the_file_and_exits_2(tmp_path, text, says):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    done = run("config", "check", str(path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(path) in done.stderr and says in done.stderr, done.stderr


def test_config_check_of_a_missing_file_exits_2_naming_it(tmp_path):
    done = run("config", "check", str(tmp_path / "nope.toml"))
    assert done.returncode == 2
    missing = tmp_path / "nope.toml"
    assert done.stderr == f"mlfs: {missing}: cannot read: No such file or directory\n"


def test_train_on_a_path_that_does_not_exist_exits_2_with_one_line(tmp_path):
    done = run("train", str(tmp_path / "nowhere"), "sim.readahead", timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "nowhere" in done.stderr, done.stderr
    assert not (tmp_path / "nowhere").exists()


def test_train_on_an_unmounted_directory_waits_then_exits_2_at_max_seconds(tmp_path):
    done = run("train", str(tmp_path), "sim.readahead", "--max-seconds", "1.5", timeout=60)
    assert done.returncode == 2
    assert "waiting for" in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (f"mlfs train: {tmp_path}: not an mlfs mount after "
                                            "1.5 s (mount it: mlfs mount DIR)")


def test_train_seed_and_verbose_reach_the_trainer(tmp_path):
    """One parser: --seed and -v are accepted, and -v turns on the trainer's DEBUG log."""
    done = run("train", str(tmp_path), "sim.readahead", "--seed", "3", "-v", "--wait", "0",
               timeout=60)
    assert done.returncode == 2, done.stderr
    assert "mlfs.train DEBUG training lgbm for" in done.stderr, done.stderr
    assert "(seed 3, --wait 0 s" in done.stderr, done.stderr


@pytest.mark.parametrize("wait", ["-1", "nan", "inf", "soon"])
def test_train_wait_that_is_not_seconds_is_refused_with_exit_2(tmp_path, wait):
    done = run("train", str(tmp_path), "sim.readahead", "--wait", wait, timeout=60)
    assert done.returncode == 2 and "--wait" in done.stderr and "Traceback" not in done.stderr


def test_mount_helper_exit_status_is_mount8s(tmp_path):
    (tmp_path / "mnt").mkdir()
    mountpoint = str(tmp_path / "mnt")
    refused = helper("none", mountpoint, "-o", "max_read=4096")
    assert refused.returncode == 1, "incorrect invocation"
    assert helper("none", mountpoint, "-q").returncode == 1
    fake = helper("none", mountpoint, "-f", "-o", "config=/etc/mlfs.toml")
    assert fake.returncode == 0
    missing = helper("none", mountpoint, "-o", f"config={tmp_path / 'missing.toml'}")
    assert missing.returncode == 32, missing.stderr  # mount failure
    nowhere = helper("none", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 32, nowhere.stderr
    assert not os.path.ismount(mountpoint)


def test_mount_helper_man_page_lists_its_options_and_exit_codes():
    from mlfs import mount_helper

    page = (REPO / "man/mount.fuse.mlfs.8").read_text()
    for name in mount_helper.VALUED:
        assert f".BI {name}= " in page
    for code in (mount_helper.EX_SUCCESS, mount_helper.EX_USAGE, mount_helper.EX_SYSERR,
                 mount_helper.EX_USER, mount_helper.EX_FAIL):
        assert f".B {code}\n" in page
    assert f'"mlfs {__version__}"' in page
    if shutil.which("man"):
        shown = subprocess.run(["man", "--warnings", "-l", str(REPO / "man/mount.fuse.mlfs.8")],
                               capture_output=True, text=True, timeout=30,
                               env={**os.environ, "MANPAGER": "cat"})
        assert shown.returncode == 0 and "EXIT STATUS" in shown.stdout
        assert not shown.stderr.strip(), shown.stderr


def test_man_page_and_completions_are_generated_from_the_parser(tmp_path):
    for tool in ("argparse-manpage", "shtab"):
        if not (Path(sys.executable).parent / tool).exists():
            pytest.skip(f"needs {tool}: pip install -e '.[docs]'")
    done = subprocess.run(["bash", str(REPO / "tools/gen-cli-docs"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    for generated in ("man/mlfs.8", "completions/mlfs.bash", "completions/_mlfs"):
        assert filecmp.cmp(tmp_path / generated, REPO / generated, shallow=False), (
            f"{generated} is stale: run tools/gen-cli-docs and commit")
    page = (REPO / "man/mlfs.8").read_text()
    for name, _sub in _subparsers(build_parser()):
        assert f"'mlfs {name}'".replace("-", "\\-") in page  # roff escapes hyphens
    if shutil.which("man"):
        shown = subprocess.run(["man", "-l", str(REPO / "man/mlfs.8")], capture_output=True,
                               text=True, timeout=30, env={**os.environ, "MANPAGER": "cat"})
        assert shown.returncode == 0 and "EXIT STATUS" in shown.stdout
    completed = subprocess.run(
        ["bash", "-c", f"source {REPO / 'completions/mlfs.bash'}; COMP_WORDS=(mlfs con); "
         "COMP_CWORD=1; _shtab_mlfs; echo ${COMPREPLY[@]}; COMP_WORDS=(mlfs umount --t); "
         "COMP_CWORD=2; _shtab_mlfs; echo ${COMPREPLY[@]}"],
        capture_output=True, text=True, timeout=30)
    assert completed.stdout.split() == ["config", "--timeout"], completed.stderr


def test_output_into_a_closed_pipe_ends_quietly_as_sigpipe_would():
    """`mlfs backends | true` (the reader gone at once): no BrokenPipeError traceback."""
    import shlex

    done = subprocess.run(["bash", "-c", f"{shlex.join(mlfs_command('backends'))} | "
                           "true; echo ${PIPESTATUS[0]}"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stdout.strip() in ("0", "141")


# ---- mlfs config check --json, show, schema (issue 32, items 4 and 6) ---------------------
def test_config_check_json_says_valid_or_the_error_with_its_line(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(default_text())
    done = run("config", "check", "--json", str(good))
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == {"file": str(good), "valid": True, "error": None,
                                       "line": None}
    bad = tmp_path / "bad.toml"
    bad.write_text("[store]\nseal_row = 5\n")
    done = run("config", "check", "--json", str(bad))
    assert (done.returncode, done.stderr) == (2, "")
    assert json.loads(done.stdout) == {
        "file": str(bad), "valid": False, "line": 2,
        "error": f"{bad}: store.seal_row: unknown setting (did you mean seal_rows?) (at line 2)"}


def test_config_show_prints_every_setting_with_defaults_and_reads_back_the_same(tmp_path):
    from mlfs.config import SECTIONS, load_config, parse_config

    path = tmp_path / "small.toml"
    path.write_text("[store]\nseal_rows = 100\n\n[[subsystem]]\nbackend = \"sim.readahead\"\n"
                    "phases = [\"sequential\"]\n\n[[subsystem]]\nbackend = \"linux.vm\"\n"
                    "apply = {swappiness = [0, 100]}\n")
    done = run("config", "show", str(path))
    assert (done.returncode, done.stderr) == (0, "")
    shown = parse_config(done.stdout, "shown")
    given = load_config(path)
    assert (shown.mount, shown.store, shown.modes, shown.subsystems) == (
        given.mount, given.store, given.modes, given.subsystems)
    assert "seal_rows = 100\n" in done.stdout and "max_tasks = 512\n" in done.stdout
    as_json = run("config", "show", "--json", str(path))
    data = json.loads(as_json.stdout)
    assert set(data) == {*SECTIONS, "subsystem"} and data["store"]["seal_rows"] == 100
    assert data["modes"]["window_ticks"] == 300 and data["subsystem"][0]["phases"] == [
        "sequential"]


def test_config_show_of_a_bad_file_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[mount]\nmax_tasks = 8\n")
    done = run("config", "show", str(path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"mlfs: {path}: mount.max_tasks: 8 is outside 64..65536 "
                           "(at line 2)\n")


def test_the_checked_in_json_schema_is_what_config_schema_prints():
    done = run("config", "schema")
    assert done.returncode == 0
    assert (REPO / "docs/config.schema.json").read_text() == done.stdout, (
        "docs/config.schema.json is stale: mlfs config schema > docs/config.schema.json")


def test_the_json_schema_accepts_the_shipped_files_and_refuses_what_the_loader_refuses():
    import tomllib

    jsonschema = pytest.importorskip("jsonschema")
    from mlfs.config import RANGES, SECTIONS, json_schema

    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in (default_text(), (REPO / "docker/mlfs.toml").read_text()):
        assert not list(validator.iter_errors(tomllib.loads(text)))
    for bad in ("[mount]\nmax_tasks = 8\n", "[store]\nseal_row = 5\n", "[mounts]\n",
                "[modes]\nlearning_share = 1.5\n", "[mount]\nallow_other = 1\n",
                "[[subsystem]]\nname = \"x\"\n"):
        assert list(validator.iter_errors(tomllib.loads(bad))), bad
    # every setting of every table, with the one range table's bounds
    for table, cls in SECTIONS.items():
        settings = schema["properties"][table]["properties"]
        assert set(settings) == {f.name for f in fields(cls)}
        for name, entry in settings.items():
            if f"{table}.{name}" in RANGES:
                lo, hi = RANGES[f"{table}.{name}"]
                assert (entry["minimum"], entry["maximum"]) == (lo, hi)


def test_check_jsonschema_validates_the_default_against_the_checked_in_schema(tmp_path):
    tool = Path(sys.executable).parent / "check-jsonschema"
    if not tool.exists():
        pytest.skip("needs check-jsonschema (pip install -e '.[test]')")
    config = tmp_path / "mlfs.toml"
    config.write_text(default_text())
    done = subprocess.run([str(tool), "--schemafile", str(REPO / "docs/config.schema.json"),
                           str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    config.write_text("[store]\nseal_row = 5\n")
    done = subprocess.run([str(tool), "--schemafile", str(REPO / "docs/config.schema.json"),
                           str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "seal_row" in done.stdout + done.stderr


@pytest.mark.parametrize("argv, expected", [
    (["--json"], (None, True)),
    (["--json", "--quick"], (None, True)),
    (["--json-out", "b.json"], ("b.json", False)),
    (["--json", "b.json"], ("b.json", False)),  # the old spelling of --json-out, kept
    (["--json", "--json-out", "b.json"], ("b.json", True)),
    ([], (None, False)),
])
def test_bench_json_is_a_flag_and_json_out_names_the_file(argv, expected):
    from mlfs.cli.bench import outputs

    assert outputs(build_parser().parse_args(["bench", *argv])) == expected
