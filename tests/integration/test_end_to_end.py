"""The whole way of a job through the embedded mode: API → filesystem broker → real worker process.

Covers success (model rebuilt and evaluated on held-out digits, report, ledger, events),
cancellation while running, and a worker-side failure.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from kernel.db.engine import Database
from kernel.db.orm import Dataset
from privtrain_common.model_files import load_model
from tests.conftest import digits_split, dp_sgd_spec, to_csv, upload
from tests.worker_process import wait_for_status

pytestmark = pytest.mark.integration

PRIVATE_WORDS = ("loss", "grad", "norm", "clip", "accuracy", "error_vector")


def evaluate(model_bytes: bytes, tmp_path: Path, X: np.ndarray, y: np.ndarray) -> float:
    path = tmp_path / "model.safetensors"
    path.write_bytes(model_bytes)
    model, config = load_model(path)
    assert config["model"]["name"] == "logistic-regression" and config["n_outputs"] == 10
    with torch.no_grad():
        predictions = model(torch.as_tensor(X, dtype=torch.float32)).argmax(dim=1).numpy()
    return float((predictions == y).mean())


def test_dp_sgd_job_end_to_end(embedded: tuple[TestClient, Path, Database], tmp_path: Path) -> None:
    client, log_path, _ = embedded
    X_train, X_test, y_train, y_test = digits_split()
    dataset = upload(client, to_csv(X_train, y_train), epsilon=8, delta=1e-5).json()
    spec = dp_sgd_spec(dataset["id"], target_epsilon=8.0)
    spec["training"] = {"epochs": 10, "batch_size": 128, "learning_rate": 2.0}
    estimate = client.post("/v1/jobs/estimate", json=spec).json()
    submitted = client.post("/v1/jobs", json=spec)
    assert submitted.status_code == 202, submitted.text
    job = wait_for_status(client, submitted.json()["id"], {"succeeded", "failed"}, log_path=log_path)
    assert job["status"] == "succeeded", job
    assert job["steps_run"] == job["steps_planned"] == estimate["steps"]
    assert job["noise_multiplier"] == estimate["noise_multiplier"]

    model_response = client.get(f"/v1/jobs/{job['id']}/model")
    assert model_response.status_code == 200
    accuracy = evaluate(model_response.content, tmp_path, X_test, y_test)
    assert accuracy > 0.80, accuracy

    report = client.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["dataset"]["sha256"] == dataset["sha256"]
    assert report["neighbouring_relation"] == "add/remove one row"
    assert report["epsilon"]["ledger"] <= 8.0 + 1e-9
    assert report["epsilon"]["prv_upper_bound"] < report["epsilon"]["ledger"]
    # the estimate's closed-form bound, then the worker's numeric one, which the job now states too
    assert estimate["epsilon_prv_method"] == "rdp-single-job" and report["epsilon"]["single_job_method"] == "prv"
    assert report["epsilon"]["prv_upper_bound"] <= estimate["epsilon_prv"]
    assert job["epsilon_prv"] == report["epsilon"]["prv_upper_bound"]
    assert report["mechanism"]["noise_multiplier"] == job["noise_multiplier"]
    assert report["mechanism"]["steps_run"] == job["steps_planned"]
    ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
    assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]
    assert report["ledger"]["commit_entry_hash"] == ledger[2]["hash"]
    # "before" is the ledger without this job (nothing else ran); the charge is what it committed
    assert report["ledger"]["before"]["reserved_epsilon"] == report["ledger"]["before"]["committed_epsilon"] == 0
    assert report["ledger"]["charge"]["epsilon_committed"] == job["epsilon_committed"] == job["epsilon"]
    assert report["ledger"]["after"]["reserved_epsilon"] == 0

    budget = client.get(f"/v1/datasets/{dataset['id']}/budget").json()
    assert budget["committed_epsilon"] == pytest.approx(job["epsilon_ledger"], rel=1e-6)
    assert budget["reserved_epsilon"] == 0.0 and budget["remaining_epsilon"] < 0.5

    events = client.get(f"/v1/jobs/{job['id']}/events").json()
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "queued" and kinds[1] == "started" and kinds[-1] == "succeeded"
    spent = [e["payload"]["epsilon_spent"] for e in events if e["kind"] == "progress"]
    assert spent and spent == sorted(spent) and spent[-1] == pytest.approx(job["epsilon_ledger"], rel=1e-6)
    for event in events:  # only public values leave the worker
        assert not any(word in key for key in event["payload"] for word in PRIVATE_WORDS)
    assert not any(word in json.dumps(report["mechanism"]) for word in ("loss", "accuracy"))


def test_cancel_while_running_commits_the_steps_run(embedded: tuple[TestClient, Path, Database]) -> None:
    client, log_path, _ = embedded
    X_train, _, y_train, _ = digits_split()
    # rows 1.. : one content, one budget (another test of this module registered the full split)
    dataset = upload(client, to_csv(X_train[1:], y_train[1:]), name="cancel-me").json()
    spec = dp_sgd_spec(dataset["id"], target_epsilon=2.0)
    spec["training"] = {"steps": 100_000, "batch_size": 64, "learning_rate": 0.1}
    job = client.post("/v1/jobs", json=spec).json()
    wait_for_status(client, job["id"], {"running"}, log_path=log_path)
    while client.get(f"/v1/jobs/{job['id']}").json()["steps_run"] < 5:
        pass
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    final = wait_for_status(client, job["id"], {"cancelled", "failed", "succeeded"}, log_path=log_path)
    assert final["status"] == "cancelled"
    assert 5 <= final["steps_run"] < 100_000
    kinds = [e["kind"] for e in client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]]
    assert kinds == ["RESERVE", "TOUCH", "COMMIT", "RELEASE"]
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget").json()
    assert 0 < budget["committed_epsilon"] < job["epsilon_ledger"]
    assert budget["reserved_epsilon"] == 0.0
    assert final["epsilon_basis"] == "committed" and final["epsilon"] == final["epsilon_committed"]
    assert final["epsilon"] == pytest.approx(budget["committed_epsilon"], rel=1e-9)


def test_worker_failure_after_touch_commits_the_reservation(embedded: tuple[TestClient, Path, Database]) -> None:
    client, log_path, db = embedded
    dataset = upload(
        client,
        b"a,b,label\n" + b"".join(b"%d,%d,%d\n" % (i, i % 7, i % 2) for i in range(200)),
        name="broken",
        delta=1e-3,
    ).json()
    with db.read_session() as session:
        blob = session.get(Dataset, dataset["id"]).blob_key
    data_dir = Path(client.app.state.services.settings.blob_dir)
    (data_dir / blob).chmod(0o640)
    (data_dir / blob).write_bytes(b"a,b,label\n1,2\n")  # corrupted on disk after registration
    spec = dp_sgd_spec(dataset["id"], target_epsilon=1.0)
    spec["training"] = {"steps": 10, "batch_size": 16, "learning_rate": 0.1}
    job = client.post("/v1/jobs", json=spec).json()
    final = wait_for_status(client, job["id"], {"failed", "succeeded"}, log_path=log_path)
    assert final["status"] == "failed" and final["error_code"] == "training-failed"
    kinds = [e["kind"] for e in client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]]
    assert kinds == ["RESERVE", "TOUCH", "COMMIT"]
    budget = client.get(f"/v1/datasets/{dataset['id']}/budget").json()
    assert budget["committed_epsilon"] == pytest.approx(job["epsilon_ledger"], rel=1e-6)
