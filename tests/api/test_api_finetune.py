"""Public pretraining → private fine-tuning through the API and the worker's JobRunner
(docs/pretraining-and-finetuning.md): a non-private job on a public dataset, its model as the
``model.init`` of a DP-SGD ``head`` fine-tuning job on a private dataset with another class count
(a new head), and the init's provenance in the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.test_api_public_datasets import upload_public
from tests.conftest import digits_split, to_csv, upload
from worker.runner import JobRunner

MLP = {"name": "mlp", "params": {"hidden_sizes": [16]}}


def _public_and_private(alice: TestClient) -> tuple[dict, dict]:
    """Public: training digits 0-4 (5 classes); private: the held-out rows, every digit (10 classes)."""
    X, X_other, y, y_other = digits_split()
    low = y < 5
    public = upload_public(alice, to_csv(X[low], y[low]))
    private = upload(alice, to_csv(X_other, y_other))
    return public, private.json()  # type: ignore[attr-defined]


def _run(alice: TestClient, settings: Settings, database: Database, spec: dict) -> str:
    submitted = alice.post("/v1/jobs", json=spec)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    return str(job_id)


def _model_tensors(alice: TestClient, job_id: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    path = tmp_path / f"{job_id}.safetensors"
    path.write_bytes(alice.get(f"/v1/jobs/{job_id}/model").content)
    return load_file(str(path))


def test_public_pretraining_then_private_head_finetuning(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    public, private = _public_and_private(alice)
    pretrain = _run(
        alice,
        settings,
        database,
        {
            "dataset_id": public["id"],
            "model": MLP,
            "algorithm": {"name": "sgd", "hyperparameters": {"momentum": 0.9}},
            "training": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1},
        },
    )
    finetune_spec = {
        "dataset_id": private["id"],
        "model": {**MLP, "init": {"job_id": pretrain}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": 2.0},
        "training": {"epochs": 2, "batch_size": 64, "learning_rate": 0.5, "finetune": "head"},
    }
    plain = {**finetune_spec, "model": MLP, "training": {**finetune_spec["training"], "finetune": None}}
    estimate = alice.post("/v1/jobs/estimate", json=finetune_spec)
    assert estimate.status_code == 200, estimate.text
    same_without_init = alice.post("/v1/jobs/estimate", json=plain).json()
    assert estimate.json()["epsilon_ledger"] == same_without_init["epsilon_ledger"]  # init costs nothing
    finetuned = _run(alice, settings, database, finetune_spec)

    report = alice.get(f"/v1/jobs/{finetuned}/report").json()
    assert report["init"]["kind"] == "job" and report["init"]["job_id"] == pretrain
    assert report["init"]["dataset_public"] is True and report["init"]["treated_as"] == "public"
    assert f"model of job {pretrain}" in report["init"]["statement"]
    assert report["epsilon"]["ledger"] <= 2.0 + 1e-9
    html = alice.get(f"/v1/jobs/{finetuned}/report", params={"format": "html"}).text
    assert 'id="init-weights"' in html and f"model of job {pretrain}" in html

    start, end = _model_tensors(alice, pretrain, tmp_path), _model_tensors(alice, finetuned, tmp_path)
    assert torch.equal(start["1.weight"], end["1.weight"]) and torch.equal(start["1.bias"], end["1.bias"])  # frozen
    assert start["3.weight"].shape == (5, 16) and end["3.weight"].shape == (10, 16)  # a new head for 10 classes
    kinds = [e["kind"] for e in alice.get(f"/v1/datasets/{private['id']}/ledger").json()["items"]]
    assert kinds == ["RESERVE", "TOUCH", "COMMIT"]


def test_init_must_fit_the_model(alice: TestClient, settings: Settings, database: Database) -> None:
    public, private = _public_and_private(alice)
    pretrain = _run(
        alice,
        settings,
        database,
        {
            "dataset_id": public["id"],
            "model": MLP,
            "algorithm": {"name": "adam", "hyperparameters": {}},
            "training": {"steps": 3, "batch_size": 32, "learning_rate": 0.01},
        },
    )
    base = {
        "dataset_id": private["id"],
        "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
        "privacy": {"target_epsilon": 2.0},
        "training": {"steps": 3, "batch_size": 64, "learning_rate": 0.5},
    }
    other_params = {**base, "model": {"name": "mlp", "params": {"hidden_sizes": [8]}, "init": {"job_id": pretrain}}}
    refused = alice.post("/v1/jobs", json=other_params)
    assert refused.status_code == 422 and refused.json()["type"].endswith("/invalid-model-init")
    other_model = {**base, "model": {"name": "logistic-regression", "params": {}, "init": {"job_id": pretrain}}}
    assert alice.post("/v1/jobs", json=other_model).json()["type"].endswith("/invalid-model-init")
    no_init = {**base, "model": MLP, "training": {**base["training"], "finetune": "head"}}
    refused = alice.post("/v1/jobs", json=no_init)
    assert refused.status_code == 422 and "needs model.init" in refused.json()["detail"]
    unknown = {**base, "model": {**MLP, "init": {"job_id": "job_nope"}}}
    assert alice.post("/v1/jobs", json=unknown).status_code == 404
    both = {**base, "model": {**MLP, "init": {"job_id": pretrain, "base_model_id": "bm_x"}}}
    assert alice.post("/v1/jobs", json=both).status_code == 422
    k_missing = {
        **base,
        "model": {**MLP, "init": {"job_id": pretrain}},
        "training": {**base["training"], "finetune": "last_k_blocks"},
    }
    assert alice.post("/v1/jobs", json=k_missing).status_code == 422


def test_last_k_blocks_trains_the_last_blocks_only(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    public, private = _public_and_private(alice)
    deep = {"name": "mlp", "params": {"hidden_sizes": [16, 12]}}
    pretrain = _run(
        alice,
        settings,
        database,
        {
            "dataset_id": public["id"],
            "model": deep,
            "algorithm": {"name": "sgd", "hyperparameters": {}},
            "training": {"steps": 5, "batch_size": 32, "learning_rate": 0.1},
        },
    )
    finetuned = _run(
        alice,
        settings,
        database,
        {
            "dataset_id": private["id"],
            "model": {**deep, "init": {"job_id": pretrain}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
            "privacy": {"target_epsilon": 4.0},
            "training": {
                "steps": 5,
                "batch_size": 64,
                "learning_rate": 0.5,
                "finetune": "last_k_blocks",
                "finetune_k": 2,
            },
        },
    )
    start, end = _model_tensors(alice, pretrain, tmp_path), _model_tensors(alice, finetuned, tmp_path)
    assert torch.equal(start["1.weight"], end["1.weight"])  # first block frozen
    assert not torch.equal(start["3.weight"], end["3.weight"])  # second block trained
    assert end["5.weight"].shape == (10, 12) and np.isfinite(end["5.weight"].numpy()).all()  # new head trained


def test_a_head_is_reused_only_when_its_outputs_mean_the_same_classes(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    """Digits 0-4 pretrain a 5-output head; fine-tuning on digits 5-9 (also 5 classes, other names)
    must start a fresh head, since output i of the pretrained head means digit i, not 5 + i. On
    digits 0-4 again (the same list) the pretrained head is the start."""
    X, X_other, y, y_other = digits_split()
    low, high = y < 5, y_other >= 5
    public = upload_public(alice, to_csv(X[low], y[low]))
    same_classes = upload(alice, to_csv(X_other[y_other < 5], y_other[y_other < 5])).json()  # type: ignore[attr-defined]
    other_classes = alice.post(
        "/v1/datasets",
        params={
            "name": "high",
            "format": "csv",
            "label_column": "label",
            "task": "classification",
            "epsilon": 8,
            "delta": 1e-5,
        },
        content=to_csv(X_other[high], y_other[high]),
    ).json()
    assert other_classes["classes"] == ["5", "6", "7", "8", "9"] and same_classes["classes"] == [
        "0",
        "1",
        "2",
        "3",
        "4",
    ]
    pretrain = _run(
        alice,
        settings,
        database,
        {
            "dataset_id": public["id"],
            "model": MLP,
            "algorithm": {"name": "sgd", "hyperparameters": {"momentum": 0.9}},
            "training": {"epochs": 3, "batch_size": 32, "learning_rate": 0.1},
        },
    )
    start = _model_tensors(alice, pretrain, tmp_path)
    head = sorted(start)[-2:]  # the last Linear's bias and weight
    heads: dict[bool, dict[str, torch.Tensor]] = {}
    for dataset, expect_new in ((same_classes, False), (other_classes, True)):
        job = _run(
            alice,
            settings,
            database,
            {
                "dataset_id": dataset["id"],
                "model": {**MLP, "init": {"job_id": pretrain}},
                "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
                "privacy": {"noise_multiplier": 1e4},  # the trained head barely moves: its start shows
                "training": {"steps": 1, "batch_size": 64, "learning_rate": 1e-6, "finetune": "head"},
            },
        )
        report = alice.get(f"/v1/jobs/{job}/report").json()
        assert report["init"]["new_head"] is expect_new
        assert ("head started fresh" in report["init"]["statement"]) is expect_new
        heads[expect_new] = _model_tensors(alice, job, tmp_path)
    for name in head:
        assert torch.allclose(heads[False][name], start[name], atol=1e-3), name  # reused
        assert not torch.allclose(heads[True][name], start[name], atol=1e-3), name  # fresh
