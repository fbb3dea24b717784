"""Disk full or unwritable while a finished job writes its artifacts: the job fails cleanly, no
model or partial report is ever served (the failed job's own report, when it can be stored, says
it failed), the ledger commits what was spent and verifies (issue 7)."""

from __future__ import annotations

import errno

import pytest
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.jobs.private_files import PRIVATE_SUFFIXES
from kernel.ledger.audit import verify_ledger
from tests.conftest import dp_sgd_spec, upload
from worker.runner import JobRunner


@pytest.mark.parametrize("failing", ["put_file", "put_bytes"])  # the model, then the report
def test_disk_full_while_writing_artifacts_fails_the_job_cleanly(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes, failing: str
) -> None:
    dataset = upload(alice, digits_csv).json()
    spec = dp_sgd_spec(dataset["id"], target_epsilon=2.0)
    spec["training"] = {"steps": 20, "batch_size": 64, "learning_rate": 0.5}
    job = alice.post("/v1/jobs", json=spec).json()
    runner = JobRunner(settings, db=database)

    def disk_full(*_args: object, **_kwargs: object) -> object:
        raise OSError(errno.ENOSPC, "No space left on device")

    setattr(runner.blobs, failing, disk_full)
    runner.run(job["id"])

    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "failed" and final["error_code"] == "artifact-write-failed"
    assert final["steps_run"] == 20
    model = alice.get(f"/v1/jobs/{job['id']}/model")
    assert model.status_code == 409  # never a partial or missing-blob model
    report = alice.get(f"/v1/jobs/{job['id']}/report")
    if failing == "put_file":  # only the model could not be written: the failed job's report states its charge
        assert report.status_code == 200 and report.json()["status"] == "failed"
        assert report.json()["outcome"]["error_code"] == "artifact-write-failed"
        assert report.json()["model"]["released"] is False
    else:  # no report could be stored at all: none is served, and the charge is committed all the same
        assert report.status_code == 409 and "no stored privacy report" in report.json()["detail"]
    ledger = alice.get(f"/v1/datasets/{dataset['id']}/ledger").json()["items"]
    assert [e["kind"] for e in ledger] == ["RESERVE", "TOUCH", "COMMIT"]  # the data was touched
    budget = alice.get(f"/v1/datasets/{dataset['id']}/budget").json()
    assert budget["reserved_epsilon"] == 0.0 and budget["committed_epsilon"] > 0.0
    assert verify_ledger(database).ok
    assert not list(settings.checkpoint_dir.glob("*"))  # secret checkpoints gone after settling


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
