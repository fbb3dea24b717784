"""A tuning's slots on two real worker processes (Redis + PostgreSQL): the worker that opens the
tuning sends its slots through the broker, both workers run them, every slot task lasts the
slot's length and answers the same whatever it held (Celery logs both), the best trial is
released and nothing of the trials stays behind. Also: concurrent takes on PostgreSQL never hand
one trial to two slots."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.db.orm import TuningSlot, TuningTrial
from kernel.ledger.audit import verify_ledger
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from tests.conftest import digits_split, new_key, to_csv, upload
from tests.tuning_run import tuning_request
from tests.worker_process import crash_recovery_settings, running_worker, wait_for_status
from worker.runner import JobRunner

pytestmark = pytest.mark.services

SLOT_TASK = re.compile(r"Task privtrain\.run_tuning_slot\[[^\]]+\] succeeded in ([0-9.]+)s: ([^\"]+)\"")
TRIAL_TIME_LIMIT_S, SLOT_MARGIN_S = 6.0, 2.0


def test_two_worker_processes_share_a_tunings_slots(postgres_url: str, redis_url: str, tmp_path: Path) -> None:
    settings = crash_recovery_settings(
        tmp_path / "data", database_url=postgres_url, broker_url=redis_url, tuning_slot_margin_s=SLOT_MARGIN_S
    )
    migrate(settings)
    db = Database(postgres_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'tuning-redis')}"
        X, _, y, _ = digits_split()
        dataset = upload(client, to_csv(X, y), name="tuning-redis").json()
        request = tuning_request(dataset["id"], distribution="poisson", mean=2, maximum=4)
        request["base"]["training"]["time_limit_s"] = TRIAL_TIME_LIMIT_S
        created = client.post("/v1/tuning-jobs", json=request)
        assert created.status_code == 202, created.text
        tuning = created.json()
        logs = [tmp_path / "worker1.log", tmp_path / "worker2.log"]
        holders: set[str] = set()
        done = threading.Event()

        def watch_the_slots() -> None:
            while not done.is_set():
                with db.read_session() as session:
                    holders.update(
                        session.scalars(select(TuningSlot.worker).where(TuningSlot.worker.is_not(None))).all()
                    )
                done.wait(0.05)

        watcher = threading.Thread(target=watch_the_slots)
        watcher.start()
        try:
            with running_worker(settings, logs[0]), running_worker(settings, logs[1]):
                final = wait_for_status(client, tuning["job_id"], {"succeeded", "failed"}, log_path=logs[0])
        finally:
            done.set()
            watcher.join()
        view = client.get(f"/v1/tuning-jobs/{tuning['id']}").json()
        assert final["status"] in {"succeeded", "failed"}
        if final["status"] == "failed":  # K = 0 (Poisson, p ≈ 0.1): nothing to release, the same slots
            assert view["error_code"] == "no-trials-drawn", view
        else:
            assert view["best_job_id"] == tuning["job_id"] and 0.0 <= view["selected_metric"] <= 1.0
            assert client.get(f"/v1/jobs/{tuning['job_id']}/model").status_code == 200
        assert view["schedule"]["slots_done"] == 4
        assert len(holders) == 2, holders  # both worker processes ran slots
        tasks = [task for log in logs for task in SLOT_TASK.findall(log.read_text())]
        assert len(tasks) == 4
        assert {answer for _, answer in tasks} <= {"'done'", "'succeeded'", "'failed'"}
        slot_seconds = TRIAL_TIME_LIMIT_S + SLOT_MARGIN_S
        assert all(slot_seconds <= float(seconds) < slot_seconds + 2.0 for seconds, _ in tasks), tasks
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
        dataset = upload(client, digits_csv, name="tuning-race", epsilon=50).json()
        request = tuning_request(dataset["id"], distribution="poisson", mean=40, maximum=60)
        created = client.post("/v1/tuning-jobs", json=request)
        assert created.status_code == 202, created.text
        job_id = created.json()["job_id"]
        assert JobRunner(settings, db=db).claim(job_id) is not None
        assert tuning_slots.open_tuning(db, job_id=job_id, attempt=1, candidates=[0] * 40, slots=60)
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
