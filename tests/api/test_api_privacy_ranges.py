"""Crafted privacy inputs get a quick 4xx problem naming the allowed range, never a 500 or a hang."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from tests.conftest import dp_sgd_spec, spec_for, upload

LIMIT_S = 5.0


def _quick_problem(call: object) -> dict:
    start = time.perf_counter()
    response = call()  # type: ignore[operator]
    assert time.perf_counter() - start < LIMIT_S
    assert 400 <= response.status_code < 500, response.text
    return response.json()


def test_tiny_noise_multiplier_is_a_problem_naming_the_range(alice: TestClient, dataset_id: str) -> None:
    problem = _quick_problem(
        lambda: alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id, noise_multiplier=1e-200))
    )
    assert "[0.001, 100000]" in problem["detail"]


def test_subnormal_job_delta_is_a_problem_naming_the_range(alice: TestClient, dataset_id: str) -> None:
    spec = dp_sgd_spec(dataset_id, target_epsilon=4.0, delta=5e-324)
    problem = _quick_problem(lambda: alice.post("/v1/jobs", json=spec))
    assert "[1e-30, 1)" in problem["detail"]


def test_subnormal_upload_delta_is_refused(alice: TestClient, digits_csv: bytes) -> None:
    problem = _quick_problem(lambda: upload(alice, digits_csv, delta=5e-324))
    assert problem["type"] == "/problems/validation-error"
    assert "query.delta: Input should be greater than or equal to 0.0000000000000000000000000000" in problem["detail"]


def test_tiny_mu_is_a_problem_naming_the_range(alice: TestClient, dataset_id: str) -> None:
    spec = spec_for(dataset_id, "ht-sparse-linreg", {"mu": 1e-300})
    problem = _quick_problem(lambda: alice.post("/v1/jobs/estimate", json=spec))
    assert problem["type"] == "/problems/invalid-job-spec"
    assert "gamma/1e+06" in problem["detail"]


def test_tiny_gaussian_evaluation_noise_is_a_problem_naming_the_range(alice: TestClient, dataset_id: str) -> None:
    spec = dp_sgd_spec(dataset_id, target_epsilon=4.0)
    spec["evaluation"] = {"holdout_fraction": 0.1, "mechanism": "gaussian", "noise_multiplier": 1e-300}
    problem = _quick_problem(lambda: alice.post("/v1/jobs/estimate", json=spec))
    assert "[0.001, 100000]" in problem["detail"]
