"""The plugin ABI: the package `mlfs.abi` (one module per concept behind one face), the
typed `Backend` a backend module exports, and the toolkit `mlfs.backends.linux`.

Each check runs in a fresh interpreter, so what a module pulls in is what it
alone imports, and DeprecationWarnings are errors there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "plugin" / "mlfs-backend-example"
TEMPLATE = REPO / "docs" / "examples" / "mlfs-backend-template"
#: the stand-in modules (old names) and `_moved`, removed: importing one fails
OLD_NAMES = {"mlfs.backends.settings", "mlfs.backends._moved", "mlfs.backends.linux_common",
             *(f"mlfs.backends.linux_{m}" for m in ("block", "controller", "files", "knobs",
                                                    "ledger", "subsystem", "sysfs", "vm"))}


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
             or m.startswith(("mlfs.core", "mlfs.backends", "mlfs.fs", "mlfs.cli",
                              "mlfs.base"))}
    assert heavy == set()


def test_the_settings_helpers_are_part_of_the_abi():
    import mlfs.abi as abi

    schema = {"size": abi.number(1, 10, integer=True), "mode": abi.word("a", "b")}
    assert abi.check_settings({"size": 3, "mode": "a"}, schema) == {"size": 3, "mode": "a"}
    with pytest.raises(abi.SettingError, match="size"):
        abi.check_settings({"size": 11, "mode": "a"}, schema)
    assert {"Schema", "SettingError", "check_settings", "tick_seconds"} <= set(abi.__all__)


def _public_names(source: Path) -> set[str]:
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("concept", ["backend", "knobs", "settings", "subsystem", "windows"])
def test_the_face_re_exports_every_public_name_of_each_concept(concept):
    import importlib

    import mlfs.abi as abi

    module = importlib.import_module(f"mlfs.abi.{concept}")
    names = _public_names(REPO / "mlfs" / "abi" / f"{concept}.py")
    assert names - set(abi.__all__) == set()
    assert all(getattr(abi, n) is getattr(module, n) for n in names)


def test_the_durable_file_rules_are_one_object_in_the_abi_and_the_base():
    import mlfs.abi as abi
    from mlfs.base import durable

    assert abi.write_durably is durable.write_durably is abi.durable.write_durably
    assert abi.read_bounded is durable.read_bounded


def test_the_example_plugin_and_the_template_import_only_the_abi():
    for package, path in (("mlfs_backend_example", EXAMPLE),
                          ("mlfs_backend_template", TEMPLATE)):
        loaded = _loaded_after(f"import {package}", path)
        ours = {m for m in loaded if m == "mlfs" or m.startswith("mlfs.")}
        assert "mlfs.abi" in ours
        assert {m for m in ours if m != "mlfs" and not m.startswith("mlfs.abi")} == set()


def test_the_linux_toolkit_imports_and_no_stand_in_is_left():
    loaded = _loaded_after("import mlfs.backends.linux.controller, mlfs.backends.linux.vm")
    assert {"mlfs.backends.linux.ledger", "mlfs.backends.linux.files"} <= loaded
    assert not {m for m in loaded if m.startswith("mlfs.base")}
    assert not list((REPO / "backends").glob("linux_*.py"))
    assert not (REPO / "backends" / "_moved.py").exists()


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_an_old_module_name_is_gone(old):
    done = _run(f"import {old}")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


# ---- the typed Backend and the loader ---------------------------------------------------------
def _backend(**changes):
    from mlfs.abi import Backend

    fields = {"name": "x.y", "description": "one line", "settings": {},
              "check": lambda s: (s, ["x.y"]), "factory": lambda s: [], **changes}
    return Backend(**fields)


@pytest.mark.parametrize("changes,why", [
    ({"name": "Not A Name"}, "name does not match"),
    ({"description": " "}, "description"),
    ({"check": None}, "check is not callable"),
    ({"settings": {"a": 1}}, "settings is not a Schema"),
    ({"root_only": "yes"}, "root_only is not True or False"),
    ({"kinds": "knob"}, "kinds is not a tuple"),
    ({"settings_for_name": 3}, "settings_for_name is neither None nor callable"),
])
def test_a_backend_with_a_bad_field_is_refused_when_made_in_one_line(changes, why):
    with pytest.raises(TypeError, match=why) as refused:
        _backend(**changes)
    assert "\n" not in str(refused.value)


def test_a_backend_is_described_with_its_rights_and_kinds():
    backend = _backend(root_only=True, kinds=["knob"], description="two\n  lines")
    assert backend.describe() == {"name": "x.y", "description": "two lines", "settings": [],
                                  "kinds": ["knob"], "root_only": True,
                                  "uses_state_dir": False}


def _load(source: str, tmp_path: Path, name: str = "old.style") -> subprocess.CompletedProcess:
    (tmp_path / "oldplugin.py").write_text(source)
    code = ("import warnings\n"
            "from mlfs.backends import Registered, BackendImportError\n"
            f"entry = Registered({name!r}, 'oldplugin', 'mlfs-backend-old')\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    try:\n"
            "        b = entry.load()\n"
            "        print('LOADED', b.name, b.root_only, b.uses_state_dir, b.description)\n"
            "    except BackendImportError as exc:\n"
            "        print('REFUSED', exc)\n"
            "for w in caught:\n"
            "    print(w.category.__name__, w.message)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={"PYTHONPATH": f"{REPO}:{tmp_path}",
                                                     "PATH": "/usr/bin:/bin"})


OLD_STYLE = """
DESCRIPTION = "an old plugin"
ROOT_ONLY = True
USES_STATE_DIR = True
SETTINGS = {}
def check(settings):
    return settings, ["old.style"]
def factory(settings):
    return []
"""


def test_an_old_style_module_is_adapted_and_warned_about(tmp_path):
    done = _load(OLD_STYLE, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "LOADED old.style True True an old plugin" in done.stdout
    assert "DeprecationWarning backend 'old.style' (package mlfs-backend-old) has no BACKEND" \
        in done.stdout and "until mlfs 0.2" in done.stdout


def test_a_module_without_backend_or_check_is_refused_in_one_line(tmp_path):
    done = _load("DESCRIPTION = 'nothing else'\n", tmp_path)
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("REFUSED")]
    assert "exports no BACKEND (an mlfs.abi.Backend)" in line and "mlfs-backend-old" in line


def test_a_backend_named_otherwise_than_its_entry_point_is_refused(tmp_path):
    source = ("from mlfs.abi import Backend\n"
              "BACKEND = Backend(name='other.name', description='d', settings={},\n"
              "                  check=lambda s: (s, []), factory=lambda s: [])\n")
    done = _load(source, tmp_path)
    assert "REFUSED" in done.stdout and "named 'other.name'" in done.stdout, done.stdout


def test_every_built_in_backend_exports_a_backend():
    from mlfs.backends import registered

    from mlfs.abi import Backend

    known, problems = registered()
    assert problems == []
    own = {n: e for n, e in known.items() if e.package == "mlfs"}
    assert len(own) >= 8
    for name, entry in own.items():
        module = __import__(entry.value, fromlist=["BACKEND"])
        assert isinstance(module.BACKEND, Backend) and module.BACKEND.name == name


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
    users = {}
    for top in ("mlfs", "backends", "trainers", "tests", "tools", "docs"):
        for source in (REPO / top).rglob("*.py"):
            if ".venv" in source.parts:
                continue
            hits = _imported_modules(source) & OLD_NAMES
            if hits:
                users[str(source.relative_to(REPO))] = sorted(hits)
    assert users == {}


def test_the_template_is_a_working_backend_as_copied():
    code = ("from mlfs.abi import subsystem_problems\n"
            "from mlfs_backend_template import BACKEND\n"
            "[sub] = BACKEND.factory(BACKEND.example(None))\n"
            "assert subsystem_problems(sub) == []\n"
            "sample = sub.step(sub.default_knobs(None))\n"
            "assert set(sample.features) == set(sub.features)\n"
            "print(BACKEND.name, sorted(sub.knobs))\n")
    done = _run(code, TEMPLATE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["template.queue", "['batch']"]
    entry = (TEMPLATE / "pyproject.toml").read_text()
    assert '"template.queue" = "mlfs_backend_template"' in entry
