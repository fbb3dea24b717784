"""Redis restarted (its queue lost) while jobs are queued: no job is lost, the reconciler re-sends
them, every job runs exactly once inside its one reservation (issue 7, faults)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger
from tests.conftest import digits_split, dp_sgd_spec, make_settings, new_key, to_csv, upload
from tests.worker_process import running_worker, wait_for_status

pytestmark = pytest.mark.services


def test_queued_jobs_survive_a_redis_restart(postgres_url: str, redis_url: str, tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path / "data",
        database_url=postgres_url,
        broker_url=redis_url,
        heartbeat_interval_s=0.2,
        redispatch_after_s=1.0,
        reconcile_interval_s=0.3,
    )
    migrate(settings)
    db = Database(postgres_url)
    broker = redis.Redis.from_url(redis_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'restart')}"
        X, _, y, _ = digits_split()
        dataset = upload(client, to_csv(X, y), name="restart").json()
        spec = dp_sgd_spec(dataset["id"], target_epsilon=1.0)
        spec["training"] = {"epochs": 1, "batch_size": 128, "learning_rate": 1.0}
        jobs = [client.post("/v1/jobs", json=spec).json() for _ in range(2)]
        assert all(job["status"] == "queued" for job in jobs)
        assert broker.llen(settings.cpu_queue) >= 2  # the messages are in Redis ...
        broker.flushdb()  # ... and a restart without persistence loses them (queue, bindings, all);
        # the reconciler may already be re-sending: that is the recovery under test

        log_path = tmp_path / "worker.log"
        with running_worker(settings, log_path):
            finals = [wait_for_status(client, job["id"], {"succeeded", "failed"}, log_path=log_path) for job in jobs]
        assert [final["status"] for final in finals] == ["succeeded", "succeeded"]
        for job in jobs:
            kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job['id']}/events").json()]
            assert kinds.count("started") == 1  # re-sent, maybe more than once, but run once
        ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
        assert sorted(e["kind"] for e in ledger) == sorted(["RESERVE", "TOUCH", "COMMIT"] * 2)
        assert verify_ledger(db).ok
    db.dispose()
