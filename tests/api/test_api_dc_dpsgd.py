"""DC-DPSGD through the API and the worker's JobRunner: sound cost charged, paper's number only labelled."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from tests.conftest import upload
from worker.runner import JobRunner


def _spec(dataset_id: str, name: str, hyperparameters: dict) -> dict:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression"},
        "algorithm": {"name": name, "hyperparameters": hyperparameters},
        "privacy": {"target_epsilon": 4.0},
        "training": {"steps": 15, "batch_size": 128, "learning_rate": 1.0},
    }


@pytest.mark.parametrize(
    ("name", "hyperparameters", "sensitivity"),
    [
        ("dc-dpsgd", {"c2": 0.1, "k": 20, "sigma_tr": 0.5}, 2 * 1.0 - 0.1),
        ("dc-dpsgd-threshold", {"c2": 0.1, "k": 20, "tracking": True, "threshold_noise_ratio": 5}, 1.0),
    ],
)
def test_dc_job_charges_the_sound_cost_and_labels_the_paper_claim(
    alice: TestClient,
    settings: Settings,
    database: Database,
    digits_csv: bytes,
    name: str,
    hyperparameters: dict,
    sensitivity: float,
) -> None:
    dataset = upload(alice, digits_csv).json()
    estimate = alice.post("/v1/jobs/estimate", json=_spec(dataset["id"], name, hyperparameters)).json()
    assert estimate["sensitivity"] == pytest.approx(sensitivity)
    assert estimate["epsilon_ledger"] == pytest.approx(4.0, rel=1e-3)
    job = alice.post("/v1/jobs", json=_spec(dataset["id"], name, hyperparameters)).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["mechanism"]["l2_sensitivity"] == pytest.approx(sensitivity)
    assert report["epsilon"]["ledger"] <= 4.0 + 1e-9
    notes = report["algorithm"]["notes"]
    if name == "dc-dpsgd":
        claim = notes["paper_claim"]
        assert claim["label"] == "as claimed in the paper — not a valid guarantee"
        assert claim["epsilon"] is not None and claim["epsilon"] != report["epsilon"]["ledger"]
    else:
        tracking = notes["threshold_tracking"]
        assert tracking["count_noise_multiplier"] == pytest.approx(5 * job["noise_multiplier"])
        assert report["event"]["event"]["noise_multiplier"] == pytest.approx(tracking["effective_noise_multiplier"])


def test_projection_larger_than_the_model_fails_before_touch(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    """k ≥ d_J is found before the data is opened, so the reservation is released, not spent."""
    dataset = upload(alice, digits_csv).json()
    job = alice.post("/v1/jobs", json=_spec(dataset["id"], "dc-dpsgd", {"c2": 0.1, "k": 5000})).json()
    assert JobRunner(settings, db=database).run(job["id"]) == "skipped"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "failed" and final["error_code"] == "invalid-for-model"
    kinds = [e["kind"] for e in alice.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]]
    assert kinds == ["RESERVE", "RELEASE"]
    assert alice.get(f"/v1/datasets/{dataset['id']}/budget").json()["committed_epsilon"] == 0.0
