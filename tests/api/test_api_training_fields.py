"""training.batch_size / learning_rate per algorithm at the API: refused where unused (with what to
do), optional there, still required (same error as ever) where read, and listed by the catalogue."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from kernel.db.engine import Database
from tests.conftest import counts, dp_sgd_spec

KL_SPIDER = {"name": "kl-spider", "hyperparameters": {"L0": 3.0, "L1": 2.0, "gamma": 2.0, "kappa": 1.5, "F0": 1.0}}


def _kl_spec(dataset_id: str, **training: object) -> dict[str, Any]:
    spec = dp_sgd_spec(dataset_id)
    spec["algorithm"] = dict(KL_SPIDER)
    spec["training"] = {"steps": 40, **training}
    return spec


@pytest.mark.parametrize(
    ("training", "detail"),
    [
        ({"batch_size": 1347}, "training.batch_size: kl-spider is full-batch and does not use it; leave it out"),
        (
            {"learning_rate": 1.0},
            "training.learning_rate: kl-spider takes its step sizes from the paper's schedule and does not use it; "
            "leave it out",
        ),
    ],
)
def test_an_unused_field_is_a_422_saying_to_leave_it_out(
    alice: TestClient, dataset_id: str, database: Database, training: dict[str, Any], detail: str
) -> None:
    before = counts(database)
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=_kl_spec(dataset_id, **training))
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        problem = response.json()
        assert problem["type"] == "/problems/invalid-job-spec" and problem["detail"] == detail
    assert counts(database) == before


def test_without_the_unused_fields_a_full_batch_job_is_priced_and_records_n(alice: TestClient, dataset_id: str) -> None:
    n_rows = alice.get(f"/v1/datasets/{dataset_id}").json()["n_rows"]
    estimate = alice.post("/v1/jobs/estimate", json=_kl_spec(dataset_id))
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["sampling_probability"] == 1.0
    job = alice.post("/v1/jobs", json=_kl_spec(dataset_id))
    assert job.status_code == 202, job.text
    body = job.json()
    assert body["spec"]["training"]["batch_size"] == n_rows  # filled in by the service (public n)
    assert body["spec"]["training"]["learning_rate"] is None
    assert body["noise_multiplier"] == estimate.json()["noise_multiplier"]


@pytest.mark.parametrize("missing", ["batch_size", "learning_rate"])
def test_an_algorithm_that_reads_a_field_still_requires_it(alice: TestClient, dataset_id: str, missing: str) -> None:
    spec = dp_sgd_spec(dataset_id)
    del spec["training"][missing]
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=spec)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["type"] == "/problems/validation-error"
        assert problem["detail"] == f"body.training.{missing}: Field required"
        assert problem["errors"] == [{"loc": ["body", "training", missing], "msg": "Field required", "type": "missing"}]


def test_the_catalogue_lists_each_algorithms_training_fields(alice: TestClient) -> None:
    entry = alice.get("/v1/algorithms/kl-spider").json()
    assert entry["training_fields"] == ["epochs", "rows_per_unit", "steps", "time_limit_s"]
    assert entry["full_batch"] is True
    assert "batch_size" not in entry["training_schema"]["properties"]
    dp_sgd = alice.get("/v1/algorithms/dp-sgd").json()
    assert dp_sgd["training_fields"] == [
        "augmult",
        "batch_size",
        "ema_decay",
        "epochs",
        "learning_rate",
        "precision",
        "rows_per_unit",
        "steps",
        "time_limit_s",
    ]
    assert {"batch_size", "learning_rate"} <= set(dp_sgd["training_schema"]["required"])
    listed = {a["name"]: a for a in alice.get("/v1/algorithms").json()["items"]}
    assert "batch_size" not in listed["ht-dp-fw"]["training_fields"] and listed["ht-dp-fw"]["full_batch"] is False
