"""The package's structure: where SymPy's private internals may be used, and no import cycles.

Both tests read the source with ``ast``; nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "symattn"

# The one module allowed to touch SymPy's private internals.
SYMPY_MODULE = "symattn.numbers.sympy_internals"

# SymPy's private attributes that symattn has used (and keeps in symattn.numbers.sympy_internals): reading or
# setting any of them elsewhere is a use of SymPy internals.
SYMPY_PRIVATE_ATTRIBUTES = frozenset({
    "_fromrep", "_rep", "_args", "_mhash", "_assumptions", "_from_args", "_addsort",
    "_to_mpmath", "_hashable_content", "_rows", "_cols", "_dfm",
})


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name: its __init__)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def _sympy_internals(tree: ast.AST) -> list[tuple[int, str]]:
    """The uses of SymPy internals in a module: imports from a ``sympy`` module path with a
    component starting with ``_`` (or of a private name from sympy), and the private attributes
    above on anything."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "sympy":
                if any(p.startswith("_") for p in parts[1:]):
                    found.append((node.lineno, f"from {node.module} import ..."))
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append((node.lineno, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "sympy" and any(p.startswith("_") for p in parts[1:]):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute) and node.attr in SYMPY_PRIVATE_ATTRIBUTES:
            found.append((node.lineno, f".{node.attr}"))
    return found


def _internals_outside_the_sympy_module() -> list[str]:
    problems = []
    for name, path in _modules().items():
        if name == SYMPY_MODULE:
            continue
        for line, what in _sympy_internals(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {what}")
    return problems


def test_only_the_sympy_module_imports_sympy_internals():
    problems = _internals_outside_the_sympy_module()
    assert not problems, (
        "SymPy's private internals are used outside symattn/numbers/sympy_internals.py (put them there, behind a"
        " small function):\n  " + "\n  ".join(problems)
    )


@pytest.mark.parametrize("source", [
    "from sympy.core.add import _addsort",
    "from sympy.polys.matrices._dfm import DFM",
    "import sympy.polys.matrices._dfm",
    "def f(m):\n    return m._rep",
    "def f(cls, rep):\n    return sympy.ImmutableDenseMatrix._fromrep(rep)",
    "x = sympy.Add._from_args(args)",
    "obj._mhash = None",
])
def test_the_internals_checker_sees_such_uses(source):
    """The check above is not vacuous."""
    assert _sympy_internals(ast.parse(source)), source


def test_the_internals_checker_leaves_public_sympy_alone():
    source = "import sympy\nfrom sympy import QQ\nfrom sympy.polys.matrices import DomainMatrix\nx = m.rows\n"
    assert not _sympy_internals(ast.parse(source))


# -- import cycles ----------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import and ImportFrom in the module, in functions too, but not under ``if TYPE_CHECKING:``."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            yield node


def _targets(node: ast.stmt, importer: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules an import statement in module ``importer`` reaches."""
    targets: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in modules:  # import symattn.render.grid -> that module
                name = name.rpartition(".")[0]
            if name:
                targets.add(name)
        return targets
    if node.level:
        base = importer if _is_package(importer, modules) else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    if module not in modules:
        return targets
    for alias in node.names:
        if f"{module}.{alias.name}" in modules:
            targets.add(f"{module}.{alias.name}")  # from . import _exact -> symattn.exact.matrices
        else:
            targets.add(module)  # from .render import render_latex -> symattn.render (its __init__)
    return targets


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree):
            graph[name] |= _targets(node, name, modules)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of the graph's strongly connected components with more than one module (or a
    self-import): the shortest through each of their modules, each a list of modules that starts
    and ends with the same one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for component in components:
        members = set(component)
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        seen = set()
        for start in component:  # the shortest cycle through each module of the component
            cycle = _shortest_cycle(graph, members, start)
            first = cycle.index(min(cycle[:-1]))
            key = tuple(cycle[first:-1] + cycle[:first])
            if key not in seen:
                seen.add(key)
                cycles.append(list(key) + [key[0]])
    return cycles


def _shortest_cycle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself through ``members`` (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    for cycle in cycles:
        print("import cycle:", " -> ".join(cycle))
    assert not cycles, "import cycles among symattn's modules:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles():
    """The check above is not vacuous."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert sorted(map(tuple, _cycles(graph))) == [("a", "b", "c", "a"), ("d", "d")]
    graph = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}
    assert sorted(map(tuple, _cycles(graph))) == [("a", "b", "a"), ("a", "c", "a")]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_resolves_relative_and_function_level_imports():
    modules = {"symattn": Path("symattn/__init__.py"), "symattn.render": Path("symattn/render/__init__.py"),
               "symattn.render._grid": Path("symattn/render/_grid.py"), "symattn._exact": Path("symattn/_exact.py"),
               "symattn.derivation": Path("symattn/derivation.py"), "symattn.check": Path("symattn/check.py")}
    source = ("from . import _exact\n"
              "def f():\n    from .render import x\n"
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from .derivation import Derivation\n")
    targets = set()
    for node in _imports(ast.parse(source)):
        targets |= _targets(node, "symattn.check", modules)
    assert targets == {"symattn._exact", "symattn.render"}
    node = ast.parse("from .._exact import LazyMatrix").body[0]
    assert _targets(node, "symattn.render.json", modules) == {"symattn._exact"}
    node = ast.parse("from ._grid import shown").body[0]
    assert _targets(node, "symattn.render", modules) == {"symattn.render._grid"}
