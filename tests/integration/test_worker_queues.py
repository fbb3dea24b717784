"""A small job does not wait behind a GPU job: with only a CPU worker running (a real Celery
worker consuming the cpu queue), a GPU-sized job stays queued while a small job submitted after it
runs to the end."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from tests.conftest import dp_sgd_spec, make_settings, new_key, upload
from tests.worker_process import running_worker, wait_for_status


def test_a_cpu_worker_runs_small_jobs_while_a_gpu_job_waits(tmp_path: Path, digits_csv: bytes) -> None:
    settings = make_settings(tmp_path / "data", cpu_job_max_parameters=10_000)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(database, 'alice')}"
        dataset = upload(client, digits_csv).json()["id"]
        large = {**dp_sgd_spec(dataset), "model": {"name": "mlp", "params": {"hidden_sizes": [256]}}}
        gpu_job = client.post("/v1/jobs", json=large).json()
        small = dp_sgd_spec(dataset)
        small["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
        cpu_job = client.post("/v1/jobs", json=small).json()
        assert (gpu_job["queue"], cpu_job["queue"]) == ("gpu", "cpu")
        log = tmp_path / "cpu-worker.log"
        with running_worker(settings.model_copy(update={"worker_queues": "cpu"}), log):
            final = wait_for_status(client, cpu_job["id"], {"succeeded", "failed"}, log_path=log)
        assert final["status"] == "succeeded", final
        assert client.get(f"/v1/jobs/{gpu_job['id']}").json()["status"] == "queued"  # no GPU worker took it
    database.dispose()
