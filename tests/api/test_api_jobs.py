"""Jobs through the API without a worker: pricing, admission, problems, cancel, idempotency."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kernel.db.engine import Database
from kernel.db.orm import Job
from tests.conftest import RecordingDispatcher, counts, dp_sgd_spec, upload


def test_estimate_prices_without_storing(alice: TestClient, dataset_id: str, database: Database) -> None:
    response = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id, target_epsilon=4.0))
    assert response.status_code == 200, response.text
    estimate = response.json()
    assert estimate["admissible"] is True
    assert estimate["epsilon_ledger"] == pytest.approx(4.0, rel=1e-3)
    assert estimate["epsilon_ledger"] <= 4.0 + 1e-9
    assert estimate["epsilon_prv"] is not None and estimate["epsilon_prv"] < estimate["epsilon_ledger"]
    assert estimate["sampling_probability"] == pytest.approx(64 / 1437)
    assert estimate["steps"] == 45  # ⌈2 epochs / (64/1437)⌉
    assert estimate["noise_std_on_sum"] == pytest.approx(estimate["noise_multiplier"] * 1.0)
    assert counts(database) == (0, 0)


def test_explicit_noise_multiplier_is_priced(alice: TestClient, dataset_id: str) -> None:
    low = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id, noise_multiplier=0.8)).json()
    high = alice.post("/v1/jobs/estimate", json=dp_sgd_spec(dataset_id, noise_multiplier=3.0)).json()
    assert low["noise_multiplier"] == 0.8 and high["noise_multiplier"] == 3.0
    assert high["epsilon_ledger"] < low["epsilon_ledger"]


def test_target_epsilon_semantics_on_a_fresh_dataset(
    alice: TestClient, dataset_id: str, dispatcher: RecordingDispatcher, database: Database
) -> None:
    """ε_G = 8 admits one job of target 8 and nothing more (docs/privacy-model.md#ledger)."""
    first = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=8.0))
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "queued"
    assert dispatcher.sent == [first.json()["id"]]
    before = counts(database)
    second = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=0.5))
    assert second.status_code == 409
    problem = second.json()
    assert problem["type"] == "/problems/insufficient-privacy-budget"
    assert problem["remaining_epsilon"] < 0.5
    assert counts(database) == before  # a rejected job changes nothing
    assert dispatcher.sent == [first.json()["id"]]


def test_two_jobs_of_half_the_budget_fit(alice: TestClient, dataset_id: str) -> None:
    for _ in range(2):
        assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=4.0)).status_code == 202
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["reserved_epsilon"] > 4.0
    assert budget["remaining_epsilon"] > 0.0
    ledger = alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]
    assert [e["kind"] for e in ledger] == ["RESERVE", "RESERVE"]
    assert ledger[1]["prev_hash"] == ledger[0]["hash"]
    assert ledger[0]["event"]["event"]["kind"] == "poisson_subsampled_gaussian"


@pytest.mark.parametrize(
    ("mutate", "slug"),
    [
        (lambda s: s["algorithm"].update(name="no-such-algorithm"), "unknown-algorithm"),
        (lambda s: s["model"].update(name="resnet-1000"), "unknown-model"),
        (lambda s: s["model"].update(name="cnn2-gn"), "model-incompatible"),
        (lambda s: s["model"].update(name="cnn2-gn", params={"image_shape": [1, 8, 8]}), "model-incompatible"),
        (lambda s: s["model"].update(name="linear-regression"), "model-incompatible"),
        (lambda s: s["model"].update(name="mlp", params={"hidden_sizes": [0]}), "model-incompatible"),
        (lambda s: s["model"].update(name="mlp", params={"depth": 3}), "model-incompatible"),
        (lambda s: s["algorithm"]["hyperparameters"].update(clipping_norm=-1), "invalid-job-spec"),
        (lambda s: s["algorithm"]["hyperparameters"].update(clip=1), "invalid-job-spec"),
        (lambda s: s["training"].update(batch_size=100_000), "invalid-job-spec"),
        (lambda s: s["training"].update(epochs=None, steps=10**9), "invalid-job-spec"),
        (lambda s: s["privacy"].update(delta=0.5), "invalid-job-spec"),
        (lambda s: s.update(extra_field=1), "validation-error"),
        (lambda s: s["training"].update(steps=10), "validation-error"),
        (lambda s: s["privacy"].update(noise_multiplier=1.0), "validation-error"),
        (lambda s: s["privacy"].update(target_epsilon=-1), "validation-error"),
        (lambda s: s["training"].update(learning_rate="fast"), "validation-error"),
        (lambda s: s.update(dataset_id="ds_missing"), "not-found"),
    ],
)
def test_bad_specs_are_rejected_and_store_nothing(
    alice: TestClient, dataset_id: str, database: Database, mutate: Callable[[dict[str, Any]], None], slug: str
) -> None:
    spec = copy.deepcopy(dp_sgd_spec(dataset_id))
    mutate(spec)
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=spec)
        assert response.json()["type"] == f"/problems/{slug}", response.text
        assert response.status_code in (404, 422)
    assert counts(database) == (0, 0)


def test_cancel_of_a_queued_job_releases_its_reservation(alice: TestClient, dataset_id: str) -> None:
    job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=8.0)).json()
    response = alice.post(f"/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["reserved_epsilon"] == 0.0 and budget["committed_epsilon"] == 0.0
    assert budget["remaining_epsilon"] == pytest.approx(8.0, rel=1e-4)
    kinds = [e["kind"] for e in alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]]
    assert kinds == ["RESERVE", "RELEASE"]
    again = alice.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["type"] == "/problems/job-not-cancellable"
    # the released budget admits a new job of the full ε again
    assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=8.0)).status_code == 202
    events = alice.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["kind"] for e in events] == ["queued", "cancelled"]


def test_artifacts_of_unfinished_jobs_are_409(alice: TestClient, dataset_id: str) -> None:
    job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id)).json()
    for path in ("model", "report"):
        response = alice.get(f"/v1/jobs/{job['id']}/{path}")
        assert response.status_code == 409 and response.json()["type"] == "/problems/job-not-succeeded"


def test_jobs_are_tenant_scoped(alice: TestClient, dataset_id: str, bob_headers: dict[str, str]) -> None:
    job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id)).json()
    for method, path in (
        ("get", f"/v1/jobs/{job['id']}"),
        ("get", f"/v1/jobs/{job['id']}/events"),
        ("get", f"/v1/jobs/{job['id']}/model"),
        ("post", f"/v1/jobs/{job['id']}/cancel"),
    ):
        assert getattr(alice, method)(path, headers=bob_headers).status_code == 404
    assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id), headers=bob_headers).status_code == 404
    assert alice.get("/v1/jobs", headers=bob_headers).json()["items"] == []
    assert [j["id"] for j in alice.get("/v1/jobs").json()["items"]] == [job["id"]]


def test_idempotent_submission(
    alice: TestClient, dataset_id: str, database: Database, dispatcher: RecordingDispatcher
) -> None:
    headers = {"Idempotency-Key": "retry-1"}
    first = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id), headers=headers)
    second = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id), headers=headers)
    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert counts(database) == (1, 1) and len(dispatcher.sent) == 1
    other = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0), headers=headers)
    assert other.status_code == 422 and other.json()["type"] == "/problems/idempotency-key-reused"


def test_catalogues(alice: TestClient) -> None:
    algorithms = {a["name"]: a for a in alice.get("/v1/algorithms").json()["items"]}
    schema = algorithms["dp-sgd"]["hyperparameters_schema"]
    assert {"clipping_norm", "momentum"} <= set(schema["properties"])
    assert schema.get("additionalProperties") is False
    assert alice.get("/v1/algorithms/dp-sgd").json()["name"] == "dp-sgd"
    assert alice.get("/v1/algorithms/nope").status_code == 404
    models = {m["name"] for m in alice.get("/v1/models").json()["items"]}
    assert {"logistic-regression", "linear-regression", "mlp", "cnn2-gn"} <= models


def test_health_endpoints(app_client: TestClient) -> None:
    assert app_client.get("/healthz").json() == {"status": "ok"}
    ready = app_client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
    assert "privtrain_jobs" in app_client.get("/metrics").text


def test_cancel_of_a_requeued_touched_job_commits_its_reservation(
    alice: TestClient, dataset_id: str, database: Database
) -> None:
    """A job put back in the queue after a lost worker already opened the data."""
    from kernel.db.orm import utcnow
    from kernel.ledger import operations as ledger

    job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=2.0)).json()
    with database.write_transaction() as tx:  # what a claim + a lost worker + the reconciler leave behind
        budget = ledger.lock_budget(tx, dataset_id)
        row = tx.get(Job, job["id"])
        ledger.touch(tx, budget, job=row, actor="worker:test")
        row.touched_at, row.attempt = utcnow(), 1
    response = alice.post(f"/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    kinds = [e["kind"] for e in alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]]
    assert kinds == ["RESERVE", "TOUCH", "COMMIT"]
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["committed_epsilon"] == pytest.approx(job["epsilon_ledger"], rel=1e-6)


def test_three_target_4_jobs_fit_into_epsilon_8_not_two(alice: TestClient, digits_csv: bytes) -> None:
    """docs/epsilon.md's worked example: RDP composition admits 3 jobs of ε 4 where adding ε's gives 2."""
    dataset_id = upload(alice, digits_csv).json()["id"]
    spec = dp_sgd_spec(dataset_id, target_epsilon=4.0)
    spec["training"] = {"epochs": 20, "batch_size": 128, "learning_rate": 2.0}
    statuses = [alice.post("/v1/jobs", json=spec).status_code for _ in range(4)]
    assert statuses == [202, 202, 202, 409]
    estimate = alice.post("/v1/jobs/estimate", json=spec).json()
    assert estimate["admissible"] is False
    assert 0 < estimate["largest_admissible_epsilon"] < 4.0
    smaller = dict(spec, privacy={"target_epsilon": estimate["largest_admissible_epsilon"] * 0.999})
    assert alice.post("/v1/jobs/estimate", json=smaller).json()["admissible"] is True
    assert alice.post("/v1/jobs", json=smaller).status_code == 202


def test_an_over_budget_refusal_names_the_largest_target_that_fits_now(alice: TestClient, dataset_id: str) -> None:
    """The 409 says what the estimate says: the largest target ε a job of this shape is admitted at
    now, which is real (a job just under it is admitted), and more than what remains (subsampling)."""
    assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=6.0)).status_code == 202
    too_much = dp_sgd_spec(dataset_id, target_epsilon=8.0)
    estimate = alice.post("/v1/jobs/estimate", json=too_much).json()
    refused = alice.post("/v1/jobs", json=too_much)
    assert refused.status_code == 409, refused.text
    problem = refused.json()
    largest = problem["largest_admissible_epsilon"]
    assert largest == pytest.approx(estimate["largest_admissible_epsilon"], rel=1e-9)
    assert problem["remaining_epsilon"] < largest < 8.0 and "largest target ε" in problem["detail"]
    assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=largest * 0.999)).status_code == 202
