"""The worker is SIGKILLed mid-training in the distributed mode (Redis + PostgreSQL): the job is
retried from its last checkpoint inside the same reservation and the ledger verifies (issue 7).
The embedded-mode twin is tests/integration/test_ledger_lifecycle.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger
from tests.conftest import digits_split, dp_sgd_spec, new_key, to_csv, upload
from tests.worker_process import crash_recovery_settings, kill_worker_mid_job, running_worker, wait_for_status

pytestmark = pytest.mark.services


def test_killed_worker_is_retried_with_redis(postgres_url: str, redis_url: str, tmp_path: Path) -> None:
    settings = crash_recovery_settings(tmp_path / "data", database_url=postgres_url, broker_url=redis_url)
    migrate(settings)
    db = Database(postgres_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'crash-redis')}"
        X, _, y, _ = digits_split()
        dataset = upload(client, to_csv(X, y), name="crash-redis").json()
        spec = dp_sgd_spec(dataset["id"], target_epsilon=4.0)
        spec["training"] = {"steps": 1500, "batch_size": 64, "learning_rate": 0.5}
        job = client.post("/v1/jobs", json=spec).json()
        first_log = tmp_path / "worker1.log"
        kill_worker_mid_job(settings, client, job["id"], first_log, after_steps=100)
        second_log = tmp_path / "worker2.log"
        with running_worker(settings, second_log):
            final = wait_for_status(client, job["id"], {"succeeded", "failed"}, log_path=second_log)
        assert final["status"] == "succeeded", final
        assert final["attempt"] in (2, 3) and final["steps_run"] == 1500
        kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()]
        assert "requeued" in kinds
        ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
        assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]
        assert verify_ledger(db).ok
    db.dispose()
