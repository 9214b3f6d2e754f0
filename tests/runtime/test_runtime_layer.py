"""The runtime imports nothing above it: no ``kvpolicy.adapters``, ``kvpolicy.commands`` or ``kvpolicy.cli``.

Engines reach the ledger through ``kvpolicy.runtime.session``; what is engine-specific
lives in the adapters, which import the runtime, never the other way round. Every
import is walked — at module level, inside functions, under ``TYPE_CHECKING`` — and so
is every string that names a module (``importlib.import_module``, lazy export tables).
(A narrow check of one layer; a repository-wide one supersedes it.)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "kvpolicy" / "runtime"
ABOVE = ("kvpolicy.adapters", "kvpolicy.commands", "kvpolicy.cli", "adapters")
_MODULE_NAME = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+")


def _above(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in ABOVE)


def imported_names(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every import and every module-naming string in ``path`` (a module of ``package``)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.fullmatch(node.value):
            yield node.lineno, node.value


def upward_imports(root: Path, repo: Path = REPO) -> list[str]:
    """``file:line: module`` for each name above the runtime that a module under ``root`` imports."""
    found = []
    for path in sorted(root.rglob("*.py")):
        package = ".".join(path.parent.relative_to(repo).parts)
        for line, name in imported_names(path, package):
            if _above(name):
                found.append(f"{path.relative_to(repo)}:{line}: {name}")
    return found


def test_the_runtime_imports_nothing_above_it() -> None:
    assert upward_imports(RUNTIME) == []


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "kvpolicy" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from kvpolicy.adapters.errors import AdapterError\n"
        "def f():\n"
        "    import kvpolicy.commands.run\n"
        "    return __import__('importlib').import_module('kvpolicy.adapters.ledger_port')\n"
        "from ..adapters import common\n"
        "from kvpolicy.runtime import client  # fine\n"
        "from . import session  # fine\n"
    )
    found = upward_imports(pkg, tmp_path)
    assert sorted({int(f.split(":")[1]) for f in found}) == [3, 5, 6, 7]
