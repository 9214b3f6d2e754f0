"""The test suite's own layout: one import mode, every directory a package, each fixture defined once.

pytest's import mode is set once, in pyproject.toml; the GPU machine's script (scripts/gpu-check)
and the allocator's GPU runner (tests/alloc/gpu_suite.py) run pytest from the repository root so
that they read it. A fixture that two directories need lives in tests/conftest.py, so a second
definition of a fixture name anywhere under tests/ (which would shadow the first for some tests
and not others) fails here, as does a helper imported by its bare name instead of as ``tests.<dir>``.
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
IMPORT_MODE = re.compile(r"--import-mode(?:=|\s+)(\S+)")
# Folders of Python files that are entries of a child process's PYTHONPATH, never imported as packages.
PATH_ENTRIES = {TESTS / "vllm_e2e" / "plugin_probe"}  # its sitecustomize.py runs at an engine's start


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache
def siblings(folder: Path) -> frozenset[str]:
    """The names a bare import would find in ``folder`` if it were on sys.path: its modules and sub-folders."""
    return frozenset({p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()})


def configured_addopts() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return shlex.split(config["addopts"])


def fixture_definitions(root: Path) -> dict[str, list[str]]:
    """Every fixture name defined under ``root`` (``@pytest.fixture`` or ``@fixture``, with or without
    arguments; ``name=`` counts as the name), with where each definition is."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) not in ("pytest.fixture", "fixture"):
                    continue
                name = node.name
                for keyword in decorator.keywords if isinstance(decorator, ast.Call) else ():
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        name = keyword.value.value
                found.setdefault(name, []).append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def duplicated(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: places for name, places in found.items() if len(places) > 1}


def test_the_import_mode_is_set_once_in_pyproject() -> None:
    modes = [m for opt in configured_addopts() for m in IMPORT_MODE.findall(opt)]
    assert modes == ["importlib"], modes


def files_under(*places: Path) -> list[Path]:
    found = [p for place in places for p in ([place] if place.is_file() else place.rglob("*")) if p.is_file()]
    return [p for p in found if p.suffix in ("", ".py", ".md", ".sh", ".toml") and "__pycache__" not in p.parts]


def test_no_pytest_command_chooses_an_import_mode() -> None:
    """What runs pytest (scripts, CI, the tests' own runners) leaves the mode to pyproject.toml."""
    runners = files_under(ROOT / "scripts", ROOT / ".ci", TESTS, ROOT / "benchmarks")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in runners if p != Path(__file__)
                 for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if "--import-mode" in line]
    assert offenders == [], f"the import mode is pyproject.toml's alone: {offenders}"


def test_the_docs_name_no_other_import_mode() -> None:
    docs = files_under(ROOT / "docs", ROOT / "README.md")
    other = [f"{p.relative_to(ROOT)}:{n}: {mode}" for p in docs
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             for mode in IMPORT_MODE.findall(line) if mode.strip("`'\",.;:)") != "importlib"]
    assert other == [], other


def test_gpu_check_runs_pytest_from_the_root_with_the_configured_mode() -> None:
    script = (ROOT / "scripts" / "gpu-check").read_text()
    assert 'cd "$(dirname "$0")/.."' in script  # so pytest finds pyproject.toml as its configuration
    runs = [line.strip() for line in script.splitlines() if "-m pytest" in line]
    assert runs, "scripts/gpu-check runs no pytest"
    for run in runs:
        words = shlex.split(run.replace("\\", ""), comments=True)
        # -c, -o/--override-ini, --rootdir or -p no:... of the ini would replace pyproject's settings
        assert not {"-c", "-o", "--override-ini", "--rootdir", "--config-file"} & set(words), run
        assert not any(IMPORT_MODE.search(w) or w.startswith("--import-mode") for w in words), run
        assert "-P" in words, f"the checkout's root must stay off sys.path on the GPU machine: {run}"


def test_the_gpu_suite_runner_keeps_the_configuration() -> None:
    source = (TESTS / "alloc" / "gpu_suite.py").read_text()
    assert "--import-mode" not in source and "override-ini" not in source
    assert "--confcutdir={HERE.parent}" in source  # the root conftest (ledger_dir) still loads


def test_every_test_directory_is_a_package_of_tests() -> None:
    folders = sorted({p.parent for p in TESTS.rglob("*.py")} - PATH_ENTRIES)
    missing = [str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()]
    assert missing == [], f"importlib mode imports tests.<dir>.<module>: add __init__.py to {missing}"


def test_helpers_are_imported_as_part_of_the_tests_package() -> None:
    """``from alloc_support import x`` works only with the test's own folder on sys.path (another
    import mode) and gives a second copy of the module; ``from tests.alloc.alloc_support import x`` is one."""
    bare = []
    for path in sorted(TESTS.rglob("*.py")):
        local = siblings(path.parent)
        for node in ast.walk(parsed(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            bare += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                     if n.split(".")[0] in local and n.split(".")[0] != "tests"]
    assert bare == [], bare


def test_no_fixture_name_is_defined_twice() -> None:
    found = fixture_definitions(TESTS)
    assert "ledger_dir" in found and len(found) > 20  # the walk finds the suite's fixtures
    assert duplicated(found) == {}, "move a shared fixture to tests/conftest.py, or give it a name of its own"


def test_the_duplicate_check_finds_a_second_definition(tmp_path: Path) -> None:
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text("import pytest\n\n@pytest.fixture\ndef ledger_dir(): ...\n")
    (tmp_path / "tests" / "a" / "test_x.py").write_text(
        "import pytest\nfrom pytest import fixture\n\n"
        "@pytest.fixture(scope='module')\ndef ledger_dir(): ...\n\n"
        "@fixture(name='work')\ndef _work(): ...\n\n@fixture\ndef work(): ...\n\n@pytest.fixture\ndef once(): ...\n")
    assert duplicated(fixture_definitions(tmp_path / "tests")) == {
        "ledger_dir": ["tests/a/test_x.py:5", "tests/conftest.py:4"],
        "work": ["tests/a/test_x.py:8", "tests/a/test_x.py:11"],
    }
