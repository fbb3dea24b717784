"""No module-level import cycles anywhere in the first-party code.

The graph is computed from the source: every import outside a function body, ``if TYPE_CHECKING:``
blocks included (a cycle hidden from the interpreter is still a cycle in the design). Its strongly
connected components must each hold one module. Function-local imports stay out of that graph, so
each must say in a comment, on its run of imports or the line above, why it is local: a dependency
on an optional or heavy package that loads only where it is used (never "to dodge a cycle").
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PACKAGE_ROOTS: tuple[tuple[Path, str], ...] = (
    (REPO, "kernel"),
    (REPO, "api"),
    (REPO, "admin"),
    (REPO, "algorithms"),
    (REPO, "dp"),
    (REPO, "training"),
    (REPO, "worker"),
    (REPO / "client", "privtrain"),
    (REPO / "common", "privtrain_common"),
)
"""(folder holding the package, package name): every first-party package, client and common included."""

LOCAL_IMPORT_REASONS = ("optional", "heavy", "only when", "only where", "only after")
"""A function-local import's comment names one of these: what loading it late spares."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class LocalImport:
    module: str
    line: int
    named: tuple[str, ...]
    """The first-party modules the statement names (their packages load too)."""
    comment: str


def discover(roots: tuple[tuple[Path, str], ...]) -> dict[str, Module]:
    """Every module of the packages under ``roots``, by dotted name."""
    modules: dict[str, Module] = {}
    for base, package in roots:
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules[".".join(parts)] = Module(".".join(parts), path, is_package)
    return modules


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module loads, or would under TYPE_CHECKING: outside any
    function body (class bodies and ``if``/``try`` blocks run at import, so they count)."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _function_local_import_runs(tree: ast.Module) -> Iterator[list[ast.Import | ast.ImportFrom]]:
    """Runs of consecutive import statements inside function bodies (one comment above a run
    explains all of it)."""

    def visit(node: ast.AST, inside: bool) -> Iterator[list[ast.Import | ast.ImportFrom]]:
        inside = inside or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for field in ("body", "orelse", "finalbody") if inside else ():
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            run: list[ast.Import | ast.ImportFrom] = []
            for statement in [*statements, None]:
                if isinstance(statement, ast.Import | ast.ImportFrom):
                    run.append(statement)
                elif run:
                    yield run
                    run = []
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inside)

    return visit(tree, False)


def _parsed(path: Path) -> tuple[list[str], ast.Module]:
    source = path.read_text()
    return source.splitlines(), _parse(source)


@functools.cache
def _parse(source: str) -> ast.Module:
    """Each check reads every module; a source is parsed once."""
    return ast.parse(source)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _with_ancestors(name: str, modules: Mapping[str, Module]) -> set[str]:
    """``a.b.c`` loads ``a``, ``a.b`` and ``a.b.c``: the first-party ones among them."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()


def imported_by(module: Module, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Module]) -> set[str]:
    """The first-party modules one import statement loads. ``from pkg import name`` loads
    ``pkg/__init__`` and, when ``pkg.name`` is a module, that submodule too."""
    if isinstance(node, ast.Import):
        return set().union(*(_with_ancestors(alias.name, modules) for alias in node.names))
    source = _absolute(module, node)
    targets = _with_ancestors(source, modules)
    targets.update(f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules)
    return targets


def named_by(module: Module, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Module]) -> set[str]:
    """The modules whose namespace a statement reads: ``import a.b`` names ``a.b``; ``from a import
    name`` names ``a`` unless every name is a submodule of ``a`` (then it names those)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    source = _absolute(module, node)
    submodules = {f"{source}.{alias.name}" for alias in node.names} & modules.keys()
    reads_source = len(submodules) < len(node.names) and source in modules
    return submodules | ({source} if reads_source else set())


def _own_packages(name: str) -> set[str]:
    """A module's enclosing packages: loading it has already begun loading them."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def dependencies(module: Module, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Module]) -> set[str]:
    """What a statement makes ``module`` depend on: the modules it loads, less the module's own
    enclosing packages where they only load on the way (``from kernel.x.a import f`` in
    ``kernel.x.b`` does not need ``kernel/x/__init__`` finished) rather than being read (``from
    kernel.x import f`` does: an ``__init__`` that imports ``kernel.x.b`` before defining ``f`` fails)."""
    loaded = imported_by(module, node, modules) - _own_packages(module.name)
    return (loaded | named_by(module, node, modules)) - {module.name}


def import_graph(modules: Mapping[str, Module], *, function_local: bool = False) -> dict[str, set[str]]:
    """Each module's first-party imports at module level (with ``function_local``, also those
    inside functions)."""
    graph: dict[str, set[str]] = {}
    for name, module in modules.items():
        _, tree = _parsed(module.path)
        statements: list[ast.Import | ast.ImportFrom] = list(_module_level_imports(tree))
        if function_local:
            statements += [node for run in _function_local_import_runs(tree) for node in run]
        graph[name] = set().union(*(dependencies(module, node, modules) for node in statements))
    return graph


def strongly_connected(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iterative (deep import chains would strain the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[frozenset[str]] = []

    def visit(node: str) -> Iterator[str]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return iter(sorted(graph.get(node, ())))

    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, visit(root))]
        while work:
            node, successors = work[-1]
            successor = next((s for s in successors if s not in index or s in on_stack), None)
            if successor is not None:
                if successor in index:
                    low[node] = min(low[node], index[successor])
                else:
                    work.append((successor, visit(successor)))
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while node not in component:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                components.append(frozenset(component))
    return components


def cycles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    return {component for component in strongly_connected(graph) if len(component) > 1}


def local_imports(modules: Mapping[str, Module]) -> list[LocalImport]:
    """Every first-party import inside a function, with the comments on its run of imports and
    on the line above that run."""
    found: list[LocalImport] = []
    for name, module in sorted(modules.items()):
        lines, tree = _parsed(module.path)
        for run in _function_local_import_runs(tree):
            nearby = lines[run[0].lineno - 2 : run[-1].end_lineno or run[-1].lineno]
            comment = " ".join(line.split("#", 1)[1].strip() for line in nearby if "#" in line)
            for node in run:
                if named := named_by(module, node, modules):
                    found.append(LocalImport(name, node.lineno, tuple(sorted(named)), comment))
    return sorted(found, key=lambda local: (local.module, local.line))


# --- the checks on the repository -------------------------------------------------------------------

MODULES = discover(PACKAGE_ROOTS)


@functools.cache
def _graph(*, function_local: bool = False) -> dict[str, set[str]]:
    return import_graph(MODULES, function_local=function_local)


def test_every_package_is_found() -> None:
    assert {name.split(".")[0] for name in MODULES} == {package for _, package in PACKAGE_ROOTS}
    assert {"kernel.storage.blobs", "api.main", "privtrain.client", "privtrain_common.model_files"} <= MODULES.keys()


def test_no_module_level_import_cycles() -> None:
    assert sorted(sorted(cycle) for cycle in cycles(_graph())) == []


def test_each_function_local_import_says_why() -> None:
    unexplained = [
        f"{found.module}:{found.line} imports {', '.join(found.named)}"
        for found in local_imports(MODULES)
        if not any(reason in found.comment.lower() for reason in LOCAL_IMPORT_REASONS)
    ]
    assert unexplained == []


# --- the graph builder on planted packages ------------------------------------------------------------


def _plant(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Module]:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return discover(((tmp_path, "pkg"),))


def test_the_builder_finds_a_planted_cycle(tmp_path: Path) -> None:
    modules = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg.a import thing\n",
            "pkg/e.py": "import pkg.d\n\nclass E:\n    from pkg import c\n",
        },
    )
    graph = import_graph(modules)
    assert (graph["pkg.b"], graph["pkg.e"]) == ({"pkg.c"}, {"pkg.c", "pkg.d"})
    assert cycles(graph) == {frozenset({"pkg.a", "pkg.b", "pkg.c"})}


def test_function_local_imports_stay_off_the_graph_with_their_comment(tmp_path: Path) -> None:
    modules = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": "def f():\n    # heavy: loads only when f runs\n    import json\n\n    from pkg.a import x\n",
        },
    )
    assert cycles(import_graph(modules)) == set()
    assert cycles(import_graph(modules, function_local=True)) == {frozenset({"pkg.a", "pkg.b"})}
    assert local_imports(modules) == [LocalImport("pkg.b", 5, ("pkg.a",), "heavy: loads only when f runs")]


def test_a_package_init_that_re_exports_closes_a_cycle(tmp_path: Path) -> None:
    """``from pkg.sub import name`` loads and reads ``pkg/sub/__init__``: if that ``__init__``
    imports the module back, it is a cycle."""
    modules = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from .a import thing\n",
            "pkg/sub/a.py": "x = 1\n",
            "pkg/sub/b.py": "from pkg.sub.a import x\nfrom pkg.other import y\n",
            "pkg/other.py": "from pkg.sub import thing\n",
        },
    )
    graph = import_graph(modules)
    assert (graph["pkg.other"], graph["pkg.sub"], graph["pkg.sub.b"]) == (
        {"pkg.sub"},
        {"pkg.sub.a"},
        {"pkg.sub.a", "pkg.other"},
    )
    assert cycles(graph) == set()
    modules = _plant(tmp_path, {"pkg/sub/__init__.py": "from .a import thing\nfrom .b import z\n"})
    assert cycles(import_graph(modules)) == {frozenset({"pkg.sub", "pkg.other", "pkg.sub.b"})}


def test_reading_the_own_package_counts_but_passing_through_it_does_not(tmp_path: Path) -> None:
    modules = _plant(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\nVERSION = '1'\n",
            "pkg/a.py": "from pkg.q.c import g\n",
            "pkg/b.py": "from pkg import VERSION, a\n",
            "pkg/q/__init__.py": "",
            "pkg/q/c.py": "",
        },
    )
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.q", "pkg.q.c"}
    assert graph["pkg.b"] == {"pkg", "pkg.a"}
    modules = _plant(tmp_path, {"pkg/a.py": "from pkg import VERSION\n"})
    assert cycles(import_graph(modules)) == {frozenset({"pkg", "pkg.a"})}
