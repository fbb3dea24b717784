"""A tuning's trials on two real worker processes (Redis + PostgreSQL): the job's worker asks for a
helper through the broker, both take trials from the tuning's queue, the best trial is released
and nothing of the trials stays behind. Also: concurrent takes on PostgreSQL never hand one trial
to two workers."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap import migrate
from app.db import Database
from app.ledger_audit import verify_ledger
from app.main import create_app
from app.models import TuningTrial
from app.tuning import trial_queue
from tests.api.test_api_tuning import _request
from tests.conftest import digits_split, new_key, to_csv, upload
from tests.worker_process import crash_recovery_settings, running_worker, wait_for_status
from worker.runner import JobRunner

pytestmark = pytest.mark.services

HELPER_ANSWER = re.compile(r"Task privtrain\.run_trials\[[^\]]+\] succeeded in [0-9.]+s: ([^\"]+)\"")


def test_two_worker_processes_share_a_tunings_trials(postgres_url: str, redis_url: str, tmp_path: Path) -> None:
    settings = crash_recovery_settings(tmp_path / "data", database_url=postgres_url, broker_url=redis_url)
    migrate(settings)
    db = Database(postgres_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'tuning-redis')}"
        X, _, y, _ = digits_split()
        dataset = upload(client, to_csv(X, y), name="tuning-redis").json()
        # Mean 12: K ≤ 2, where the job's worker may run every trial before the helper starts, has p < 0.001.
        request = _request(dataset["id"], distribution="poisson", mean=12)
        request["base"]["model"] = {"name": "mlp", "params": {"hidden_sizes": [64]}}
        request["search_space"] = {"training.learning_rate": [0.1, 0.5], "training.steps": [150, 200]}
        created = client.post("/v1/tuning-jobs", json=request)
        assert created.status_code == 202, created.text
        tuning = created.json()
        logs = [tmp_path / "worker1.log", tmp_path / "worker2.log"]
        holders: set[str] = set()
        done = threading.Event()

        def watch_the_queue() -> None:  # the service's private table: which workers held trials
            while not done.is_set():
                with db.read_session() as session:
                    holders.update(
                        session.scalars(select(TuningTrial.worker).where(TuningTrial.worker.is_not(None))).all()
                    )
                done.wait(0.05)

        watcher = threading.Thread(target=watch_the_queue)
        watcher.start()
        try:
            with running_worker(settings, logs[0]), running_worker(settings, logs[1]):
                final = wait_for_status(client, tuning["job_id"], {"succeeded", "failed"}, log_path=logs[0])
        finally:
            done.set()
            watcher.join()
        assert final["status"] == "succeeded", final
        view = client.get(f"/v1/tuning-jobs/{tuning['id']}").json()
        assert view["best_job_id"] == tuning["job_id"] and 0.0 <= view["selected_metric"] <= 1.0
        assert client.get(f"/v1/jobs/{tuning['job_id']}/model").status_code == 200
        assert len(holders) == 2, holders  # both worker processes held trials
        answers = [answer for log in logs for answer in HELPER_ANSWER.findall(log.read_text())]
        assert set(answers) <= {"'done'"}  # a helper answers the same whatever it ran: it would tell K
        ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
        assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]
        assert verify_ledger(db).ok
    with db.read_session() as session:
        assert session.scalar(select(func.count()).select_from(TuningTrial)) == 0
    assert not list(settings.checkpoint_dir.glob("*.trial-*"))
    db.dispose()


def test_concurrent_takes_on_postgresql_never_share_a_trial(
    postgres_url: str, redis_url: str, tmp_path: Path, digits_csv: bytes
) -> None:
    settings = crash_recovery_settings(tmp_path / "data", database_url=postgres_url, broker_url=redis_url)
    migrate(settings)
    db = Database(postgres_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'tuning-race')}"
        dataset = upload(client, digits_csv, name="tuning-race").json()
        job_id = client.post("/v1/tuning-jobs", json=_request(dataset["id"])).json()["job_id"]
        assert JobRunner(settings, db=db).claim(job_id) is not None
        trial_queue.enqueue(db, job_id=job_id, attempt=1, candidates=[0] * 40)
        taken: list[int] = []
        lock = threading.Lock()
        barrier = threading.Barrier(8)

        def worker(name: str) -> None:
            barrier.wait()
            while (trial := trial_queue.take(db, job_id=job_id, attempt=1, worker=name)) is not None:
                with lock:
                    taken.append(trial.seq)

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(taken) == list(range(40))  # every trial once, none twice
        client.post(f"/v1/jobs/{job_id}/cancel")
    db.dispose()
