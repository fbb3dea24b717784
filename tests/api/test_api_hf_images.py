"""`hf` image classifiers (ViT, ConvNeXt from a config) end to end through the API and the
in-process worker: upload a class-folder ZIP of 8×8 grey images, train with DP-SGD, download the
released model, load it with `privtrain.load_model` and, as a ``save_pretrained`` folder
(format=hf), with Transformers' ``AutoModelForImageClassification``: the same outputs."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

import privtrain
from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.worker_jobs import run_on_worker
from tests.unit.ingest.image_fixtures import image_zip
from tests.unit.worker.hf_image_fixtures import IMAGE_TYPES, image_config


def upload_images(alice: TestClient) -> dict[str, Any]:
    """24 grey 8×8 images in two classes: rows of shape (1, 8, 8)."""
    query = {"name": "shapes", "format": "zip", "epsilon": 8, "delta": 1e-3}
    response = alice.post("/v1/datasets", params=query, content=image_zip())
    assert response.status_code == 201, response.text
    return dict(response.json())


def grey_config(model_type: str) -> dict[str, Any]:
    return {**image_config(model_type), "num_channels": 1}


def image_spec(dataset_id: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "hf", "params": {"task": "image-classification", "config": config}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.5},
    }


def transformers_outputs(alice: TestClient, job_id: str, pixels: torch.Tensor, folder: Path) -> torch.Tensor:
    """The logits of the format=hf download, loaded by Transformers' auto class."""
    from transformers import AutoModelForImageClassification  # heavy: these tests only

    response = alice.get(f"/v1/jobs/{job_id}/model", params={"format": "hf"})
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        archive.extractall(folder)
    assert "pixel_values" in (folder / "README.md").read_text()
    model = AutoModelForImageClassification.from_pretrained(folder, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits: torch.Tensor = model(pixel_values=pixels).logits
    return logits


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_an_hf_image_model_trains_with_dp_sgd_and_loads_with_transformers(
    model_type: str, alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    dataset = upload_images(alice)
    job_id = run_on_worker(alice, settings, database, image_spec(dataset["id"], grey_config(model_type)))
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job
    response = alice.get(f"/v1/jobs/{job_id}/model")
    assert response.status_code == 200, response.text
    path = tmp_path / "model.safetensors"
    path.write_bytes(response.content)
    model, config = privtrain.load_model(path)
    pixels = torch.rand((3, 1, 8, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(pixels)
    assert expected.shape == (3, len(config["classes"])) and torch.isfinite(expected).all()
    got = transformers_outputs(alice, job_id, pixels, tmp_path / "hf")
    torch.testing.assert_close(got, expected)


def test_images_that_do_not_match_the_config_are_refused_naming_both(alice: TestClient) -> None:
    dataset = upload_images(alice)
    response = alice.post("/v1/jobs/estimate", json=image_spec(dataset["id"], image_config("vit")))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "num_channels 3 and image_size 8" in detail and "[1, 8, 8]" in detail


def test_a_vit_checkpoint_is_uploaded_and_its_head_fine_tuned_on_images(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    """A saved ViTForImageClassification (a zipped save_pretrained folder) → a base model whose task
    the class names; finetune=head keeps its body bit for bit and trains the classifier."""
    from safetensors.torch import load_file  # only these tests read the weights back
    from transformers import ViTConfig, ViTForImageClassification  # heavy: these tests only

    dataset = upload_images(alice)
    torch.manual_seed(0)
    sizes = {key: value for key, value in grey_config("vit").items() if key != "model_type"}
    vit = ViTForImageClassification(ViTConfig(**sizes, num_labels=len(dataset["classes"])))
    folder = tmp_path / "vit"
    vit.save_pretrained(folder)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.iterdir()):
            archive.write(path, f"vit/{path.name}")
    response = alice.post("/v1/base-models", params={"name": "vit", "format": "hf"}, content=buffer.getvalue())
    assert response.status_code == 201, response.text
    base = response.json()
    assert base["model_class"] == "ViTForImageClassification" and base["params"]["task"] == "image-classification"
    assert base["parameter_count"] == sum(p.numel() for p in vit.parameters())
    assert base["n_outputs"] == len(dataset["classes"])

    spec = image_spec(dataset["id"], grey_config("vit"))
    spec["model"] = {"name": "hf", "init": {"base_model_id": base["id"]}, "params": {"task": "image-classification"}}
    spec["training"]["finetune"] = "head"
    job_id = run_on_worker(alice, settings, database, spec)
    assert alice.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    released = alice.get(f"/v1/jobs/{job_id}/model", params={"format": "hf"})
    assert released.status_code == 200, released.text
    with zipfile.ZipFile(io.BytesIO(released.content)) as archive:
        archive.extractall(tmp_path / "released")
    trained = load_file(str(tmp_path / "released" / "model.safetensors"))
    original = load_file(str(folder / "model.safetensors"))
    fc2 = "vit.encoder.layer.1.output.dense.weight"
    # save_pretrained writes ViT's earlier module names (vit.encoder.layer…), and so does the download
    for name in ("vit.embeddings.cls_token", fc2):
        torch.testing.assert_close(trained[name], original[name], rtol=0, atol=0)
    assert not torch.equal(trained["classifier.weight"], original["classifier.weight"])  # the head trained
