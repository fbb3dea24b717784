"""A job's stored spec is read through its typed view (kernel/schemas/stored_spec.py), never by key.

The scan walks the server packages' syntax trees for ``spec["…"]``, ``spec.get(…)``, ``"…" in spec``
and ``{**spec, …}`` on anything named ``spec`` or ``*_spec`` (a variable, a parameter, ``job.spec``,
``plan.spec``): outside kernel/schemas, each reads or rebuilds the stored dict by hand, bypassing
the view's validation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

REPO = Path(__file__).resolve().parents[2]
SERVER_PACKAGES: Final[tuple[str, ...]] = ("kernel", "api", "admin", "algorithms", "dp", "training", "worker")
SCHEMAS: Final[str] = "kernel/schemas/"
"""The one place that knows the stored dict's keys."""


def _names_a_spec(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and (name == "spec" or name.endswith("_spec"))


def _reads_by_key(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):  # spec["model"]
        return _names_a_spec(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # spec.get("init")
        return node.func.attr in {"get", "setdefault", "pop", "items", "keys", "values"} and _names_a_spec(
            node.func.value
        )
    if isinstance(node, ast.Dict):  # {**job.spec, ...}: a spec rebuilt by hand
        return any(key is None and _names_a_spec(value) for key, value in zip(node.keys, node.values, strict=True))
    if isinstance(node, ast.Compare):  # "tuning" in spec
        return any(
            isinstance(op, (ast.In, ast.NotIn)) and _names_a_spec(right)
            for op, right in zip(node.ops, node.comparators, strict=True)
        )
    return False


def spec_reads(source: str) -> Iterator[tuple[int, str]]:
    """(line, code) of every by-key read of a spec in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if _reads_by_key(node):
            yield getattr(node, "lineno", 0), ast.unparse(node)


def _excluded(relative: str) -> bool:
    return relative.startswith(SCHEMAS)


def _server_modules() -> Iterator[tuple[str, str]]:
    for package in SERVER_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")


def test_no_spec_is_read_by_key_outside_the_schemas() -> None:
    found = [
        f"{relative}:{line}: {code}"
        for relative, source in _server_modules()
        if not _excluded(relative)
        for line, code in spec_reads(source)
    ]
    assert found == [], "read these through kernel.schemas.stored_spec.stored_spec(job):\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_read() -> None:
    """The scan would pass vacuously if it missed these."""
    source = """
a = job.spec["model"]["params"]
b = plan.spec.get("init")
c = "tuning" not in job.spec
d = stored_spec["training"]
e = spec.get("tuning")
f = {**job.spec}
g = stored_spec(job).model.params
h = job.spec
"""
    assert sorted(line for line, _ in spec_reads(source)) == [2, 3, 4, 5, 6, 7]
