"""The client's and the shared package's modules: no import cycles (every import statement
counted, TYPE_CHECKING and function-local ones too), none over 700 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = [REPO / "client" / "privtrain", REPO / "common" / "privtrain_common"]
MOST_LINES = 700


def _module_name(path: Path, package: Path) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports (``from a import b`` counts ``a.b`` when b is a module)."""
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            graph[name].update(target for target in targets if target in modules and target != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.name)
def test_no_import_cycles(package: Path) -> None:
    assert _cycles(_import_graph(package)) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check above would pass vacuously if it found none where one is."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.name)
def test_no_module_over_700_lines(package: Path) -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in package.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}
