"""Disk full or unwritable while a finished job writes its artifacts: a model that cannot be stored
fails the job cleanly (no model or partial report is ever served; the failed job's own report says
it failed); a report that cannot be stored yet waits beside the job and is served from there. The
ledger commits what was spent and verifies (issue 7)."""

from __future__ import annotations

import errno

from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job
from kernel.jobs import report_outbox
from kernel.jobs.private_files import PRIVATE_SUFFIXES
from kernel.ledger.audit import verify_ledger
from kernel.reconciler import reconcile_once
from kernel.storage.configured import blob_store_from_settings
from tests.conftest import RecordingDispatcher, dp_sgd_spec, upload
from worker.runner import JobRunner


def _disk_full(*_args: object, **_kwargs: object) -> object:
    raise OSError(errno.ENOSPC, "No space left on device")


def _small_job(alice: TestClient, digits_csv: bytes) -> tuple[dict[str, object], dict[str, object]]:
    dataset = upload(alice, digits_csv).json()
    spec = dp_sgd_spec(dataset["id"], target_epsilon=2.0)
    spec["training"] = {"steps": 20, "batch_size": 64, "learning_rate": 0.5}
    return dataset, alice.post("/v1/jobs", json=spec).json()


def test_disk_full_while_writing_the_model_fails_the_job_cleanly(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    dataset, job = _small_job(alice, digits_csv)
    runner = JobRunner(settings, db=database)
    runner.blobs.put_file = _disk_full  # type: ignore[method-assign]
    runner.run(str(job["id"]))

    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "failed" and final["error_code"] == "artifact-write-failed"
    assert final["steps_run"] == 20
    model = alice.get(f"/v1/jobs/{job['id']}/model")
    assert model.status_code == 409  # never a partial or missing-blob model
    report = alice.get(f"/v1/jobs/{job['id']}/report")  # the failed job's report states its charge
    assert report.status_code == 200 and report.json()["status"] == "failed"
    assert report.json()["outcome"]["error_code"] == "artifact-write-failed"
    assert report.json()["model"]["released"] is False
    ledger = alice.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
    assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]  # the data was touched
    budget = alice.get(f"/v1/datasets/{dataset['id']}/budget").json()
    assert budget["reserved_epsilon"] == 0.0 and budget["committed_epsilon"] > 0.0
    assert verify_ledger(database).ok
    assert not list(settings.checkpoint_dir.glob("*"))  # secret checkpoints gone after settling


def test_disk_full_while_storing_the_report_keeps_the_success_and_its_report(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    """The report is uploaded after the settlement commits (kernel/jobs/report_outbox.py): a store
    that refuses it does not undo a finished job. The report is served from its pending row, and
    the reconciler stores it once the store takes writes again."""
    _, job = _small_job(alice, digits_csv)
    runner = JobRunner(settings, db=database)
    runner.blobs.put_bytes = _disk_full  # type: ignore[method-assign]
    runner.run(str(job["id"]))

    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "succeeded" and "report" in final["links"]
    key = _report_key(database, str(job["id"]))
    assert not blob_store_from_settings(settings).exists(key)  # not stored yet
    served = alice.get(f"/v1/jobs/{job['id']}/report")
    assert served.status_code == 200 and served.json()["status"] == "succeeded"
    with database.read_session() as session:
        assert report_outbox.pending_body(session, str(job["id"])) is not None

    reconcile_once(database, settings, RecordingDispatcher())  # the store takes writes again
    assert blob_store_from_settings(settings).exists(key)
    with database.read_session() as session:
        assert report_outbox.pending_body(session, str(job["id"])) is None
    assert alice.get(f"/v1/jobs/{job['id']}/report").json() == served.json()
    assert verify_ledger(database).ok


def _report_key(database: Database, job_id: str) -> str:
    with database.read_session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.report_blob is not None
        return job.report_blob


def test_settling_deletes_the_torn_writes_of_a_killed_attempt(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    """A worker killed while writing its checkpoint or hold-out split leaves a temp file beside
    it; the attempt that settles the job deletes those too (they hold secret state)."""
    dataset = upload(alice, digits_csv).json()
    spec = dp_sgd_spec(dataset["id"], target_epsilon=2.0)
    spec["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
    job = alice.post("/v1/jobs", json=spec).json()
    settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    torn = [settings.checkpoint_dir / f".{job['id']}{suffix}.k1ll3d.tmp" for suffix in PRIVATE_SUFFIXES]
    other_job = settings.checkpoint_dir / ".job_another.safetensors.k1ll3d.tmp"
    for path in (*torn, other_job):
        path.write_bytes(b"secret")
    JobRunner(settings, db=database).run(job["id"])
    assert alice.get(f"/v1/jobs/{job['id']}").json()["status"] == "succeeded"
    assert not any(path.exists() for path in torn)
    assert list(settings.checkpoint_dir.glob("*")) == [other_job]  # another job's files are its own
