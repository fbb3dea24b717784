"""The DP engine takes every catalogue constant as an argument: no module of dp/ imports algorithms."""

from __future__ import annotations

import ast
from pathlib import Path

OPTIMIZERS = Path(__file__).resolve().parents[3] / "dp"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_optimizer_module_imports_the_catalogue() -> None:
    modules = sorted(OPTIMIZERS.rglob("*.py"))
    assert len(modules) > 10  # the scan really sees the package
    offenders = {
        str(path.relative_to(OPTIMIZERS)): sorted(
            n for n in _imported_modules(path) if n == "algorithms" or n.startswith("algorithms.")
        )
        for path in modules
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_scan_recognises_a_catalogue_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import torch\nfrom algorithms.kl_family.definition import units_for\nimport algorithms\n")
    assert {"algorithms.kl_family.definition", "algorithms"} <= _imported_modules(module)
