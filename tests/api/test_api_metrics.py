"""/metrics: job counts, queue wait and run time, heartbeats, ε per dataset — from the database."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job
from kernel.service_metrics import collect_metrics
from tests.conftest import dp_sgd_spec, upload
from worker.runner import JobRunner


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_reflect_jobs_and_the_ledger(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    """Per-dataset gauges are exported only to the holder of the metrics token."""
    settings.metrics_token = SecretStr("m" * 40)
    operator = {"Authorization": "Bearer " + "m" * 40}
    dataset = upload(alice, digits_csv).json()
    spec = dp_sgd_spec(dataset["id"], target_epsilon=1.0)
    spec["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
    done = alice.post("/v1/jobs", json=spec).json()
    queued = alice.post("/v1/jobs", json=spec).json()
    assert JobRunner(settings, db=database).run(done["id"]) == "succeeded"

    assert alice.get("/metrics").status_code == 401  # a tenant's API key is not the metrics token
    samples = _samples(alice.get("/metrics", headers=operator).text)
    assert samples[("privtrain_jobs", (("status", "succeeded"),))] == 1
    assert samples[("privtrain_jobs", (("status", "queued"),))] == 1
    wait = samples[("privtrain_job_queue_wait_seconds", (("quantile", "0.5"),))]
    run = samples[("privtrain_job_run_seconds", (("quantile", "0.5"),))]
    assert 0 <= wait < 600 and 0 < run < 600
    budget = alice.get(f"/v1/datasets/{dataset['id']}/budget").json()
    key = (("dataset_id", dataset["id"]),)
    assert samples[("privtrain_epsilon_committed", key)] == pytest.approx(budget["committed_epsilon"])
    assert samples[("privtrain_epsilon_reserved", key)] == pytest.approx(budget["reserved_epsilon"])
    assert budget["committed_epsilon"] > 0 and budget["reserved_epsilon"] > 0
    assert samples[("privtrain_running_jobs_with_heartbeat", ())] == 0
    assert queued["id"] not in alice.get("/metrics", headers=operator).text  # job ids are never labels


def test_heartbeat_age_is_the_oldest_running_jobs(alice: TestClient, database: Database, digits_csv: bytes) -> None:
    dataset = upload(alice, digits_csv).json()
    ids = [alice.post("/v1/jobs", json=dp_sgd_spec(dataset["id"], target_epsilon=1.0)).json()["id"] for _ in range(2)]
    now = dt.datetime.now(dt.UTC)
    with database.write_transaction() as tx:
        for job_id, age in zip(ids, (5.0, 42.0), strict=True):
            job = tx.get(Job, job_id)
            job.status, job.started_at = "running", now - dt.timedelta(seconds=60)
            job.heartbeat_at = now - dt.timedelta(seconds=age)
    with database.session() as session:
        registry = collect_metrics(session, per_dataset=False, now=now)
    assert registry.get_sample_value("privtrain_worker_heartbeat_age_max_seconds") == pytest.approx(42.0)
    assert registry.get_sample_value("privtrain_running_jobs_with_heartbeat") == 2
    wait = registry.get_sample_value("privtrain_job_queue_wait_seconds", {"quantile": "0.99"})
    assert wait is not None and not math.isnan(wait)


def test_readyz_names_a_schema_behind_this_code(app_client: TestClient, database: Database) -> None:
    from sqlalchemy import text

    from kernel.bootstrap import migration_head

    ready = app_client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["migrations"] == "ok"
    with database.write_transaction() as tx:
        tx.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    try:
        behind = app_client.get("/readyz")
        assert behind.status_code == 503
        assert behind.json()["checks"]["migrations"].startswith("unavailable")
        assert behind.json()["checks"]["database"] == "ok"
    finally:
        with database.write_transaction() as tx:
            tx.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": migration_head()})


def test_open_metrics_are_aggregate_only(alice: TestClient, digits_csv: bytes) -> None:
    dataset = upload(alice, digits_csv).json()
    text = alice.get("/metrics", headers={"Authorization": ""}).text
    assert "privtrain_jobs" in text
    assert dataset["id"] not in text and "privtrain_epsilon_committed" not in text
