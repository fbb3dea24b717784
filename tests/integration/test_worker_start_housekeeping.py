"""A worker process starting on a host deletes what a lost worker left there of settled jobs."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.jobs.private_files import PRIVATE_SUFFIXES
from tests.conftest import dp_sgd_spec, new_key, upload
from tests.worker_process import crash_recovery_settings, running_worker


def test_a_starting_worker_deletes_a_cancelled_jobs_leftover_checkpoint(tmp_path: Path, digits_csv: bytes) -> None:
    settings = crash_recovery_settings(tmp_path / "data")
    migrate(settings)
    db = Database(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'alice')}"
        dataset = upload(client, digits_csv).json()
        job = client.post("/v1/jobs", json=dp_sgd_spec(dataset["id"], target_epsilon=1.0)).json()
        assert client.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
        settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        leftovers = [settings.checkpoint_dir / f"{job['id']}{suffix}" for suffix in PRIVATE_SUFFIXES]
        leftovers.append(settings.checkpoint_dir / f".{job['id']}{PRIVATE_SUFFIXES[0]}.k1ll.tmp")
        for path in leftovers:
            path.write_bytes(b"a lost worker's secret state")
        log_path = tmp_path / "worker.log"
        with running_worker(settings, log_path):
            deadline = time.monotonic() + 90
            while any(path.exists() for path in leftovers):
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.1)
    db.dispose()
