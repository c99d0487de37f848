"""The plugin ABI lives in two places: `mlfs.abi` and the toolkit `mlfs.backends.linux`.

Each check runs in a fresh interpreter, so what a module pulls in is what it
alone imports, and DeprecationWarnings are errors there: mlfs must never import
one of its own old names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "plugin" / "mlfs-backend-example"
#: the modules that moved in 0.1 and keep their old name until 0.2
OLD_NAMES = {
    "mlfs.backends.settings": "mlfs.abi",
    **{f"mlfs.backends.linux_{m}": f"mlfs.backends.linux.{m}"
       for m in ("block", "controller", "files", "knobs", "ledger", "subsystem", "sysfs", "vm")},
}


def _run(code: str, *path: Path) -> subprocess.CompletedProcess:
    env_path = ":".join([str(REPO), *map(str, path)])
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})


def _loaded_after(statement: str, *path: Path) -> set[str]:
    done = _run(f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))", *path)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_abi_is_cheap_to_import_and_holds_no_core():
    loaded = _loaded_after("import mlfs.abi")
    heavy = {m for m in loaded
             if m.split(".")[0] in {"pyarrow", "numpy", "lightgbm", "pyfuse3", "trio"}
             or m.startswith(("mlfs.core", "mlfs.backends", "mlfs.fs", "mlfs.cli"))}
    assert heavy == set()


def test_the_settings_helpers_are_part_of_the_abi():
    import mlfs.abi as abi

    schema = {"size": abi.number(1, 10, integer=True), "mode": abi.word("a", "b")}
    assert abi.check_settings({"size": 3, "mode": "a"}, schema) == {"size": 3, "mode": "a"}
    with pytest.raises(abi.SettingError, match="size"):
        abi.check_settings({"size": 11, "mode": "a"}, schema)
    assert {"Schema", "SettingError", "check_settings", "tick_seconds"} <= set(abi.__all__)


def test_the_example_plugin_imports_only_the_abi_and_the_linux_toolkit():
    loaded = _loaded_after("import mlfs_backend_example", EXAMPLE)
    ours = {m for m in loaded if m == "mlfs" or m.startswith("mlfs.")}
    allowed = {m for m in ours if m in {"mlfs", "mlfs.abi"}
               or m == "mlfs.backends.linux" or m.startswith("mlfs.backends.linux.")}
    assert "mlfs.abi" in ours
    assert ours - allowed == set()


def test_the_linux_toolkit_imports_without_the_facade_or_an_old_name():
    loaded = _loaded_after("import mlfs.backends.linux.controller, mlfs.backends.linux.vm")
    assert {"mlfs.backends.linux.ledger", "mlfs.backends.linux.files"} <= loaded
    assert "mlfs.backends.linux_common" not in loaded
    assert "mlfs.backends.settings" not in loaded
    assert not {m for m in loaded if m.startswith("mlfs.backends.linux_")}


@pytest.mark.parametrize("old,new", sorted(OLD_NAMES.items()))
def test_an_old_module_name_is_the_new_module_with_a_deprecation_warning(old, new):
    code = (f"import importlib, warnings\n"
            f"with warnings.catch_warnings(record=True) as caught:\n"
            f"    warnings.simplefilter('always')\n"
            f"    old = importlib.import_module({old!r})\n"
            f"assert old is importlib.import_module({new!r}), old\n"
            f"assert [w.category for w in caught] == [DeprecationWarning], caught\n"
            f"assert {new!r} in str(caught[0].message)\n")
    done = _run(code)
    assert done.returncode == 0, done.stderr


def test_the_old_facade_still_exports_the_toolkit_with_a_deprecation_warning():
    code = ("import warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from mlfs.backends.linux_common import KnobController, restore_state_dir\n"
            "from mlfs.backends.linux.controller import KnobController as K\n"
            "from mlfs.backends.linux.ledger import restore_state_dir as r\n"
            "assert (KnobController, restore_state_dir) == (K, r)\n"
            "assert [w.category for w in caught] == [DeprecationWarning], caught\n")
    done = _run(code)
    assert done.returncode == 0, done.stderr


def _imported_modules(source: Path) -> set[str]:
    tree = ast.parse(source.read_text(), str(source))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the installed package name
                parts = list(source.relative_to(REPO).parent.parts)
                if parts[0] != "mlfs":  # backends/, trainers/ install inside mlfs
                    parts.insert(0, "mlfs")
                parts = parts[:len(parts) - node.level + 1]
                module = ".".join(parts + ([module] if module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_nothing_in_the_repository_imports_an_old_name():
    stand_ins = {REPO / "backends" / "settings.py", REPO / "backends" / "linux_common.py",
                 Path(__file__).resolve()}
    stand_ins |= {REPO / "backends" / f"{old.rsplit('.', 1)[1]}.py" for old in OLD_NAMES}
    old = set(OLD_NAMES) | {"mlfs.backends.linux_common"}
    users = {}
    for top in ("mlfs", "backends", "trainers", "tests", "tools"):
        for source in (REPO / top).rglob("*.py"):
            if source in stand_ins or ".venv" in source.parts:
                continue
            hits = _imported_modules(source) & old
            if hits:
                users[str(source.relative_to(REPO))] = sorted(hits)
    assert users == {}
