"""The package installs as it reads: adapters/ and grammar/ are kvpolicy.adapters and kvpolicy.grammar, once.

``adapters/`` and ``grammar/`` sit at the top of the repository but ship inside the
``kvpolicy`` package (pyproject's ``package-dir``). With the repository root on
``sys.path`` (pytest's rootdir, ``python -c`` from the root) they would also import as
``adapters`` and ``grammar`` — second copies of every module, with their own state
and classes — so those names are refused. The wheel is built here from a copy of
the sources and its file list checked.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from kvpolicy.commands import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
SHIPPED = {"kvpolicy": ROOT / "kvpolicy", "kvpolicy.adapters": ROOT / "adapters", "kvpolicy.grammar": ROOT / "grammar"}
"""Each top-level source folder and the package it ships as."""


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _source_packages() -> dict[str, Path]:
    """Every package of the source tree (a folder with ``__init__.py``), by the name it ships as."""
    packages = {}
    for name, folder in SHIPPED.items():
        for init in folder.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                rel = init.parent.relative_to(folder)
                packages[".".join([name, *rel.parts])] = init.parent
    return packages


def _source_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in _source_packages().items():
        for path in folder.glob("*.py"):
            modules[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return modules


@pytest.mark.parametrize(("name", "package"), [
    ("adapters", "kvpolicy.adapters"),
    ("adapters.common", "kvpolicy.adapters"),
    ("adapters.vllm_adapter.plugin", "kvpolicy.adapters"),
    ("grammar", "kvpolicy.grammar"),
])
def test_the_top_level_folders_do_not_import_under_their_own_names(name: str, package: str) -> None:
    done = _python(f"import {name}", cwd=ROOT)  # the repository root is sys.path[0]
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"as {package}, not {name.split('.')[0]}" in last


def test_from_the_repository_root_each_module_has_one_identity() -> None:
    done = _python(
        "import sys\n"
        "import kvpolicy.adapters.common, kvpolicy.adapters.vllm_adapter.plugin\n"
        "from kvpolicy.policy.lark_parser import grammar_text\n"
        "assert 'version' in grammar_text()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('adapters', 'grammar')))\n",
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_pyproject_lists_every_package_of_the_source_tree() -> None:
    assert SETUPTOOLS["package-dir"] == {"kvpolicy.adapters": "adapters", "kvpolicy.grammar": "grammar"}
    assert sorted(SETUPTOOLS["packages"]) == sorted(_source_packages())


def test_the_installed_package_maps_every_module_to_this_checkout(tmp_path: Path) -> None:
    """The editable install (scripts/test) resolves each module, subpackages included, to its source
    file, seen from outside the repository."""
    where = _python("import kvpolicy; print(kvpolicy.__file__)", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    if Path(where.stdout.strip()).parent != ROOT / "kvpolicy":
        pytest.skip(f"kvpolicy is installed from {where.stdout.strip()}, not from this checkout (editable)")
    modules = _source_modules()
    done = _python(
        "import importlib.util, json, sys\n"
        f"names = {sorted(modules)!r}\n"
        "print(json.dumps({n: importlib.util.find_spec(n).origin for n in names}))\n",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    origins = json.loads(done.stdout)
    assert {name: Path(origin) for name, origin in origins.items()} == modules


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built by the project's build backend from a copy of the sources (the checkout stays clean)."""
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    for folder in ("kvpolicy", "adapters", "grammar"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_wheel({str(out)!r}))"],
        cwd=src, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return zipfile.ZipFile(out / done.stdout.strip().splitlines()[-1])


def test_the_wheel_ships_adapters_and_grammar_inside_kvpolicy(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    code = {n for n in names if not n.startswith("kvpolicy-")}  # not the .dist-info
    expected = {"/".join(module.split(".")) + ("/__init__.py" if path.name == "__init__.py" else ".py")
                for module, path in _source_modules().items()}
    assert {n for n in code if n.endswith(".py")} == expected
    assert code - expected == {"kvpolicy/grammar/kvpolicy.lark"}
    assert not [n for n in names if n.split("/")[0] in ("adapters", "grammar")]


def test_the_wheel_depends_on_lark_pydantic_and_regex_and_offers_the_extras(wheel: zipfile.ZipFile) -> None:
    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(wheel.read(info))
    requires = meta.get_all("Requires-Dist") or []
    base = sorted(r.split(">")[0].split("<")[0].strip() for r in requires if "extra ==" not in r)
    assert base == ["lark", "pydantic", "regex"]
    assert {"runtime", "gpu", "engine", "test", "bench"} <= set(meta.get_all("Provides-Extra") or [])
    points = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "kvpolicy = kvpolicy.adapters.vllm_adapter.plugin:register" in points
    assert "kvpolicy = kvpolicy.adapters.sglang_dsv4:plugin" in points


def _distribution(requirement: str) -> str:
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop)[0]
    return requirement


def test_the_extras_a_command_names_are_the_ones_pyproject_offers() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert sorted(modules.values()) == sorted(_distribution(r) for r in extras[extra])
