"""The heavy-tailed DP-SCO family through the API and the worker's JobRunner: the ledger charge
and a real-data smoke run (docs/algorithms/heavy-tailed-dpsco.md)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sklearn.datasets import load_breast_cancer, load_diabetes

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import load_model
from tests.conftest import to_csv, upload
from worker.runner import JobRunner


def _standardised(X: np.ndarray) -> np.ndarray:
    # Test fixture only: in the service, scaling constants are public inputs, not data statistics.
    return (X - X.mean(axis=0)) / X.std(axis=0)


@pytest.fixture(scope="module")
def diabetes_csv() -> bytes:
    data = load_diabetes()
    return to_csv(_standardised(data.data), (data.target - data.target.mean()) / data.target.std())


@pytest.fixture(scope="module")
def cancer_csv() -> bytes:
    data = load_breast_cancer()
    return to_csv(_standardised(data.data), data.target)


def _upload(client: TestClient, body: bytes, task: str) -> dict:
    response = upload(client, body, name=task, task=task, epsilon=8, delta=1e-4)
    assert response.status_code == 201, response.text
    return response.json()


def _spec(
    dataset_id: str,
    name: str,
    model: str,
    hyperparameters: dict,
    *,
    steps: int | None = None,
    target_epsilon: float = 2.0,
) -> dict:
    training = {"steps": steps} if steps is not None else {"epochs": 1}
    return {
        "dataset_id": dataset_id,
        "model": {"name": model},
        "algorithm": {"name": name, "hyperparameters": hyperparameters},
        "privacy": {"target_epsilon": target_epsilon},
        "training": training,
    }


CASES = [
    ("ht-dp-fw", "regression", "linear-regression", {"design_epsilon": 2.0}),
    ("ht-dp-fw", "classification", "logistic-regression", {"constraint": "simplex", "radius": 2.0}),
    ("ht-private-lasso", "regression", "linear-regression", {"design_epsilon": 0.9}),
    ("ht-sparse-linreg", "regression", "linear-regression", {"s_star": 3}),
    ("ht-sparse-opt", "classification", "logistic-regression", {"s_star": 3, "preset": "paper-experiments"}),
]


@pytest.mark.parametrize(("name", "task", "model", "hyperparameters"), CASES)
def test_job_runs_charges_its_event_and_downloads_a_model(
    alice: TestClient,
    settings: Settings,
    database: Database,
    diabetes_csv: bytes,
    cancer_csv: bytes,
    name: str,
    task: str,
    model: str,
    hyperparameters: dict,
) -> None:
    dataset = _upload(alice, diabetes_csv if task == "regression" else cancer_csv, task)
    spec = _spec(dataset["id"], name, model, hyperparameters)
    estimate = alice.post("/v1/jobs/estimate", json=spec)
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["epsilon_ledger"] == pytest.approx(2.0, rel=1e-3)
    job = alice.post("/v1/jobs", json=spec).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "succeeded" and final["steps_run"] == final["steps_planned"]
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["epsilon"]["ledger"] <= 2.0 + 1e-9
    notes = report["algorithm"]["notes"]
    assert notes["neighbouring"].startswith("add/remove")
    if hyperparameters.get("preset") == "paper-experiments":
        assert "why_poor" in notes["paper_experiments_preset"]
    blob = alice.get(f"/v1/jobs/{job['id']}/model")
    assert blob.status_code == 200
    path = settings.tmp_dir / f"{job['id']}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob.content)
    rebuilt, config = load_model(path)
    assert config["model"]["name"] == model
    weights = next(p for p in rebuilt.parameters() if p.ndim == 2)
    assert bool(weights.isfinite().all()) and float(weights.detach().abs().sum()) > 0


@pytest.mark.parametrize(
    ("task", "name", "model", "hyperparameters", "training", "needle"),
    [
        ("regression", "ht-dp-fw", "linear-regression", {"kappa_typo": 1.0}, {"epochs": 1}, "kappa_typo"),
        ("regression", "ht-dp-fw", "linear-regression", {"tau": -1.0}, {"epochs": 1}, "tau"),
        ("regression", "ht-dp-fw", "linear-regression", {}, {"epochs": 3}, "epochs must be 1"),
        ("regression", "ht-sparse-linreg", "linear-regression", {"s_star": 20}, {"epochs": 1}, "exceeds"),
        ("classification", "ht-private-lasso", "logistic-regression", {}, {"epochs": 1}, "squared loss"),
        ("regression", "ht-sparse-opt", "linear-regression", {}, {"steps": 10_000}, "fewer than one"),
    ],
)
def test_invalid_specs_are_422_problems(
    alice: TestClient,
    diabetes_csv: bytes,
    cancer_csv: bytes,
    task: str,
    name: str,
    model: str,
    hyperparameters: dict,
    training: dict,
    needle: str,
) -> None:
    dataset = _upload(alice, diabetes_csv if task == "regression" else cancer_csv, task)
    spec = _spec(dataset["id"], name, model, hyperparameters)
    spec["training"] = training
    response = alice.post("/v1/jobs/estimate", json=spec)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert needle in response.json()["detail"]


def test_catalogue_lists_the_family_and_the_ledger_refuses_overspending(alice: TestClient, diabetes_csv: bytes) -> None:
    names = {entry["name"]: entry for entry in alice.get("/v1/algorithms").json()["items"]}
    for name in ("ht-dp-fw", "ht-private-lasso", "ht-sparse-linreg", "ht-sparse-opt"):
        assert names[name]["family"] == "heavy-tailed-dpsco"
        assert names[name]["defaults"]["preset"] == "theory"
    dataset = _upload(alice, diabetes_csv, "regression")
    spec = _spec(dataset["id"], "ht-sparse-linreg", "linear-regression", {"s_star": 2}, target_epsilon=6.0)
    assert alice.post("/v1/jobs", json=spec).status_code == 202
    second = alice.post("/v1/jobs", json=spec)
    assert second.status_code == 409
    assert second.json()["type"].endswith("insufficient-privacy-budget")


def test_held_out_evaluation_uses_the_expected_training_rows(
    alice: TestClient, settings: Settings, database: Database, cancer_csv: bytes
) -> None:
    """With a DP evaluation, blocks are sized by the public expected (1 − f)·n training rows and
    the released accuracy is charged on top; the whole job still meets the target."""
    dataset = _upload(alice, cancer_csv, "classification")
    spec = _spec(dataset["id"], "ht-dp-fw", "logistic-regression", {"radius": 5.0}, steps=8)
    spec["evaluation"] = {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.5}
    estimate = alice.post("/v1/jobs/estimate", json=spec).json()
    assert estimate["epsilon_ledger"] == pytest.approx(2.0, rel=1e-3)
    assert estimate["steps"] == 8
    job = alice.post("/v1/jobs", json=spec).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["algorithm"]["notes"]["block_size"] == pytest.approx(0.75 * 569 / 8)
    assert alice.get(f"/v1/jobs/{job['id']}").json()["metrics"] is not None
