"""The image zoo through the API and the worker: listed, sized at submission, trained end to end.

A small numeric NPZ with X of shape (n, 3, 8, 8) (channels-first, as cnn2-gn reads it) stands in
for images; the jobs run in the worker's JobRunner with ghost clipping and the released model
loads with privtrain.load_model.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import load_model
from tests.conftest import counts, dp_sgd_spec, upload
from worker.runner import JobRunner

TINY = {
    "wrn": {"depth": 10, "width": 1, "groups": 4},
    "vit": {"patch_size": 4, "dim": 8, "depth": 1, "heads": 2, "mlp_dim": 16},
    "resnet-gn": {"blocks": [1, 1], "width": 4, "groups": 2},
    "cnn": {"channels": [4, 8], "groups": 2},
}


@pytest.fixture
def images_id(alice: TestClient) -> str:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(buffer, X=rng.random((60, 3, 8, 8), dtype=np.float32), y=rng.integers(0, 3, 60))
    response = upload(alice, buffer.getvalue(), name="tiny-images", format="npz", label_column=None, delta=1e-3)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _spec(dataset_id: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = dp_sgd_spec(dataset_id, target_epsilon=4.0)
    spec["model"] = {"name": name, "params": params}
    spec["training"] = {"steps": 2, "batch_size": 16, "learning_rate": 0.1}
    return spec


def test_the_zoo_is_listed_with_its_params_schema(alice: TestClient) -> None:
    items = {m["name"]: m for m in alice.get("/v1/models").json()["items"]}
    assert items["wrn"]["defaults"] == {"depth": 16, "width": 4, "groups": 16, "weight_standardisation": True}
    assert set(items["vit"]["params_schema"]["properties"]) == {"patch_size", "dim", "depth", "heads", "mlp_dim"}
    assert items["resnet-gn"]["defaults"]["blocks"] == [2, 2, 2, 2]
    assert items["cnn"]["params_schema"]["additionalProperties"] is False


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_zoo_jobs_are_accepted_and_sized(alice: TestClient, images_id: str, name: str) -> None:
    response = alice.post("/v1/jobs/estimate", json=_spec(images_id, name, TINY[name]))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("name", "params", "fragment"),
    [
        ("wrn", {"depth": 40, "width": 20}, "trainable parameters"),
        ("vit", {"patch_size": 1, "dim": 1024, "depth": 8, "heads": 8, "mlp_dim": 4096}, "trainable parameters"),
        ("vit", {"patch_size": 3}, "must divide the image size"),
        ("wrn", {"depth": 11}, "6k + 4"),
    ],
)
def test_oversized_or_mismatched_configs_are_refused_and_store_nothing(
    alice: TestClient, images_id: str, database: Database, name: str, params: dict[str, Any], fragment: str
) -> None:
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=_spec(images_id, name, params))
        assert response.status_code == 422, response.text
        assert response.json()["type"] == "/problems/model-incompatible"
        assert fragment in response.json()["detail"]
    assert counts(database) == (0, 0)


@pytest.mark.parametrize("name", ["wrn", "vit"])
def test_tiny_zoo_job_trains_through_the_worker(
    alice: TestClient, images_id: str, settings: Settings, database: Database, tmp_path: Path, name: str
) -> None:
    job = alice.post("/v1/jobs", json=_spec(images_id, name, TINY[name])).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    path = tmp_path / "model.safetensors"
    path.write_bytes(alice.get(f"/v1/jobs/{job['id']}/model").content)
    model, _ = load_model(path)
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 3)


def test_wrn_trains_on_an_uploaded_uint8_image_dataset(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    """Images uploaded channels-last (n, H, W, C) reach the model as (C, H, W)."""
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    np.savez(buffer, X=rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8), y=rng.integers(0, 2, 40))
    response = upload(alice, buffer.getvalue(), name="uint8-images", format="npz", label_column=None, delta=1e-3)
    assert response.status_code == 201, response.text
    assert response.json()["feature_shape"] == [3, 8, 8]
    job = alice.post("/v1/jobs", json=_spec(response.json()["id"], "wrn", TINY["wrn"]))
    assert job.status_code == 202, job.text
    assert JobRunner(settings, db=database).run(job.json()["id"]) == "succeeded"
