"""The client ships as its own light distribution (``client/``, ``privtrain-client``): the client
and CLI need httpx and click only, and a downloaded model loads with torch and safetensors
alone, with its class list (issue: installing the client pulled 58 packages, and loading a model
needed the server's ``worker`` package). The client and the server share only
``privtrain-common``: neither imports the other."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from privtrain_common.model_files import save_model
from privtrain_common.zoo.architectures import build_model

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "client"
SERVER_CODE = ("kernel", "api", "admin", "algorithms", "dp", "training", "worker")
MOST_CLIENT_DISTRIBUTIONS = 20
SERVER_PACKAGES = {
    *SERVER_CODE,
    "fastapi",
    "starlette",
    "sqlalchemy",
    "celery",
    "kombu",
    "scipy",
    "alembic",
    "pydantic",
    "prv_accountant",
    "matplotlib",
    "numpy",
}


def _imported_top_levels(code: str) -> set[str]:
    """Top-level packages imported after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=CLIENT)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_distribution_declares_only_the_client_needs() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "privtrain-client"
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == ["click", "httpx", "privtrain-common"]
    assert project["optional-dependencies"]["model"] == ["privtrain-common[model]"]
    common = tomllib.loads((CLIENT.parent / "common" / "pyproject.toml").read_text())["project"]
    assert common["dependencies"] == []  # what the client shares with the server costs it nothing
    assert sorted(d.split(">")[0] for d in common["optional-dependencies"]["model"]) == ["safetensors", "torch"]
    # Transformers only for the `hf` models, in an extra of its own.
    assert sorted(d.split(">")[0] for d in common["optional-dependencies"]["hf"]) == [
        "privtrain-common[model]",
        "transformers",
    ]
    assert project["optional-dependencies"]["hf"] == ["privtrain-common[hf]"]
    assert project["scripts"] == {"privtrain": "privtrain.cli:main"}


def test_the_client_and_cli_import_nothing_of_the_server() -> None:
    imported = _imported_top_levels("import privtrain, privtrain.cli, privtrain.client, privtrain.sse")
    assert not imported & (SERVER_PACKAGES | {"torch", "safetensors"}), imported & SERVER_PACKAGES


def test_load_model_needs_only_torch_and_safetensors_and_gives_the_classes(tmp_path: Path) -> None:
    model = build_model(
        "mlp", {"hidden_sizes": [4]}, input_shape=(3,), n_outputs=2, generator=torch.Generator().manual_seed(0)
    )
    path = tmp_path / "model.safetensors"
    save_model(
        path,
        model,
        config={
            "format_version": 1,
            "model": {"name": "mlp", "params": {"hidden_sizes": [4]}},
            "input_shape": [3],
            "n_outputs": 2,
            "task": "classification",
            "classes": ["benign", "malignant"],
        },
    )
    code = (
        f"import privtrain, torch\nloaded = privtrain.load_model({str(path)!r})\n"
        "assert loaded.classes == ['benign', 'malignant'] and loaded.task == 'classification'\n"
        "model, config = loaded\nassert model(torch.zeros(1, 3)).shape == (1, 2)"
    )
    imported = _imported_top_levels(code)
    assert {"torch", "safetensors", "privtrain", "privtrain_common"} <= imported
    assert not imported & SERVER_PACKAGES - {"numpy"}, imported & SERVER_PACKAGES  # torch may bring numpy


def _required_distributions(name: str) -> set[str]:
    """``name`` and every distribution it requires, recursively, as installed here: extras left
    out, other markers (a Python version, Windows only) evaluated for this interpreter."""
    found: set[str] = set()
    pending = [canonicalize_name(name)]
    while pending:
        current = pending.pop()
        if current in found:
            continue
        found.add(current)
        for text in importlib.metadata.requires(current) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return found


def test_installing_the_client_installs_at_most_twenty_distributions() -> None:
    installed = _required_distributions("privtrain-client")
    assert {"privtrain-client", "privtrain-common", "httpx", "click"} <= installed
    assert len(installed) <= MOST_CLIENT_DISTRIBUTIONS, sorted(installed)
    assert not installed & {"torch", "safetensors", "pydantic", "fastapi", "numpy", "privtrain"}, sorted(installed)


def test_the_distribution_count_follows_requirements_recursively() -> None:
    """The count above would pass vacuously if it stopped at the first level."""
    assert {"httpcore", "h11", "anyio", "idna", "certifi"} <= _required_distributions("httpx")
    assert "pyyaml" not in _required_distributions("privtrain-client")  # an extra, not installed with it


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names: at module level, under TYPE_CHECKING,
    or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _importers(folders: list[Path], forbidden: set[str]) -> dict[str, list[str]]:
    """Each module under ``folders`` that imports a top-level package in ``forbidden``, with those imports."""
    offenders: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            bad = sorted(name for name in _imported_modules(path) if name.split(".")[0] in forbidden)
            if bad:
                offenders[str(path.relative_to(REPO))] = bad
    return offenders


def test_no_client_module_imports_the_server_even_lazily() -> None:
    assert _importers([CLIENT / "privtrain"], set(SERVER_CODE)) == {}


def test_the_server_never_imports_the_client() -> None:
    """The server may import ``privtrain_common`` (a top-level package of its own), never ``privtrain``."""
    assert _importers([REPO / package for package in SERVER_CODE], {"privtrain"}) == {}


def test_the_shared_package_imports_nothing_first_party() -> None:
    assert _importers([REPO / "common" / "privtrain_common"], {*SERVER_CODE, "privtrain"}) == {}


def test_the_import_scan_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The scans above would pass vacuously if they missed imports inside functions or blocks."""
    module = tmp_path / "module.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from privtrain.client import Client\n"
        "def serve() -> None:\n    import kernel.config\n"
    )
    assert _imported_modules(module) >= {"privtrain.client", "kernel.config"}


def test_the_zoo_table_needs_neither_torch_nor_pydantic() -> None:
    """The service validates jobs against the zoo's table without torch; the client, which has no
    pydantic, may read it too."""
    imported = _imported_top_levels("import privtrain_common.zoo.catalogue")
    assert not imported & {"torch", "safetensors", "pydantic", *SERVER_CODE, "privtrain"}, imported
