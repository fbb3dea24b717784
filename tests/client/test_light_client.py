"""The client ships as its own light distribution (``client/``, ``privtrain-client``): the client
and CLI need httpx and click only, and a downloaded model loads with torch and safetensors
alone, with its class list (issue: installing the client pulled 58 packages, and loading a model
needed the server's ``worker`` package)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import torch

from privtrain_common.model_files import save_model
from privtrain_common.zoo.architectures import build_model

CLIENT = Path(__file__).resolve().parents[2] / "client"
SERVER_PACKAGES = {
    "kernel",
    "api",
    "admin",
    "algorithms",
    "dp",
    "training",
    "worker",
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
