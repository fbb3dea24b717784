"""Ledger lifecycle through real processes: DP evaluation, budget raises, a worker killed mid-run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger
from tests.conftest import digits_split, dp_sgd_spec, make_settings, new_key, to_csv, upload
from tests.worker_process import crash_recovery_settings, kill_worker_mid_job, running_worker, wait_for_status

pytestmark = pytest.mark.integration

# Keys that would carry data-dependent values other than the accounted releases.
FORBIDDEN_KEYS = re.compile(r"loss|grad|(?<!clipping_)norm(?!al)|clip_count|clipped|error_vector|per_sample", re.I)
PUBLIC_SPEC_KEYS = frozenset({"token_loss", "loss_clip"})
"""Job-spec fields the submitter chose (training.token_loss, evaluation.loss_clip): public choices
whose names match the pattern, not training values."""


def _digits_dataset(client: TestClient, *, first_row: int, **params: object) -> dict:
    """The digits training split from ``first_row`` on: each test's upload is its own content (one
    content, one budget: the same bytes cannot be registered twice by one tenant)."""
    X_train, _, y_train, _ = digits_split()
    response = upload(client, to_csv(X_train[first_row:], y_train[first_row:]), **params)
    assert response.status_code == 201, response.text
    return response.json()


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for k in value] + [k2 for v in value.values() for k2 in _keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


def test_dp_evaluation_is_released_charged_and_nothing_else_leaks(embedded: tuple[TestClient, Path, Database]) -> None:
    client, log_path, _ = embedded
    dataset = _digits_dataset(client, first_row=0, name="eval")
    spec = dp_sgd_spec(dataset["id"], target_epsilon=6.0)
    spec["training"] = {"epochs": 10, "batch_size": 128, "learning_rate": 2.0}
    spec["evaluation"] = {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.5}
    estimate = client.post("/v1/jobs/estimate", json=spec).json()
    assert estimate["evaluation_epsilon"] > 0
    assert estimate["epsilon_ledger"] == pytest.approx(6.0, rel=1e-3)  # training + evaluation together
    job = client.post("/v1/jobs", json=spec).json()
    final = wait_for_status(client, job["id"], {"succeeded", "failed"}, log_path=log_path)
    assert final["status"] == "succeeded", final
    metrics = final["metrics"]
    assert metrics["metric"] == "accuracy" and metrics["mechanism"] == "laplace"
    assert metrics["normaliser"] == pytest.approx(0.25 * dataset["n_rows"])
    assert 0.5 < metrics["accuracy"] < 1.2  # noisy (Laplace b = 2 on a count of ~360), yet informative
    report = client.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["released_metrics"] == metrics
    leaves = report["event"]["event"]["events"]
    assert [leaf["kind"] for leaf in leaves] == ["poisson_subsampled_gaussian", "laplace"]
    assert leaves[1]["noise_multiplier"] == pytest.approx(2.0)

    events = client.get(f"/v1/jobs/{job['id']}/events").json()
    bodies = [final, report, *events]
    assert not [k for body in bodies for k in _keys(body) if FORBIDDEN_KEYS.search(k) and k not in PUBLIC_SPEC_KEYS]
    log_text = log_path.read_text()
    assert not re.search(r'"(loss|grad_norm|clip_count)"', log_text)
    assert str(metrics["accuracy"]) not in log_text  # even the released value is not logged


def test_budget_raise_is_an_adjust_entry_flagged_in_later_reports(embedded: tuple[TestClient, Path, Database]) -> None:
    client, log_path, db = embedded
    dataset = _digits_dataset(client, first_row=1, name="raise", epsilon=2)
    path = f"/v1/datasets/{dataset['id']}/budget"
    lower = client.post(path, json={"epsilon": 1.0})
    assert lower.status_code == 422 and lower.json()["type"] == "/problems/invalid-budget"
    stranger = {"Authorization": f"Bearer {new_key(db, 'mallory')}"}
    assert client.post(path, json={"epsilon": 9.0}, headers=stranger).status_code == 404
    raised = client.post(path, json={"epsilon": 4.0, "reason": "board approval 2026-11"})
    assert raised.status_code == 200 and raised.json()["epsilon"] == 4.0
    assert raised.json()["remaining_epsilon"] == pytest.approx(4.0, rel=1e-4)
    ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
    assert [e["kind"] for e in ledger] == ["ADJUST"]
    assert ledger[0]["details"]["epsilon_from"] == 2.0 and ledger[0]["details"]["epsilon_to"] == 4.0
    spec = dp_sgd_spec(dataset["id"], target_epsilon=3.0)
    spec["training"] = {"steps": 30, "batch_size": 64, "learning_rate": 0.5}
    job = client.post("/v1/jobs", json=spec).json()
    assert wait_for_status(client, job["id"], {"succeeded", "failed"}, log_path=log_path)["status"] == "succeeded"
    report = client.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["ledger"]["budget_adjustments"][0]["epsilon_to"] == 4.0
    assert "raised this dataset's budget" in report["caveats"][0]
    assert "running total" in report["caveats"][0] and "not a guarantee fixed in advance" in report["caveats"][0]
    assert verify_ledger(db, dataset_id=dataset["id"]).ok


def test_killed_worker_is_retried_inside_the_same_reservation(tmp_path: Path) -> None:
    settings = crash_recovery_settings(tmp_path / "data")
    migrate(settings)
    db = Database(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'alice')}"
        dataset = _digits_dataset(client, first_row=2, name="crash")
        spec = dp_sgd_spec(dataset["id"], target_epsilon=4.0)
        spec["training"] = {"steps": 1500, "batch_size": 64, "learning_rate": 0.5}
        job = client.post("/v1/jobs", json=spec).json()
        first_log = tmp_path / "worker1.log"
        kill_worker_mid_job(settings, client, job["id"], first_log, after_steps=100)
        assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "running"
        second_log = tmp_path / "worker2.log"
        with running_worker(settings, second_log):
            final = wait_for_status(client, job["id"], {"succeeded", "failed"}, log_path=second_log)
        assert final["status"] == "succeeded", final
        # attempt 2 normally; a starved machine can stall a heartbeat past stale_after_s once more
        assert final["attempt"] in (2, 3) and final["steps_run"] == 1500
        kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()]
        assert "requeued" in kinds and kinds.count("started") == final["attempt"]
        ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
        assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]  # one reservation, one touch
        budget = client.get(f"/v1/datasets/{dataset['id']}/budget").json()
        assert budget["committed_epsilon"] == pytest.approx(job["epsilon_ledger"], rel=1e-6)
        assert verify_ledger(db).ok
    assert not list((settings.checkpoint_dir).glob("*"))  # secret checkpoints are gone after settling
    db.dispose()


def test_job_over_its_time_limit_is_stopped_and_commits_its_reservation(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", heartbeat_interval_s=0.1, job_time_limit_s=600.0)
    migrate(settings)
    db = Database(settings.resolved_database_url)
    log_path = tmp_path / "worker.log"
    with running_worker(settings, log_path), TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'alice')}"
        dataset = _digits_dataset(client, first_row=3, name="slow")
        spec = dp_sgd_spec(dataset["id"], target_epsilon=2.0)
        # the job's own limit (5 s), below the service's (600 s)
        spec["training"] = {"steps": 200_000, "batch_size": 64, "learning_rate": 0.1, "time_limit_s": 5.0}
        job = client.post("/v1/jobs", json=spec).json()
        final = wait_for_status(client, job["id"], {"failed", "succeeded", "cancelled"}, log_path=log_path)
        assert final["status"] == "failed" and final["error_code"] == "time-limit"
        assert 0 < final["steps_run"] < 200_000
        kinds = [e["kind"] for e in client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]]
        assert kinds == ["RESERVE", "TOUCH", "COMMIT"]
        budget = client.get(f"/v1/datasets/{dataset['id']}/budget").json()
        assert budget["committed_epsilon"] == pytest.approx(job["epsilon_ledger"], rel=1e-6)
    db.dispose()
