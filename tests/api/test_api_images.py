"""Image datasets end to end through the API: a ZIP of class folders (or a uint8 NPZ) is
decoded once into a stored uint8 array, described publicly (modality, shapes, classes), trained
on by the real worker path, and a refused upload leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from dp.data.rows import MappedImageRows, materialise
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, LedgerEntry, PrivacyBudget
from tests.unit.ingest.image_fixtures import class_images, image_zip, npz_bytes, png, zip_bytes
from worker.job_data import load_data_and_units
from worker.runner import JobRunner


def _upload(client: TestClient, body: bytes, **params: object) -> object:
    query: dict[str, object] = {"name": "shapes", "format": "zip", "epsilon": 8, "delta": 1e-3}
    query.update(params)
    return client.post("/v1/datasets", params=query, content=body)


def _stored(database: Database, settings: Settings) -> tuple[int, int, int, list[Path]]:
    """Rows, budgets, ledger entries, blob files and temp files: what a refusal must not change."""
    with database.read_session() as session:
        counts = tuple(
            session.scalar(select(func.count()).select_from(table)) or 0
            for table in (Dataset, PrivacyBudget, LedgerEntry)
        )
    files = sorted(p for p in settings.blob_dir.rglob("*") if p.is_file())
    temps = sorted(p for p in settings.tmp_dir.rglob("*") if p.is_file()) if settings.tmp_dir.exists() else []
    return (*counts, files + temps)  # type: ignore[return-value]


def _dataset(database: Database, dataset_id: str) -> Dataset:
    with database.read_session() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        session.expunge(dataset)
    return dataset


def _job(alice: TestClient, dataset_id: str, model: str, params: dict[str, object] | None = None) -> str:
    spec = {
        "dataset_id": dataset_id,
        "model": {"name": model, "params": params or {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": 2.0},
        "training": {"steps": 3, "batch_size": 8, "learning_rate": 0.5},
    }
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_a_zip_of_class_folders_uploads_as_an_image_dataset(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    images = class_images()
    response = _upload(alice, image_zip(images))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["modality"] == "image" and body["format"] == "zip"
    assert body["feature_shape"] == [1, 8, 8] and body["image_shape"] == [8, 8, 1]
    assert body["n_rows"] == 24 and body["classes"] == ["dark", "light"] and body["classes_source"] == "observed"
    assert len(body["notices"]) == 1 and "class list" in body["notices"][0]  # folders are public; task is not inferred
    dataset = _dataset(database, body["id"])
    assert dataset.array_blob_key is not None and dataset.array_blob_key != dataset.blob_key
    stored = np.load(settings.blob_dir / dataset.array_blob_key, mmap_mode="r", allow_pickle=False)
    assert isinstance(stored, np.memmap) and stored.dtype == np.uint8 and stored.shape == (24, 8, 8, 1)
    np.testing.assert_array_equal(stored[0, :, :, 0], images[sorted(images)[0]])
    data = load_data_and_units(JobRunner(settings, db=database).ctx, dataset, torch.device("cpu"))
    rows, y = data.rows, data.y
    assert isinstance(rows, MappedImageRows)  # read batch by batch from the stored array, never copied whole
    X = materialise(rows)
    assert X.shape == (24, 1, 8, 8) and X.dtype.is_floating_point
    np.testing.assert_allclose(X[0, 0].numpy(), images[sorted(images)[0]] / 255.0, rtol=1e-6)
    assert y.tolist() == [0 if name.startswith("dark/") else 1 for name in sorted(images)]
    listed = alice.get("/v1/datasets").json()["items"][0]
    assert listed["modality"] == "image" and listed["image_shape"] == [8, 8, 1]


@pytest.mark.parametrize(
    ("model", "params"), [("cnn2-gn", {}), ("mlp", {"hidden_sizes": [8]}), ("logistic-regression", {})]
)
def test_image_models_train_on_an_uploaded_zip_through_the_worker(
    alice: TestClient, database: Database, settings: Settings, model: str, params: dict[str, object]
) -> None:
    """8×8 PNGs resized to 16×16 at upload (cnn2-gn needs 14×14), trained by the real worker."""
    response = _upload(alice, image_zip(), image_size="16", classes="dark,light")
    assert response.status_code == 201, response.text
    assert response.json()["feature_shape"] == [1, 16, 16]
    job_id = _job(alice, response.json()["id"], model, params)
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    assert alice.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    execution = alice.get(f"/v1/jobs/{job_id}/report").json()["execution"]
    assert execution["device"] == "cpu" and execution["steps"] == 3 and execution["precision"] == "fp32"
    # Counted with the public expected batch size (8), never the realised Poisson batches.
    assert execution["examples_per_second"] == pytest.approx(3 * 8 / execution["seconds"], rel=0.01)
    assert "examples/s" in execution["statement"] and "public expected batch size" in execution["statement"]


def test_a_uint8_npz_is_an_image_dataset_unless_declared_tabular(alice: TestClient) -> None:
    rng = np.random.default_rng(0)
    body = npz_bytes(X=rng.integers(0, 256, (20, 6, 5, 3), dtype=np.uint8), y=np.arange(20) % 2)
    image = _upload(alice, body, format="npz")
    assert image.status_code == 201, image.text
    assert image.json()["modality"] == "image" and image.json()["feature_shape"] == [3, 6, 5]
    assert image.json()["image_shape"] == [6, 5, 3]
    other = npz_bytes(X=rng.integers(0, 256, (20, 6, 5, 3), dtype=np.uint8), y=np.arange(20) % 2)
    tabular = _upload(alice, other, format="npz", modality="tabular")
    assert tabular.status_code == 201, tabular.text
    assert tabular.json()["modality"] == "tabular" and tabular.json()["image_shape"] is None
    assert tabular.json()["feature_shape"] == [6, 5, 3]  # read as numbers, exactly as before images


@pytest.mark.parametrize(
    ("body", "params", "reason"),
    [
        (zip_bytes({"a/0.png": png(np.zeros((4, 4), np.uint8)), "../b/0.png": b"x"}), {}, "bad-archive-path"),
        (zip_bytes({"a/0.png": png(np.zeros((4, 4), np.uint8)), "b/1.png": b"not a png"}), {}, "not-an-image"),
        (
            zip_bytes({"a/0.png": png(np.zeros((4, 4), np.uint8)), "b/0.png": png(np.zeros((4, 5), np.uint8))}),
            {},
            "mixed-image-sizes",
        ),
        (image_zip(), {"image_size": "0x3"}, "bad-image-options"),
        (image_zip(), {"channels": 2}, "bad-image-options"),
        (image_zip(), {"format": "csv", "label_column": "label", "image_size": "8"}, "bad-image-options"),
        (image_zip(), {"modality": "tabular"}, "bad-image-options"),
        (image_zip(), {"preparation": '{"scale": {"*": {"bounds": [0, 255]}}}'}, "bad-image-options"),
    ],
)
def test_a_refused_image_upload_is_a_problem_and_leaves_nothing(
    alice: TestClient, database: Database, settings: Settings, body: bytes, params: dict[str, object], reason: str
) -> None:
    before = _stored(database, settings)
    response = _upload(alice, body, **params)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"].endswith("/problems/invalid-dataset") and problem["reason"] == reason
    assert _stored(database, settings) == before


def test_a_registration_that_fails_late_removes_the_image_array_too(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    """δ ≥ 1/n is refused after decoding, and a duplicate after storing: neither leaves a blob."""
    before = _stored(database, settings)
    assert _upload(alice, image_zip(), delta=0.5).status_code == 422
    assert _stored(database, settings) == before
    body = image_zip()
    assert _upload(alice, body).status_code == 201
    after_first = _stored(database, settings)
    assert len(after_first[3]) == 2  # the upload as sent, and its decoded array
    assert _upload(alice, body).status_code == 409
    assert _stored(database, settings) == after_first


def test_an_idempotent_retry_replays_and_the_image_options_are_part_of_the_request(alice: TestClient) -> None:
    body = image_zip()
    headers = {"Idempotency-Key": "img-1"}
    params = {"name": "shapes", "format": "zip", "epsilon": 8, "delta": 1e-3, "image_size": "12x10"}
    first = alice.post("/v1/datasets", params=params, content=body, headers=headers)
    assert first.status_code == 201, first.text
    assert first.json()["feature_shape"] == [1, 12, 10]
    again = alice.post("/v1/datasets", params=params, content=body, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = alice.post("/v1/datasets", params={**params, "image_size": "8"}, content=body, headers=headers)
    assert other.status_code == 422 and other.json()["type"].endswith("/problems/idempotency-key-reused")


def test_the_cli_uploads_a_zip_inferring_its_format(app_client: TestClient, database: Database, tmp_path: Path) -> None:
    """`privtrain datasets upload images.zip --image-size 16 --channels 3`, as docs/preparing-data.md shows."""
    from click.testing import CliRunner

    from privtrain.cli import CliEnvironment, cli
    from tests.client.conftest import BASE_URL, AppTransport
    from tests.conftest import new_key

    path = tmp_path / "images.zip"
    path.write_bytes(image_zip())
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": new_key(database, "photos")}
    args = [
        "datasets",
        "upload",
        str(path),
        "--epsilon",
        "8",
        "--delta",
        "1e-3",
        "--image-size",
        "16",
        "--channels",
        "3",
    ]
    result = CliRunner().invoke(cli, [*args, "--json"], obj=CliEnvironment(transport=AppTransport(app_client)), env=env)
    assert result.exit_code == 0, result.stderr
    dataset = json.loads(result.stdout)
    assert dataset["format"] == "zip" and dataset["modality"] == "image"
    assert dataset["feature_shape"] == [3, 16, 16] and dataset["image_shape"] == [16, 16, 3]
    bad = CliRunner().invoke(cli, [*args[:-4], "--image-size", "16x"], obj=CliEnvironment(), env=env)
    assert bad.exit_code == 2 and "--image-size" in bad.stderr
