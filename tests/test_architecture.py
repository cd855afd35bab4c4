"""The package's structure: where SymPy's private internals may be used, no import cycles, the
direction of the imports between packages, the sizes of modules, functions and classes, and
private names kept private.

The tests read the source with ``ast``; nothing is imported or run.

``python tests/test_architecture.py --graph`` prints the import graph between the packages
(which package imports which, and how many import statements, counting those inside functions
and under ``TYPE_CHECKING``), ordered by the layers below, with each backward import marked.
"""

from __future__ import annotations

import argparse
import ast
import functools
from collections import Counter
from dataclasses import dataclass
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


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> ast.Module:
    """A module's syntax tree, read once for all the tests (none of them changes it)."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


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
        for line, what in _sympy_internals(_parsed(path)):
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


def _from_module(node: ast.ImportFrom, importer: str, modules: dict[str, Path]) -> str:
    """The dotted name of the module a ``from ... import`` in module ``importer`` reads from."""
    if not node.level:
        return node.module or ""
    base = importer if _is_package(importer, modules) else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


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
    module = _from_module(node, importer, modules)
    if module not in modules:
        return targets
    for alias in node.names:
        if f"{module}.{alias.name}" in modules:
            targets.add(f"{module}.{alias.name}")  # from . import lazy -> symattn.exact.lazy
        else:
            targets.add(module)  # from .render import render_latex -> symattn.render (its __init__)
    return targets


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = _parsed(path)
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


# -- the direction of the imports between packages --------------------------------------------

# The layers, in order: a module may import (at the top, inside a function or under
# TYPE_CHECKING) only modules of its own layer or of an earlier one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("symattn.errors", "symattn.text", "symattn.reading", "symattn.writing", "symattn.callable_package",
                    "symattn.numbers")),
    ("problem", ("symattn.problem",)),
    ("stages", ("symattn.stages",)),
    ("exact", ("symattn.exact",)),
    ("reference", ("symattn.reference",)),
    ("render", ("symattn.render",)),
    ("check", ("symattn.check",)),
    ("generate", ("symattn.generate",)),
    ("lms", ("symattn.lms",)),
    ("cli", ("symattn.cli",)),
)
# The API layer on top of them all: exactly these two modules (symattn/__init__.py, symattn/__main__.py).
API = ("symattn", "symattn.__main__")
PACKAGES = tuple(package for _, packages in LAYERS for package in packages) + API

TOP_LEVEL, IN_A_FUNCTION, UNDER_TYPE_CHECKING = "top level", "in a function", "under TYPE_CHECKING"
BY_NAME = "by name"  # a module named in a string for importlib.import_module: imported when first used


def _package(name: str) -> str | None:
    """The package of PACKAGES a module belongs to (None if it is in none)."""
    if name in API:
        return name
    return next((p for p in PACKAGES[:-len(API)] if name == p or name.startswith(p + ".")), None)


def _layer(name: str) -> int | None:
    """The index of a module's layer in LAYERS (len(LAYERS) for the API; None if it is in none)."""
    package = _package(name)
    if package is None:
        return None
    if package in API:
        return len(LAYERS)
    return next(k for k, (_, packages) in enumerate(LAYERS) if package in packages)


@dataclass(frozen=True)
class Import:
    """One module of the package imported by another, at one import statement."""

    importer: str  # dotted module names
    target: str
    file: str  # the importer's file, from the repository's root
    line: int
    where: str  # TOP_LEVEL, IN_A_FUNCTION, UNDER_TYPE_CHECKING or BY_NAME


def _every_import(tree: ast.AST):
    """(node, where) for every Import and ImportFrom of a module, at the top, in a function (or a
    method) or under ``if TYPE_CHECKING:``."""
    def visit(node: ast.AST, where: str):
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(node, ast.If) and _is_type_checking(node.test) and any(child is b for b in node.body):
                inner = UNDER_TYPE_CHECKING
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and where == TOP_LEVEL:
                inner = IN_A_FUNCTION
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, inner
            yield from visit(child, inner)

    yield from visit(tree, TOP_LEVEL)


def _shown(path: Path) -> str:
    """A module's file as a message names it: from the repository's root."""
    try:
        return path.relative_to(PACKAGE.parent).as_posix()
    except ValueError:
        return path.as_posix()


def _imported_by_name(name: str, tree: ast.AST, modules: dict[str, Path]):
    """(string constant, module) for the package's modules that module ``name`` names in a string,
    if it calls ``import_module`` (or ``__import__``): the names it may import when first used,
    such as ``{"render_json": ".json"}``. A relative name is resolved against the module's package
    (``__package__``, which is ``__name__`` in a package's ``__init__``)."""
    importers = {"__import__"} | {alias.asname or alias.name for node in ast.walk(tree)
                                  if isinstance(node, ast.ImportFrom) and node.module == "importlib"
                                  for alias in node.names if alias.name == "import_module"}
    calls = any(isinstance(node, ast.Call) and (getattr(node.func, "id", None) in importers
                                                 or getattr(node.func, "attr", None) == "import_module")
                for node in ast.walk(tree))
    if not calls:
        return
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip("."):
            text = node.value
            if text.startswith("."):
                level = len(text) - len(text.lstrip("."))
                base = package
                for _ in range(level - 1):
                    base = base.rpartition(".")[0]
                text = f"{base}.{text[level:]}"
            if text in modules:
                yield node, text


def _imports_of(name: str, path: Path, tree: ast.AST, modules: dict[str, Path]) -> list[Import]:
    """The package's modules that module ``name`` imports, one Import per statement and module
    (and per module it names for ``import_module``)."""
    found = []
    for node, where in _every_import(tree):
        for target in sorted(_targets(node, name, modules)):
            if target != name:
                found.append(Import(name, target, _shown(path), node.lineno, where))
    for node, target in _imported_by_name(name, tree, modules):
        if target != name:
            found.append(Import(name, target, _shown(path), node.lineno, BY_NAME))
    return found


def _package_imports() -> list[Import]:
    modules = _modules()
    found = []
    for name, path in modules.items():
        found += _imports_of(name, path, _parsed(path), modules)
    return found


def _backward_imports(imports: list[Import]) -> list[str]:
    """Each import of a module of a later layer, or from or of a module in no layer, as ``file:line: a -> b``."""
    problems = []
    for imp in imports:
        a, b = _layer(imp.importer), _layer(imp.target)
        if a is None or b is None:
            problems.append(f"{imp.file}:{imp.line}: {imp.importer} -> {imp.target} (a module in no layer of LAYERS)")
        elif b > a:
            problems.append(f"{imp.file}:{imp.line}: {imp.importer} -> {imp.target}")
    return problems


def package_graph(imports: list[Import]) -> list[str]:
    """The import graph between the packages, a line per importing and imported package, in the
    order of the layers: the import statements (and names for ``import_module``), how many at the
    top, in functions, under TYPE_CHECKING and by name, and ``BACKWARD`` where the imported
    package is of a later layer."""
    counts: dict[tuple[str, str], Counter] = {}
    for imp in imports:
        a = _package(imp.importer) or imp.importer
        b = _package(imp.target) or imp.target
        if a != b:
            counts.setdefault((a, b), Counter())[imp.where] += 1

    def order(package: str) -> tuple[int, str]:
        return (PACKAGES.index(package), "") if package in PACKAGES else (len(PACKAGES), package)

    pairs = sorted(counts, key=lambda pair: (order(pair[0]), order(pair[1])))
    width = max((len(f"{a} -> {b}") for a, b in pairs), default=0)
    lines = [f"symattn's imports between packages: import statements, and module names for import_module"
             f" ({TOP_LEVEL}, {IN_A_FUNCTION}, {UNDER_TYPE_CHECKING}, {BY_NAME});"
             " layers: " + " -> ".join(n for n, _ in LAYERS) + " -> API"]
    for a, b in pairs:
        c = counts[a, b]
        layers = _layer(a), _layer(b)
        mark = "  BACKWARD" if None in layers or layers[1] > layers[0] else ""
        lines.append(f"  {f'{a} -> {b}':<{width}}  {sum(c.values()):4d}  "
                     f"({c[TOP_LEVEL]}, {c[IN_A_FUNCTION]}, {c[UNDER_TYPE_CHECKING]}, {c[BY_NAME]}){mark}")
    return lines


def test_every_module_is_in_a_layer():
    outside = [_shown(path) for name, path in _modules().items() if _layer(name) is None]
    assert not outside, "modules in no layer of LAYERS (add their package there):\n  " + "\n  ".join(outside)


def test_imports_go_from_later_layers_to_earlier_ones():
    imports = _package_imports()
    problems = _backward_imports(imports)
    for line in problems:
        print("backward import:", line)
    assert not problems, (
        "a module imports only modules of its own layer or an earlier one ("
        + " -> ".join(n for n, _ in LAYERS) + " -> API), counting imports in functions and under TYPE_CHECKING;"
        " these go backward:\n  " + "\n  ".join(problems) + "\n\n" + "\n".join(package_graph(imports))
    )


def _synthetic_modules(*names: str) -> dict[str, Path]:
    modules = {}
    for name in ("symattn",) + names:
        path = name.replace(".", "/")
        is_package = name == "symattn" or any(other.startswith(name + ".") for other in names)
        modules[name] = Path(path + "/__init__.py" if is_package else path + ".py")
    return modules


def test_the_direction_check_sees_backward_imports():
    """The check above is not vacuous: a backward import at the top, in a function and under
    TYPE_CHECKING is each caught, by file and line; forward ones are not."""
    modules = _synthetic_modules("symattn.errors", "symattn.problem", "symattn.problem.core", "symattn.exact",
                                 "symattn.exact.derivation", "symattn.render", "symattn.render.latex",
                                 "symattn.misc", "symattn.cli")
    source = ("from ..errors import SymattnError\n"          # 1: foundation, earlier: fine
              "from ..problem import core\n"                 # 2: earlier: fine
              "from . import derivation\n"                   # 3: itself
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n"
              "    from ..render.latex import render_latex\n"  # 6: later
              "def f():\n"
              "    from ..render import latex\n"             # 8: later
              "    import symattn\n"                         # 9: the API layer
              "from symattn.cli import main\n")              # 10: later
    tree = ast.parse(source)
    imports = _imports_of("symattn.exact.derivation", modules["symattn.exact.derivation"], tree, modules)
    assert _backward_imports(imports) == [
        "symattn/exact/derivation.py:6: symattn.exact.derivation -> symattn.render.latex",
        "symattn/exact/derivation.py:8: symattn.exact.derivation -> symattn.render.latex",
        "symattn/exact/derivation.py:9: symattn.exact.derivation -> symattn",
        "symattn/exact/derivation.py:10: symattn.exact.derivation -> symattn.cli",
    ]
    assert {(i.line, i.where) for i in imports} >= {(1, TOP_LEVEL), (6, UNDER_TYPE_CHECKING), (8, IN_A_FUNCTION)}
    forward = _imports_of("symattn.cli", modules["symattn.cli"],
                          ast.parse("from .render import latex\nfrom .exact.derivation import derive\n"), modules)
    assert len(forward) == 2 and _backward_imports(forward) == []
    lazy = ('_LAZY = {"latex": "..render.latex", "errors": "symattn.errors", "note": ".tex"}\n'
            "def f(name):\n    return importlib.import_module(_LAZY[name], __package__)\n")
    found = _imports_of("symattn.exact", modules["symattn.exact"], ast.parse(lazy), modules)
    assert {(i.target, i.where) for i in found} == {("symattn.render.latex", BY_NAME), ("symattn.errors", BY_NAME)}
    assert _backward_imports(found) == ["symattn/exact/__init__.py:1: symattn.exact -> symattn.render.latex"]
    not_imported = ast.parse(lazy.replace("import_module", "f"))  # strings alone, nothing imports by them
    assert _imports_of("symattn.exact", modules["symattn.exact"], not_imported, modules) == []
    aliased = lazy.replace("importlib.import_module", "_load") + "from importlib import import_module as _load\n"
    assert _imports_of("symattn.exact", modules["symattn.exact"], ast.parse(aliased), modules) == found
    misc = _imports_of("symattn.misc", modules["symattn.misc"], ast.parse("from .errors import SymattnError\n"), modules)
    assert _backward_imports(misc) == [
        "symattn/misc.py:1: symattn.misc -> symattn.errors (a module in no layer of LAYERS)"]


def test_the_package_graph_counts_imports_by_place():
    imports = [Import("symattn.exact.derivation", "symattn.render.latex", "f", 1, IN_A_FUNCTION),
               Import("symattn.exact.derivation", "symattn.render.json", "f", 2, IN_A_FUNCTION),
               Import("symattn.render.json", "symattn.exact.derivation", "g", 3, UNDER_TYPE_CHECKING),
               Import("symattn.render.json", "symattn.errors", "g", 4, TOP_LEVEL),
               Import("symattn.render.json", "symattn.render.grid", "g", 5, TOP_LEVEL)]  # within a package: not shown
    lines = package_graph(imports)
    assert [line.split() for line in lines[1:]] == [
        ["symattn.exact", "->", "symattn.render", "2", "(0,", "2,", "0,", "0)", "BACKWARD"],
        ["symattn.render", "->", "symattn.errors", "1", "(1,", "0,", "0,", "0)"],
        ["symattn.render", "->", "symattn.exact", "1", "(0,", "0,", "1,", "0)"],
    ]


# -- sizes ------------------------------------------------------------------------------------

MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_CLASS_LINES = 600, 80, 300

# Data tables exempt from the module size: module file -> (the names of its top-level assignments
# that hold only data, why they are data). The module's other lines still count against the limit.
DATA_TABLES: dict[str, tuple[tuple[str, ...], str]] = {}


def _assigned_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        return {n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _oversized(file: str, source: str, tables: tuple[str, ...] = ()) -> list[str]:
    """A module's breaches of the sizes: its lines (less those of its data ``tables``), each
    function's and each class's (from its ``def`` or ``class`` line to its last)."""
    tree = ast.parse(source)
    problems = []
    in_tables, found = 0, set()
    for node in tree.body:
        named = _assigned_names(node) & set(tables)
        if named:
            in_tables += node.end_lineno - node.lineno + 1
            found |= named
    for missing in sorted(set(tables) - found):
        problems.append(f"{file}: {missing}, a data table of DATA_TABLES, is no top-level assignment of the module")
    lines = len(source.splitlines())
    if lines - in_tables > MAX_MODULE_LINES:
        beside = f", {in_tables} of them in data tables" if in_tables else ""
        problems.append(f"{file}: {lines} lines{beside} (limit {MAX_MODULE_LINES})")

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                size = child.end_lineno - child.lineno + 1
                is_class = isinstance(child, ast.ClassDef)
                kind, limit = ("class", MAX_CLASS_LINES) if is_class else ("function", MAX_FUNCTION_LINES)
                if size > limit:
                    problems.append(f"{file}:{child.lineno}: {kind} {name}: {size} lines (limit {limit})")
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return problems


def test_modules_functions_and_classes_are_of_a_readable_size():
    problems = []
    for path in _modules().values():
        file = _shown(path)
        tables = DATA_TABLES.get(file, ((), ""))[0]
        problems += _oversized(file, path.read_text(encoding="utf-8"), tables)
    stale = sorted(set(DATA_TABLES) - {_shown(path) for path in _modules().values()})
    problems += [f"{file}: in DATA_TABLES but no module of the package" for file in stale]
    for line in problems:
        print("too big:", line)
    assert not problems, (
        f"no module over {MAX_MODULE_LINES} lines, no function over {MAX_FUNCTION_LINES}, no class over"
        f" {MAX_CLASS_LINES} (split them into named steps; a table of data may be named in DATA_TABLES):\n  "
        + "\n  ".join(problems))


def test_the_size_check_sees_what_is_too_big():
    """The check above is not vacuous, and it counts what it says it counts."""
    body = "".join(f"    x{k} = {k}\n" for k in range(MAX_FUNCTION_LINES - 1))
    assert _oversized("m.py", "def f():\n" + body) == []                     # exactly the limit
    assert _oversized("m.py", "def f():\n" + body + "    return 0\n") == [
        f"m.py:1: function f: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})"]
    method = "class C:\n    def g(self):\n" + "".join(f"        y{k} = {k}\n" for k in range(MAX_FUNCTION_LINES))
    assert _oversized("m.py", method) == [
        f"m.py:2: function C.g: {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})"]
    big_class = "class C:\n" + "".join(f"    def g{k}(self):\n        return {k}\n" for k in range(MAX_CLASS_LINES // 2))
    assert _oversized("m.py", big_class) == [f"m.py:1: class C: {MAX_CLASS_LINES + 1} lines (limit {MAX_CLASS_LINES})"]
    table = "ROWS = [\n" + "".join(f"    {k},\n" for k in range(MAX_MODULE_LINES)) + "]\n"
    module = table + "def f():\n    return ROWS\n"
    assert _oversized("m.py", module) == [f"m.py: {MAX_MODULE_LINES + 4} lines (limit {MAX_MODULE_LINES})"]
    assert _oversized("m.py", module, ("ROWS",)) == []                        # a data table named as one
    assert _oversized("m.py", module + "x = 1\n" * MAX_MODULE_LINES, ("ROWS",)) == [
        f"m.py: {2 * MAX_MODULE_LINES + 4} lines, {MAX_MODULE_LINES + 2} of them in data tables (limit {MAX_MODULE_LINES})"]
    assert _oversized("m.py", "x = 1\n", ("ROWS",)) == [
        "m.py: ROWS, a data table of DATA_TABLES, is no top-level assignment of the module"]


# -- private names ----------------------------------------------------------------------------


def _is_private(name: str) -> bool:
    """A name with a leading underscore that is not a dunder (``__init__``, ``__file__``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module_files(files: list[Path]) -> list[str]:
    """The module files (and package folders) among ``files`` whose names start with an underscore."""
    return [path.as_posix() for path in files if any(_is_private(part) for part in path.with_suffix("").parts)]


def _module_named(expr: ast.expr, bound: dict[str, str], modules: dict[str, Path]) -> str | None:
    """The package's module an expression names: a name bound by an import, or a submodule of one."""
    if isinstance(expr, ast.Name):
        return bound.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _module_named(expr.value, bound, modules)
        if base is not None and f"{base}.{expr.attr}" in modules:
            return f"{base}.{expr.attr}"
    return None


def _private_uses(name: str, file: str, tree: ast.AST, modules: dict[str, Path]) -> list[str]:
    """Another module's private names that module ``name`` takes: ``from m import _x`` and
    ``m._x`` for a module m of the package, as ``file:line: name -> m._x``."""
    problems = []
    bound: dict[str, str] = {}  # a local name -> the module of the package it is bound to
    for node, _ in _every_import(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    bound[alias.asname] = alias.name
                elif not alias.asname and alias.name.partition(".")[0] in modules:
                    bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
            continue
        module = _from_module(node, name, modules)
        if module not in modules:
            continue
        for alias in node.names:
            if _is_private(alias.name) and module != name:
                problems.append(f"{file}:{node.lineno}: {name} -> {module}.{alias.name}")
            if f"{module}.{alias.name}" in modules:
                bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = _module_named(node.value, bound, modules)
            if owner is not None and owner != name:
                problems.append(f"{file}:{node.lineno}: {name} -> {owner}.{node.attr}")
    return sorted(set(problems), key=lambda p: (int(p.split(":")[1]), p))


def test_no_module_file_starts_with_an_underscore():
    files = [path.relative_to(PACKAGE.parent) for path in sorted(PACKAGE.rglob("*.py"))]
    private = _private_module_files(files)
    assert not private, ("a leading underscore marks a name private to one module; these module files have one"
                         " (give them a name that says their job):\n  " + "\n  ".join(private))


def test_no_module_takes_another_modules_private_names():
    modules = _modules()
    problems = []
    for name, path in modules.items():
        problems += _private_uses(name, _shown(path), _parsed(path), modules)
    for line in problems:
        print("private name:", line)
    assert not problems, ("a module takes another module's private (underscore) names (make them public if they"
                          " are shared):\n  " + "\n  ".join(problems))


def test_the_private_file_check_sees_underscored_files():
    """The check above is not vacuous."""
    files = [Path("symattn/__init__.py"), Path("symattn/__main__.py"), Path("symattn/render/__init__.py"),
             Path("symattn/_exact.py"), Path("symattn/render/_grid.py"), Path("symattn/_old/core.py"),
             Path("symattn/exact/matrices.py")]
    assert _private_module_files(files) == ["symattn/_exact.py", "symattn/render/_grid.py", "symattn/_old/core.py"]


def test_the_private_name_check_sees_private_imports_and_attributes():
    """The check above is not vacuous: it sees ``from m import _x`` (relative or absolute, in a
    function too) and ``m._x`` however m was imported, and leaves a module's own names, dunders
    and other libraries alone."""
    modules = _synthetic_modules("symattn.text", "symattn.render", "symattn.render.display", "symattn.render.grid",
                                 "symattn.reference", "symattn.reference.numeric")
    source = ("from ..text import _grid, excerpt\n"                       # 1
              "from . import grid\n"
              "import symattn.text\n"
              "import symattn.reference.numeric as numeric\n"
              "from symattn import text as t\n"
              "import numpy as np\n"
              "def f(x):\n"
              "    from symattn.reference.numeric import _f64\n"        # 8
              "    return grid._cell(x), symattn.text._normalisers\n"    # 9: two
              "def g():\n"
              "    return numeric._rope, t._width, np._core, _own(), x.__dict__, grid.__file__\n"  # 11: two
              "def _own():\n"
              "    return symattn.render.display._own\n")               # 13: this module's own name
    found = _private_uses("symattn.render.display", "d.py", ast.parse(source), modules)
    assert found == [
        "d.py:1: symattn.render.display -> symattn.text._grid",
        "d.py:8: symattn.render.display -> symattn.reference.numeric._f64",
        "d.py:9: symattn.render.display -> symattn.render.grid._cell",
        "d.py:9: symattn.render.display -> symattn.text._normalisers",
        "d.py:11: symattn.render.display -> symattn.reference.numeric._rope",
        "d.py:11: symattn.render.display -> symattn.text._width",
    ]
    clean = "from ..text import excerpt\nfrom . import grid\ndef f(x):\n    return grid.cell(x), x._private\n"
    assert _private_uses("symattn.render.display", "d.py", ast.parse(clean), modules) == []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="symattn's package structure, read from its source.")
    parser.add_argument("--graph", action="store_true",
                        help="print the import graph between the packages, with counts, in the layers' order")
    args = parser.parse_args(argv)
    if not args.graph:
        parser.print_help()
        return 0
    print("\n".join(package_graph(_package_imports())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
