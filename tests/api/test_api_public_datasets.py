"""Public datasets (docs/pretraining-and-finetuning.md): uploaded with public=true they have no
budget and no ledger, accept the non-private optimizers sgd and adam, charge nothing for DP
algorithms, and their jobs' reports state plainly that no guarantee is given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import load_model
from tests.conftest import counts, digits_split, spec_for, upload
from worker.runner import JobRunner

NO_DP = "trained on a dataset its owner declared public: no differential privacy guarantee is given or needed"


def upload_public(client: TestClient, body: bytes, **params: object) -> dict:
    query = {"name": "public-digits", "format": "csv", "label_column": "label", "public": "true", **params}
    response = client.post("/v1/datasets", params=query, content=body)
    assert response.status_code == 201, response.text
    return response.json()


def non_private_spec(dataset_id: str, name: str = "sgd") -> dict:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": name, "hyperparameters": {}},
        "training": {"epochs": 4, "batch_size": 64, "learning_rate": 0.5 if name == "sgd" else 0.05},
    }


def _problem_type(response: object) -> str:
    return response.json()["type"].rsplit("/", 1)[-1]  # type: ignore[attr-defined]


def test_public_upload_has_no_budget_and_refuses_one(alice: TestClient, digits_csv: bytes) -> None:
    refused = alice.post(
        "/v1/datasets",
        params={"name": "d", "format": "csv", "label_column": "label", "public": "true", "epsilon": 1},
        content=digits_csv,
    )
    assert refused.status_code == 422 and _problem_type(refused) == "invalid-budget"
    assert "public dataset has no privacy budget" in refused.json()["detail"]
    missing = alice.post("/v1/datasets", params={"name": "d", "format": "csv", "label_column": "label"}, content=b"x")
    assert missing.status_code == 422 and _problem_type(missing) == "validation-error"
    assert alice.get("/v1/datasets").json()["items"] == []  # nothing registered by either refusal

    dataset = upload_public(alice, digits_csv)
    assert dataset["public"] is True and dataset["budget"] is None
    assert "budget" not in dataset["links"] and "ledger" not in dataset["links"]
    assert alice.get("/v1/datasets").json()["items"][0]["public"] is True
    for path in ("budget", "ledger"):
        answer = alice.get(f"/v1/datasets/{dataset['id']}/{path}")
        assert answer.status_code == 409 and _problem_type(answer) == "public-dataset"
    raised = alice.post(f"/v1/datasets/{dataset['id']}/budget", json={"epsilon": 9.0})
    assert raised.status_code == 409 and _problem_type(raised) == "public-dataset"


def test_non_private_optimizers_are_refused_on_private_data(
    alice: TestClient, digits_csv: bytes, database: Database
) -> None:
    private = upload(alice, digits_csv).json()
    before = counts(database)
    for name in ("sgd", "adam"):
        for path in ("/v1/jobs", "/v1/jobs/estimate"):
            refused = alice.post(path, json=non_private_spec(private["id"], name))
            assert refused.status_code == 422 and _problem_type(refused) == "non-private-on-private-data"
    assert counts(database) == before
    catalogue = {a["name"]: a for a in alice.get("/v1/algorithms").json()["items"]}
    assert catalogue["sgd"]["private"] is False and catalogue["sgd"]["family"] == "non-private"
    assert catalogue["dp-sgd"]["private"] is True


def test_privacy_block_rules(alice: TestClient, digits_csv: bytes) -> None:
    public = upload_public(alice, digits_csv)
    with_privacy = {**non_private_spec(public["id"]), "privacy": {"target_epsilon": 1.0}}
    refused = alice.post("/v1/jobs/estimate", json=with_privacy)
    assert refused.status_code == 422 and "takes no privacy block" in refused.json()["detail"]
    dp_without = spec_for(public["id"], "dp-sgd")
    del dp_without["privacy"]
    refused = alice.post("/v1/jobs/estimate", json=dp_without)
    assert refused.status_code == 422 and "needs privacy.target_epsilon" in refused.json()["detail"]


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_non_private_job_runs_on_public_data_without_a_ledger(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes, tmp_path: Path, name: str
) -> None:
    public = upload_public(alice, digits_csv)
    estimate = alice.post("/v1/jobs/estimate", json=non_private_spec(public["id"], name))
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["public_dataset"] is True and estimate.json()["epsilon_ledger"] == 0.0
    assert estimate.json()["budget_remaining_epsilon"] is None and estimate.json()["admissible"] is True
    submitted = alice.post("/v1/jobs", json=non_private_spec(public["id"], name))
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"

    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["epsilon"] == 0.0
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["guarantee"] == NO_DP and report["public_dataset"] is True
    assert not {"epsilon", "ledger", "event", "rdp_curve", "mechanism"} & set(report)
    assert "ε" not in json.dumps(report, ensure_ascii=False)
    html = alice.get(f"/v1/jobs/{job_id}/report", params={"format": "html"})
    assert html.status_code == 200 and "no differential privacy guarantee" in html.text
    assert counts(database)[1] == 0  # no ledger entry at all

    path = tmp_path / "model.safetensors"
    path.write_bytes(alice.get(f"/v1/jobs/{job_id}/model").content)
    model, _ = load_model(path)
    _, X_test, _, y_test = digits_split()
    with torch.no_grad():
        accuracy = float(np.mean(model(torch.as_tensor(X_test, dtype=torch.float32)).argmax(1).numpy() == y_test))
    assert accuracy > 0.85, accuracy


def test_dp_job_on_public_data_costs_nothing(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    public = upload_public(alice, digits_csv)
    spec = spec_for(public["id"], "dp-sgd", {"clipping_norm": 1.0}, target_epsilon=2.0)
    estimate = alice.post("/v1/jobs/estimate", json=spec).json()
    assert estimate["public_dataset"] is True and estimate["noise_multiplier"] > 0  # the noise still runs
    job_id = alice.post("/v1/jobs", json=spec).json()["id"]
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    assert alice.get(f"/v1/jobs/{job_id}").json()["epsilon"] == 0.0
    assert alice.get(f"/v1/jobs/{job_id}/report").json()["guarantee"] == NO_DP
    assert counts(database)[1] == 0


def test_cancel_of_a_queued_public_job_writes_no_ledger(
    alice: TestClient, digits_csv: bytes, database: Database
) -> None:
    public = upload_public(alice, digits_csv)
    job_id = alice.post("/v1/jobs", json=non_private_spec(public["id"])).json()["id"]
    cancelled = alice.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code in (200, 202) and cancelled.json()["status"] == "cancelled"
    assert counts(database)[1] == 0


def test_dashboard_metrics_and_audit_handle_public_datasets(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    """The lock-only budget row of a public dataset is never summarised as a budget."""
    from kernel.ledger.audit import verify_ledger
    from tests.ui.conftest import csrf_token_of

    public = upload_public(alice, digits_csv)
    job_id = alice.post("/v1/jobs", json=non_private_spec(public["id"])).json()["id"]
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    browser = TestClient(alice.app, follow_redirects=False)
    token = csrf_token_of(browser.get("/ui/login").text)
    key = alice.headers["Authorization"].removeprefix("Bearer ")
    assert browser.post("/ui/login", data={"csrf_token": token, "api_key": key}).status_code == 303
    listing = browser.get("/ui/datasets")
    assert listing.status_code == 200 and "no budget and no ledger" in listing.text
    page = browser.get(f"/ui/datasets/{public['id']}")
    assert page.status_code == 200 and "This dataset is public" in page.text
    assert browser.get(f"/ui/jobs/{job_id}").status_code == 200
    assert alice.get("/metrics").status_code == 200
    audit = verify_ledger(database)
    assert audit.problems == () and audit.datasets_checked == 1


def test_a_public_dataset_is_shared_like_any_other(
    alice: TestClient, bob_headers: dict[str, str], settings: Settings, database: Database, digits_csv: bytes
) -> None:
    public = upload_public(alice, digits_csv)
    assert alice.post(f"/v1/datasets/{public['id']}/grants", json={"tenant": "bob"}).status_code == 202
    invitation = alice.get("/v1/invitations", headers=bob_headers).json()["items"][0]
    assert invitation["public"] is True and invitation["budget"] is None
    assert alice.post(f"/v1/invitations/{public['id']}/accept", headers=bob_headers).status_code == 200
    seen = alice.get(f"/v1/datasets/{public['id']}", headers=bob_headers).json()
    assert seen["role"] == "analyst" and seen["public"] is True and seen["budget"] is None
    submitted = alice.post("/v1/jobs", json=non_private_spec(public["id"]), headers=bob_headers)
    assert submitted.status_code == 202, submitted.text
    assert JobRunner(settings, db=database).run(submitted.json()["id"]) == "succeeded"
    assert counts(database)[1] == 0
