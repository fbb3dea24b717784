"""Names say what they hold (issue 35.5): ``epsilon_reserved`` (the plan's reservation, formerly
``epsilon_ledger``), ``epsilon_single_job`` and ``epsilon_single_job_method`` (the smallest of
several single-job bounds, PRV or PLD or RDP by turns, formerly ``epsilon_prv`` and
``epsilon_prv_method``). The old names stay one release as deprecated aliases with the same value,
flagged in the OpenAPI schema; the client reads the new names and still understands older servers."""

from __future__ import annotations

import warnings

import pytest
from fastapi.testclient import TestClient

from kernel.schemas.renamed import ALIASES_REMOVED_IN, RENAMED
from privtrain.resources import Estimate, Job, TuningJob
from tests.conftest import dp_sgd_spec

RENAMED_IN = {
    "PrivacyEstimate": ("epsilon_ledger", "epsilon_prv", "epsilon_prv_method"),
    "JobOut": ("epsilon_ledger", "epsilon_prv"),
    "TuningOut": ("epsilon_ledger",),
    "TuningEstimate": ("epsilon_ledger",),
}


def _tuning_request(dataset_id: str) -> dict[str, object]:
    return {
        "base": {
            **dp_sgd_spec(dataset_id, target_epsilon=1.0),
            "training": {"steps": 5, "batch_size": 64, "learning_rate": 0.5, "time_limit_s": 3},
            "evaluation": {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5},
        },
        "search_space": {"training.learning_rate": [0.05, 0.5]},
        "trials": {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }


def test_the_openapi_schema_flags_the_old_names_deprecated(alice: TestClient) -> None:
    schemas = alice.get("/openapi.json").json()["components"]["schemas"]
    for model, olds in RENAMED_IN.items():
        properties = {
            name: prop
            for name, prop in schemas.get(model, schemas.get(f"{model}-Output", {})).get("properties", {}).items()
        }
        assert properties, model
        for old in olds:
            new = RENAMED[old]
            assert properties[old].get("deprecated") is True, (model, old)
            assert f"removed in privtrain {ALIASES_REMOVED_IN}" in properties[old]["description"]
            assert new in properties[old]["description"]
            assert not properties[new].get("deprecated"), (model, new)


def _assert_aliases_equal(body: dict[str, object], olds: tuple[str, ...]) -> None:
    for old in olds:
        assert old in body and RENAMED[old] in body, old
        assert body[old] == body[RENAMED[old]], old


def test_responses_carry_both_names_with_the_same_value(alice: TestClient, dataset_id: str) -> None:
    estimate = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id)).json()
    _assert_aliases_equal(estimate, RENAMED_IN["PrivacyEstimate"])
    assert estimate["epsilon_single_job_method"] == "rdp-single-job"
    assert 0 < estimate["epsilon_single_job"] < estimate["epsilon_reserved"]

    submitted = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id)).json()
    _assert_aliases_equal(submitted, RENAMED_IN["JobOut"])
    assert submitted["epsilon_reserved"] == estimate["epsilon_reserved"] == submitted["epsilon"]
    assert submitted["epsilon_single_job"] == estimate["epsilon_single_job"]  # the planned run's, while queued
    for shown in (alice.get(f"/v1/jobs/{submitted['id']}").json(), alice.get("/v1/jobs").json()["items"][0]):
        _assert_aliases_equal(shown, RENAMED_IN["JobOut"])

    tuning_estimate = alice.post("/v1/tuning-jobs/estimate", json=_tuning_request(dataset_id)).json()
    _assert_aliases_equal(tuning_estimate, RENAMED_IN["TuningEstimate"])
    tuning = alice.post("/v1/tuning-jobs", json=_tuning_request(dataset_id)).json()
    _assert_aliases_equal(tuning, RENAMED_IN["TuningOut"])
    assert tuning["epsilon_reserved"] == tuning_estimate["epsilon_reserved"]


def test_the_client_reads_the_new_names_and_understands_older_servers(alice: TestClient, dataset_id: str) -> None:
    body = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id)).json()
    estimate = Estimate.from_api(body)
    assert (estimate.epsilon_reserved, estimate.epsilon_single_job, estimate.epsilon_single_job_method) == (
        body["epsilon_reserved"],
        body["epsilon_single_job"],
        body["epsilon_single_job_method"],
    )
    older = Estimate.from_api({k: v for k, v in body.items() if k not in RENAMED.values()})
    assert older.epsilon_reserved == estimate.epsilon_reserved
    assert older.epsilon_single_job_method == estimate.epsilon_single_job_method
    with pytest.warns(DeprecationWarning, match="use epsilon_single_job"):
        assert estimate.epsilon_prv == estimate.epsilon_single_job

    job_body = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id)).json()
    job = Job.from_api(job_body)
    assert job.epsilon_reserved == job_body["epsilon_reserved"] and job.epsilon_single_job is not None
    assert Job.from_api({k: v for k, v in job_body.items() if k not in RENAMED.values()}).epsilon_reserved == (
        job.epsilon_reserved
    )
    with pytest.warns(DeprecationWarning, match="use epsilon_reserved"):
        assert job.epsilon_ledger == job.epsilon_reserved

    tuning = TuningJob.from_api(alice.post("/v1/tuning-jobs", json=_tuning_request(dataset_id)).json())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading the new name never warns
        assert tuning.epsilon_reserved > 0
