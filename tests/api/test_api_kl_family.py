"""The KL family end to end: estimate → submit → the worker's JobRunner → ledger and report, on
tiny linear- and logistic-regression datasets; and the 422 problems for invalid specs."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from algorithms.kl_family.accounting import BUDGET_UNITS
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.privacy.single_job import gaussian_dp_epsilon
from tests.conftest import upload
from worker.runner import JobRunner

N_REGRESSION = 300


def _regression_csv() -> bytes:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_REGRESSION, 4))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.clip(X @ np.array([0.5, -0.3, 0.2, 0.1]) + 0.1 * rng.normal(size=N_REGRESSION), -1, 1)
    buffer = io.StringIO()
    buffer.write("x0,x1,x2,x3,target\n")
    for row, target in zip(X, y, strict=True):
        buffer.write(",".join(repr(float(v)) for v in row) + f",{float(target)!r}\n")
    return buffer.getvalue().encode()


CASES: dict[str, dict[str, Any]] = {
    "kl-spider": {"L0": 3.0, "L1": 2.0, "gamma": 2.0, "kappa": 1.5, "F0": 1.0},
    "adaptive-noisy-gd": {"L0": 3.0, "L1": 2.0},
    "noisy-gd": {"L0": 3.0, "L1_tilde": 0.2},
    "proximal-point": {"L0": 3.0, "L1_tilde": 0.5, "gamma": 2.0, "kappa": 2.0, "F0": 1.0, "max_inner_steps": 5},
}


def _spec(dataset_id: str, name: str, *, model: str, steps: int = 40, **training: object) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": model},
        "algorithm": {"name": name, "hyperparameters": dict(CASES[name])},
        "privacy": {"target_epsilon": 3.0},
        "training": {"steps": steps, **training},
    }


@pytest.fixture
def regression_id(alice: TestClient) -> str:
    response = upload(alice, _regression_csv(), name="ls", label_column="target", task="regression")
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_linear_regression_job_runs_and_settles_within_its_reservation(
    alice: TestClient, settings: Settings, database: Database, regression_id: str, name: str
) -> None:
    spec = _spec(regression_id, name, model="linear-regression")
    estimate = alice.post("/v1/jobs/estimate", json=spec)
    assert estimate.status_code == 200, estimate.text
    body = estimate.json()
    assert body["epsilon_ledger"] == pytest.approx(3.0, rel=1e-3) and body["epsilon_ledger"] <= 3.0 + 1e-9
    assert body["sampling_probability"] == 1.0 and body["sensitivity"] == 3.0
    assert body["steps"] == (40 if name == "noisy-gd" else BUDGET_UNITS)
    # The KL family's zCDP leaves are Gaussian releases: a valid single-job bound below the ledger's,
    # and for noisy-gd (40 Gaussians with noise multiplier σ) exactly the μ-GDP value, μ = √40/σ.
    assert body["epsilon_prv"] is not None and 0 < body["epsilon_prv"] <= body["epsilon_ledger"]
    if name == "noisy-gd":
        mu = math.sqrt(40) / body["noise_multiplier"]
        assert body["epsilon_prv"] == pytest.approx(gaussian_dp_epsilon(mu=mu, delta=body["delta"]), rel=1e-9)

    job = alice.post("/v1/jobs", json=spec).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "succeeded" and 0 < final["steps_run"] <= final["steps_planned"]
    ledger = alice.get(f"/v1/datasets/{regression_id}/ledger").json()["items"]
    assert [e["kind"] for e in ledger][:2] == ["RESERVE", "TOUCH"] and "COMMIT" in [e["kind"] for e in ledger]
    reserved = next(e for e in ledger if e["kind"] == "RESERVE")["event"]["event"]
    committed = next(e for e in ledger if e["kind"] == "COMMIT")["event"]["event"]
    assert reserved["kind"] == committed["kind"] == "zcdp"
    assert reserved["count"] == final["steps_planned"] and committed["count"] == final["steps_run"]
    assert committed["rho"] == reserved["rho"]
    sigma = job["noise_multiplier"]
    per_step = 1 / (2 * sigma**2) / (1 if name == "noisy-gd" else BUDGET_UNITS)
    assert reserved["rho"] == pytest.approx(per_step, rel=1e-12)
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["epsilon"]["ledger"] <= 3.0 + 1e-9
    notes = report["algorithm"]["notes"]
    assert notes["neighbouring_relation"].startswith("add/remove")
    if name != "noisy-gd":
        assert notes["paper_claim"]["label"] == "as claimed in the paper — not a valid guarantee"
    assert alice.get(f"/v1/jobs/{job['id']}/model").status_code == 200


def test_adaptive_noisy_gd_runs_on_logistic_regression(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    dataset = upload(alice, digits_csv).json()
    spec = _spec(dataset["id"], "adaptive-noisy-gd", model="logistic-regression")
    job = alice.post("/v1/jobs", json=spec).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "succeeded" and final["epsilon_ledger"] <= 3.0 + 1e-9


@pytest.mark.parametrize(
    ("name", "mutate", "detail"),
    [
        (
            "kl-spider",
            lambda s: s["training"].update(batch_size=300),
            "training.batch_size: kl-spider is full-batch and does not use it; leave it out",
        ),
        ("noisy-gd", lambda s: s["training"].update(learning_rate=1.0), "training.learning_rate: noisy-gd"),
        ("kl-spider", lambda s: s["algorithm"]["hyperparameters"].update(kappa=3.0), "kappa"),
        ("kl-spider", lambda s: s["algorithm"]["hyperparameters"].update(F0=1e3), "F0"),
        ("kl-spider", lambda s: s["algorithm"]["hyperparameters"].update(L0="inf"), "L0"),
        ("adaptive-noisy-gd", lambda s: s["algorithm"]["hyperparameters"].update(kappa=2.0), "kappa"),
        ("proximal-point", lambda s: s["algorithm"]["hyperparameters"].update(L1_tilde=0), "L1_tilde"),
        ("proximal-point", lambda s: s["algorithm"]["hyperparameters"].update(max_inner_steps=0), "max_inner_steps"),
    ],
)
def test_invalid_kl_specs_are_422_problems(
    alice: TestClient, regression_id: str, name: str, mutate: Any, detail: str
) -> None:
    spec = _spec(regression_id, name, model="linear-regression")
    mutate(spec)
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=spec)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["type"] == "/problems/invalid-job-spec" and detail in problem["detail"]
    assert alice.get(f"/v1/datasets/{regression_id}/ledger").json()["items"] == []


def test_catalogue_serves_the_kl_schemas(alice: TestClient) -> None:
    items = {a["name"]: a for a in alice.get("/v1/algorithms").json()["items"]}
    for name in CASES:
        schema = items[name]["hyperparameters_schema"]
        assert schema["additionalProperties"] is False
        assert all(field.get("description") for field in schema["properties"].values())
    assert set(items["adaptive-noisy-gd"]["hyperparameters_schema"]["properties"]) == {"L0", "L1", "beta"}
