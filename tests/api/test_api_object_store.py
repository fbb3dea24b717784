"""The service with its blobs in an S3-compatible object store (a real server process): the API
and a worker with different data directories share nothing but the database and the store; an
outage of the store is a 503 problem that leaves nothing behind."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

import worker.train as train_module
from api.main import create_app
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job
from kernel.jobs.private_files import JobPrivateFiles
from kernel.ledger.audit import verify_ledger
from kernel.reconciler import reconcile_once
from kernel.storage.configured import blob_store_from_settings
from kernel.storage.erasure import evict_erased_copies
from privtrain import Client
from tests.client.conftest import BASE_URL, AppTransport
from tests.conftest import RecordingDispatcher, counts, dp_sgd_spec, make_settings, new_key, upload
from tests.object_store import ObjectStoreServer, free_port
from worker.runner import JobRunner


@pytest.fixture
def s3_settings(tmp_path: Path, s3_bucket: str) -> Settings:
    settings = make_settings(tmp_path / "api", storage_url=s3_bucket, max_upload_bytes=5_000_000)
    migrate(settings)
    return settings


@pytest.fixture
def s3_client(s3_settings: Settings) -> Iterator[tuple[TestClient, Database]]:
    database = Database(s3_settings.resolved_database_url)
    with TestClient(create_app(s3_settings, dispatcher=RecordingDispatcher())) as client:
        client.headers["Authorization"] = f"Bearer {new_key(database, 'alice')}"
        yield client, database
    database.dispose()


def test_upload_train_and_download_share_nothing_but_the_database_and_the_store(
    s3_client: tuple[TestClient, Database],
    s3_settings: Settings,
    object_store_server: ObjectStoreServer,
    digits_csv: bytes,
    tmp_path: Path,
) -> None:
    client, database = s3_client
    response = upload(client, digits_csv)
    assert response.status_code == 201, response.text
    bucket = s3_settings.storage_url.removeprefix("s3://").split("/")[0]  # type: ignore[union-attr]
    listed = object_store_server.client().list_objects_v2(Bucket=bucket)
    digest = hashlib.sha256(digits_csv).hexdigest()
    assert [item["Key"] for item in listed["Contents"]] == [f"blobs/sha256/{digest[:2]}/{digest}"]
    assert not s3_settings.blob_dir.exists()  # nothing on the API's own disk but temporary files

    submitted = client.post("/v1/jobs", json=dp_sgd_spec(response.json()["id"]))
    assert submitted.status_code == 202, submitted.text
    # A worker on "another host": its own data directory, the same database and store.
    worker_settings = s3_settings.model_copy(
        update={"data_dir": tmp_path / "worker", "database_url": s3_settings.resolved_database_url}
    )
    assert JobRunner(worker_settings, db=database).run(submitted.json()["id"]) == "succeeded"
    assert (worker_settings.blob_cache_dir / f"sha256/{digest[:2]}/{digest}").is_file()  # fetched, cached

    job = submitted.json()["id"]
    model = client.get(f"/v1/jobs/{job}/model")
    assert model.status_code == 200 and model.content[:8]  # streamed by the API from the store
    listed = object_store_server.client().list_objects_v2(Bucket=bucket)
    stored = {item["Key"].rsplit("/", 1)[-1] for item in listed["Contents"]}
    assert hashlib.sha256(model.content).hexdigest() in stored
    report = client.get(f"/v1/jobs/{job}/report")
    assert report.status_code == 200 and report.json()["epsilon"]["ledger"] > 0


def test_an_object_store_outage_is_a_503_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digits_csv: bytes
) -> None:
    server = ObjectStoreServer(port=free_port())
    server.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        server.client().create_bucket(Bucket="outage")
        settings = make_settings(tmp_path / "api", storage_url="s3://outage")
        migrate(settings)
        database = Database(settings.resolved_database_url)
        with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
            client.headers["Authorization"] = f"Bearer {new_key(database, 'alice')}"
            assert client.get("/readyz").json()["checks"]["storage"] == "ok"
            server.stop()
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["storage"].startswith("unavailable")
            refused = upload(client, digits_csv)
            assert refused.status_code == 503, refused.text
            assert refused.json()["type"] == "/problems/storage-unavailable"
            assert refused.headers["Retry-After"] == "5"
            assert counts(database) == (0, 0) and client.get("/v1/datasets").json()["items"] == []
            assert not [p for p in settings.tmp_dir.iterdir() if p.is_file()]
            server.start()  # back: the same API process takes uploads again, no restart
            server.client().create_bucket(Bucket="outage")
            assert upload(client, digits_csv).status_code == 201
        database.dispose()
    finally:
        server.stop()


class _HostLost(BaseException):
    """The worker's host disappears mid-job (not an Exception: the runner cannot settle anything)."""


def test_a_job_whose_host_is_lost_resumes_on_another_host_from_its_checkpoint(
    s3_client: tuple[TestClient, Database],
    s3_settings: Settings,
    object_store_server: ObjectStoreServer,
    digits_csv: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Host A checkpoints (and draws the evaluation's hold-out split), then vanishes; host B, with
    its own data directory, fetches both from the store and trains only the remaining steps, inside
    the one reservation; the private files are gone from the store once the job settles."""
    client, database = s3_client
    dataset = upload(client, digits_csv).json()["id"]
    spec = dp_sgd_spec(dataset)
    spec["training"] = {"steps": 40, "batch_size": 64, "learning_rate": 0.5}
    spec["evaluation"] = {"holdout_fraction": 0.2, "epsilon": 0.5}
    submitted = client.post("/v1/jobs", json=spec)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()["id"]

    def host(name: str) -> Settings:
        return s3_settings.model_copy(
            update={
                "data_dir": tmp_path / name,
                "database_url": s3_settings.resolved_database_url,
                "checkpoint_every_steps": 10,
                "stale_after_s": 0.0,
            }
        )

    real_save = train_module.save_training_state

    def save_then_vanish(path: Path, state: Any, **kwargs: Any) -> None:
        real_save(path, state, **kwargs)
        if state.step >= 30:
            raise _HostLost  # step 30's checkpoint is on host A's disk only: the store has step 20's

    monkeypatch.setattr(train_module, "save_training_state", save_then_vanish)
    host_a, host_b = host("host-a"), host("host-b")
    with pytest.raises(_HostLost):
        JobRunner(host_a, db=database).run(job)
    monkeypatch.setattr(train_module, "save_training_state", real_save)
    bucket = host_a.storage_url.removeprefix("s3://").split("/")[0]  # type: ignore[union-attr]
    private = object_store_server.client().list_objects_v2(Bucket=bucket, Prefix="blobs/private/")
    assert sorted(item["Key"] for item in private["Contents"]) == [
        f"blobs/private/{job}.holdout.npy",
        f"blobs/private/{job}.safetensors",
    ]
    holdout_a = np.load(host_a.checkpoint_dir / f"{job}.holdout.npy")

    assert reconcile_once(database, host_b, RecordingDispatcher()).requeued == (job,)
    assert JobRunner(host_b, db=database).run(job) == "succeeded"
    final = client.get(f"/v1/jobs/{job}").json()
    assert final["attempt"] == 2 and final["steps_run"] == 40
    report = client.get(f"/v1/jobs/{job}/report").json()
    assert report["execution"]["steps"] == 20  # only the steps after the checkpoint ran on host B
    ledger = client.get(f"/v1/datasets/{dataset}/ledger").json()["items"]
    assert [entry["kind"] for entry in ledger] == ["RESERVE", "TOUCH", "COMMIT"]
    assert verify_ledger(database).ok
    assert not (host_b.checkpoint_dir / f"{job}.holdout.npy").exists()  # settled: deleted
    private = object_store_server.client().list_objects_v2(Bucket=bucket, Prefix="blobs/private/")
    assert private.get("KeyCount", 0) == 0
    assert holdout_a.dtype == np.bool_ and 0 < holdout_a.sum() < holdout_a.size


def test_pre_signed_downloads_redirect_after_the_tenant_checks(
    tmp_path: Path, s3_bucket: str, digits_csv: bytes, object_store_server: ObjectStoreServer
) -> None:
    settings = make_settings(tmp_path / "api", storage_url=s3_bucket, download_mode="presigned")
    migrate(settings)
    database = Database(settings.resolved_database_url)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    with TestClient(app, follow_redirects=False) as client:
        alice = {"Authorization": f"Bearer {new_key(database, 'alice')}"}
        client.headers.update(alice)
        dataset = upload(client, digits_csv)
        assert dataset.status_code == 201, dataset.text
        submitted = client.post("/v1/jobs", json=dp_sgd_spec(dataset.json()["id"])).json()
        assert JobRunner(settings, db=database).run(submitted["id"]) == "succeeded"
        answer = client.get(f"/v1/jobs/{submitted['id']}/model")
        assert answer.status_code == 307 and answer.headers["cache-control"] == "no-store"
        location, announced = answer.headers["location"], answer.headers["x-content-sha256"]
        assert location.startswith(object_store_server.endpoint)
        fetched = httpx.get(location)  # no API key: the signature is the permission, for minutes
        assert fetched.status_code == 200 and hashlib.sha256(fetched.content).hexdigest() == announced
        bob = {"Authorization": f"Bearer {new_key(database, 'bob')}"}
        assert client.get(f"/v1/jobs/{submitted['id']}/model", headers=bob).status_code == 404  # no URL for bob

        api = Client(BASE_URL, api_key=alice["Authorization"].removeprefix("Bearer "), transport=AppTransport(client))
        saved = api.download_model(submitted["id"], tmp_path)
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == announced
    database.dispose()


def test_a_deleted_dataset_leaves_nothing_in_the_store_nor_in_any_hosts_cache(
    s3_client: tuple[TestClient, Database],
    s3_settings: Settings,
    object_store_server: ObjectStoreServer,
    digits_csv: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's host vanishes after checkpointing (its hold-out split and checkpoint are in the
    store's private area, the upload in its cache) and the job is requeued; another job succeeded
    on host B. The owner deletes the dataset with its models: the requeued job commits its whole
    reservation, and the upload, the model and every private file leave the bucket; the report
    stays. When host A's worker is back, its sweep removes its checkpoint and its cached upload."""
    client, database = s3_client
    dataset = upload(client, digits_csv).json()["id"]
    spec = dp_sgd_spec(dataset)
    spec["training"] = {"steps": 40, "batch_size": 64, "learning_rate": 0.5}
    spec["evaluation"] = {"holdout_fraction": 0.2, "epsilon": 0.5}
    lost, done = (client.post("/v1/jobs", json=spec).json()["id"] for _ in range(2))

    def host(name: str) -> Settings:
        return s3_settings.model_copy(
            update={
                "data_dir": tmp_path / name,
                "database_url": s3_settings.resolved_database_url,
                "checkpoint_every_steps": 10,
                "stale_after_s": 0.0,
            }
        )

    real_save = train_module.save_training_state

    def save_then_vanish(path: Path, state: Any, **kwargs: Any) -> None:
        real_save(path, state, **kwargs)
        if state.step >= 20:
            raise _HostLost

    host_a, host_b = host("host-a"), host("host-b")
    monkeypatch.setattr(train_module, "save_training_state", save_then_vanish)
    with pytest.raises(_HostLost):
        JobRunner(host_a, db=database).run(lost)
    monkeypatch.setattr(train_module, "save_training_state", real_save)
    assert reconcile_once(database, host_b, RecordingDispatcher()).requeued == (lost,)
    assert JobRunner(host_b, db=database).run(done) == "succeeded"
    bucket = s3_settings.storage_url.removeprefix("s3://").split("/")[0]  # type: ignore[union-attr]
    store = object_store_server.client()

    def keys(prefix: str = "blobs/") -> set[str]:
        return {item["Key"] for item in store.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}

    digest = hashlib.sha256(digits_csv).hexdigest()
    upload_key = f"blobs/sha256/{digest[:2]}/{digest}"
    with database.read_session() as session:
        done_row = session.get(Job, done)
        assert done_row is not None and done_row.model_blob is not None and done_row.report_blob is not None
        model_object, report_object = f"blobs/{done_row.model_blob}", f"blobs/{done_row.report_blob}"
    cached_on_a = host_a.blob_cache_dir / upload_key.removeprefix("blobs/")
    assert upload_key in keys() and model_object in keys() and keys("blobs/private/")
    assert cached_on_a.is_file() and (host_a.checkpoint_dir / f"{lost}.safetensors").is_file()

    deleted = client.delete(f"/v1/datasets/{dataset}", params={"models": "delete"})

    assert deleted.status_code == 200, deleted.text
    assert keys("blobs/private/") == set()
    assert upload_key not in keys() and model_object not in keys() and report_object in keys()
    ledger = [entry["kind"] for entry in client.get(f"/v1/datasets/{dataset}/ledger").json()["items"]]
    assert ledger.count("COMMIT") == 2 and verify_ledger(database).ok
    lost_view = client.get(f"/v1/jobs/{lost}").json()
    assert lost_view["status"] == "cancelled"
    assert lost_view["epsilon_committed"] == pytest.approx(lost_view["epsilon_ledger"], rel=1e-6)

    # host A's worker starts again: its start-up sweep clears what its lost attempt left
    store_a = blob_store_from_settings(host_a)
    JobPrivateFiles(host_a.checkpoint_dir, store_a).discard_settled(database)
    assert evict_erased_copies(database, store_a) == 1
    assert not cached_on_a.exists() and not list(host_a.checkpoint_dir.glob(f"*{lost}*"))
