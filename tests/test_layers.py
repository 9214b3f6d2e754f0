"""The import graph points down: no module imports one of a higher layer.

Bottom to top: base (the top-level modules of ``kvpolicy/``, but ``__main__``: units, the engine
vocabulary, diagnostics, the rule catalogue, the Facts schema), ``policy``, ``lint``,
``evaluate``, ``alloc``, ``runtime``, ``adapters`` (``kvpolicy.adapters``, the
``adapters/`` folder), then the front ends: ``lsp``, and ``commands`` with ``cli`` (which start
the language server). The allocator imports base alone (``ONLY``), as docs/architecture.md's
table of layers says. Every ``.py`` under ``kvpolicy/``
and ``adapters/`` is parsed, not imported, and every import is followed: at module
level, inside functions, under ``TYPE_CHECKING``, relative, and by
``importlib.import_module("...")`` or ``__import__("...")``. The one exception is the
layering rule's own: ``kvpolicy/__init__.py`` may hand on the public API lazily (in
its ``__getattr__``). Within a layer, modules import each other in no circle.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = ("base", "policy", "lint", "evaluate", "alloc", "runtime", "adapters", "lsp", "commands")
"""Bottom to top: a module may import its own layer and those below it, but where ``ONLY`` says less."""
ONLY = {"alloc": ("base",)}
"""Layers that may import fewer than every layer below: the allocator knows nothing of policies
or their evaluation, so an engine's memory path can be read (and run) without them."""
_PACKAGE_LAYERS = {
    "kvpolicy.policy": "policy",
    "kvpolicy.grammar": "policy",  # the grammar file the parser reads
    "kvpolicy.lint": "lint",
    "kvpolicy.evaluate": "evaluate",
    "kvpolicy.alloc": "alloc",
    "kvpolicy.runtime": "runtime",
    "kvpolicy.adapters": "adapters",
    "adapters": "adapters",  # the same folder, imported from the repository root
    "kvpolicy.commands": "commands",
    "kvpolicy.cli": "commands",
    "kvpolicy.__main__": "commands",  # python -m kvpolicy: the CLI
    "kvpolicy.lsp": "lsp",  # the editors' front end, below the CLI's (kvpolicy lsp starts it)
}

def layer_of(module: str) -> str | None:
    """The layer of a kvpolicy module (None: not kvpolicy's)."""
    for prefix, layer in sorted(_PACKAGE_LAYERS.items(), key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return layer
    if module == "kvpolicy" or (module.startswith("kvpolicy.") and module.count(".") == 1):
        return "base"
    return None


def _modules() -> dict[str, Path]:
    """Every module under kvpolicy/ and adapters/, by its name in the installed package."""
    found: dict[str, Path] = {}
    for folder, package in (("kvpolicy", "kvpolicy"), ("adapters", "kvpolicy.adapters"), ("grammar", "kvpolicy.grammar")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _canonical(module: str) -> str:
    """``adapters.x`` (imported from the repository root) is the module ``kvpolicy.adapters.x``."""
    return "kvpolicy." + module if module == "adapters" or module.startswith("adapters.") else module


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    lazy_api = _lazy_public_api(module, tree)
    for node in ast.walk(tree):
        if node in lazy_api:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _canonical(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module, node.level, package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), node.lineno
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield _canonical(arg.value), node.lineno


def _resolve(name: str | None, level: int, package: str) -> str:
    if level == 0:
        return _canonical(name or "")
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _lazy_public_api(module: str, tree: ast.Module) -> set[ast.AST]:
    """The import nodes inside ``kvpolicy/__init__.py``'s ``__getattr__``."""
    if module != "kvpolicy":
        return set()
    return {
        inner
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        for inner in ast.walk(node)
        if isinstance(inner, (ast.Import, ast.ImportFrom))
    }


def may_import(layer: str) -> tuple[str, ...]:
    """The layers a module of ``layer`` may import: its own, and those below it or in ``ONLY``."""
    below = LAYERS[: LAYERS.index(layer)]
    return (layer, *ONLY.get(layer, below))


def _forbidden_edges() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a layer the importer's may not import."""
    edges = set()
    for module, path in MODULES.items():
        allowed = may_import(layer_of(module))
        for imported, line in _imports(module, path):
            layer = layer_of(imported)
            if layer is not None and layer not in allowed:
                edges.add((module, imported, line))
    return sorted(edges)


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 100
    assert [m for m in MODULES if layer_of(m) is None] == []
    assert layer_of("kvpolicy.catalogue") == "base" and layer_of("kvpolicy.cli") == "commands"
    assert layer_of("adapters.common") == layer_of("kvpolicy.adapters.vllm_adapter.plugin") == "adapters"
    assert layer_of("kvpolicy.lsp.server") == "lsp"


def test_the_rule_is_the_documented_one() -> None:
    """Each layer may import what docs/architecture.md's table says: the allocator base alone, the
    language server nothing of the commands, a command the language server (to start it)."""
    assert may_import("alloc") == ("alloc", "base")
    assert "evaluate" in may_import("runtime") and "alloc" in may_import("runtime")
    assert "commands" not in may_import("lsp") and "lsp" in may_import("commands")
    assert may_import("base") == ("base",)


def test_no_import_points_up() -> None:
    forbidden = _forbidden_edges()
    assert forbidden == [], "\n".join(f"{MODULES[a].relative_to(ROOT)}:{line}: {a} imports {b}" for a, b, line in forbidden)


def test_no_module_imports_itself_back() -> None:
    """Within a layer too, imports form no circle: a module can be read, tested and moved with what is
    below it, and no import order decides whether a name is defined yet. Lazy imports count."""
    graph = {m: {i for i, _ in _imports(m, p) if i in MODULES and i != m} for m, p in MODULES.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Each way of importing is found: the walk cannot miss an upward edge by its form."""
    source = '''
import importlib
from typing import TYPE_CHECKING
from . import model
from ..lint import engine
if TYPE_CHECKING:
    from kvpolicy.runtime.controller import Controller
def later():
    import kvpolicy.alloc.arena
    importlib.import_module("kvpolicy.commands.lint")
    __import__("adapters.common")
'''
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    found = {name for name, _ in _imports("kvpolicy.policy.probe", path)}
    assert {
        "kvpolicy.policy.model", "kvpolicy.lint.engine", "kvpolicy.runtime.controller", "kvpolicy.alloc.arena",
        "kvpolicy.commands.lint", "kvpolicy.adapters.common",
    } <= found
