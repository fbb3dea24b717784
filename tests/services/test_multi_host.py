"""Workers on two "hosts" that share nothing but PostgreSQL, Redis and an S3-compatible object
store (a real server process): each worker has its own data directory, so blobs, checkpoints and
hold-out splits can only pass through the store. The first worker is SIGKILLed mid-job; the
second resumes it from the checkpoint in the store, inside the same reservation, and the ledger
verifies."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger
from tests.conftest import digits_split, dp_sgd_spec, new_key, to_csv, upload
from tests.object_store import ObjectStoreServer
from tests.worker_process import crash_recovery_settings, kill_worker_mid_job, running_worker, wait_for_status

pytestmark = pytest.mark.services


def test_a_job_survives_its_host_and_finishes_on_another(
    postgres_url: str, redis_url: str, s3_bucket: str, object_store_server: ObjectStoreServer, tmp_path: Path
) -> None:
    api = crash_recovery_settings(
        tmp_path / "api", database_url=postgres_url, broker_url=redis_url, storage_url=s3_bucket
    )
    migrate(api)
    db = Database(postgres_url)
    with TestClient(create_app(api)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'two-hosts')}"
        X, _, y, _ = digits_split()
        dataset = upload(client, to_csv(X, y), name="two-hosts").json()
        spec = dp_sgd_spec(dataset["id"], target_epsilon=4.0)
        spec["training"] = {"steps": 1500, "batch_size": 64, "learning_rate": 0.5}
        spec["evaluation"] = {"holdout_fraction": 0.2, "epsilon": 0.5}
        job = client.post("/v1/jobs", json=spec).json()
        host_a = api.model_copy(update={"data_dir": tmp_path / "host-a"})
        host_b = api.model_copy(update={"data_dir": tmp_path / "host-b"})
        first_log = tmp_path / "worker-a.log"
        kill_worker_mid_job(host_a, client, job["id"], first_log, after_steps=100)
        second_log = tmp_path / "worker-b.log"
        with running_worker(host_b, second_log):
            final = wait_for_status(client, job["id"], {"succeeded", "failed"}, log_path=second_log)
        assert final["status"] == "succeeded", second_log.read_text()[-3000:]
        assert final["attempt"] in (2, 3) and final["steps_run"] == 1500
        report = client.get(f"/v1/jobs/{job['id']}/report").json()
        assert report["execution"]["steps"] < 1500  # host B resumed from host A's checkpoint
        assert "private state fetched from the store" in second_log.read_text()
        ledger = client.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
        assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]
        assert verify_ledger(db).ok
        model = client.get(f"/v1/jobs/{job['id']}/model")
        assert model.status_code == 200
    assert not (tmp_path / "api" / "blobs").exists()  # the API kept no blob on its own disk
    assert not (tmp_path / "host-b" / "blobs").exists()
    bucket = s3_bucket.removeprefix("s3://").split("/")[0]
    private = object_store_server.client().list_objects_v2(Bucket=bucket, Prefix="blobs/private/")
    assert private.get("KeyCount", 0) == 0  # the job's secret files are gone once it settled
    db.dispose()
