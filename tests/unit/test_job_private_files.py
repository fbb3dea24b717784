"""A job's secret files (checkpoint, hold-out split) go when it settles, whoever settles it."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, utcnow
from kernel.jobs.private_files import PRIVATE_SUFFIXES, JobPrivateFiles
from kernel.reconciler import reconcile_once
from kernel.storage.configured import blob_store_from_settings
from tests.conftest import RecordingDispatcher, dp_sgd_spec, upload


def _private_files(settings: Settings) -> JobPrivateFiles:
    settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    return JobPrivateFiles(settings.checkpoint_dir, blob_store_from_settings(settings))


def _leave_files(files: JobPrivateFiles, job_id: str) -> list[Path]:
    """What a worker killed mid-job leaves: both files, and a torn write of the checkpoint."""
    paths = [files.path(job_id, suffix) for suffix in PRIVATE_SUFFIXES]
    paths.append(files.folder / f".{job_id}{PRIVATE_SUFFIXES[0]}.x7q.tmp")
    for path in paths:
        path.write_bytes(b"secret")
    return paths


def _set_status(database: Database, job_id: str, status: str, **fields: object) -> None:
    with database.write_transaction() as tx:
        job = tx.get(Job, job_id)
        job.status = status
        for name, value in fields.items():
            setattr(job, name, value)


@pytest.fixture
def job_ids(alice: TestClient, digits_csv: bytes) -> list[str]:
    dataset_id = upload(alice, digits_csv).json()["id"]
    return [alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).json()["id"] for _ in range(3)]


def test_jobs_on_disk_names_jobs_by_their_private_files_only(settings: Settings) -> None:
    files = _private_files(settings)
    _leave_files(files, "job_a")
    (files.folder / ".job_b.holdout.npy.1234.tmp").write_bytes(b"torn")
    (files.folder / "job_c.trial-1-2-1.safetensors").write_bytes(b"a trial's model: its queue owns it")
    (files.folder / "notes.txt").write_bytes(b"not ours")
    assert files.jobs_on_disk() == {"job_a", "job_b"}


def test_a_starting_worker_deletes_only_settled_and_unknown_jobs_files(
    database: Database, settings: Settings, job_ids: list[str]
) -> None:
    settled, running, queued = job_ids
    _set_status(database, settled, "failed")
    _set_status(database, running, "running")
    files = _private_files(settings)
    kept = _leave_files(files, running) + _leave_files(files, queued)
    gone = _leave_files(files, settled) + _leave_files(files, "job_deletedlongago")
    assert files.discard_settled(database) == sorted([settled, "job_deletedlongago"])
    assert all(path.exists() for path in kept)
    assert not any(path.exists() for path in gone)
    assert files.discard_settled(database) == []


def test_the_reconciler_deletes_the_files_of_a_job_it_fails(
    database: Database, settings: Settings, job_ids: list[str]
) -> None:
    lost, requeued, _ = job_ids
    stale = utcnow() - dt.timedelta(seconds=settings.stale_after_s + 5)
    _set_status(database, lost, "running", attempt=settings.max_attempts, heartbeat_at=stale, touched_at=stale)
    _set_status(database, requeued, "running", attempt=1, heartbeat_at=stale, touched_at=stale)
    files = _private_files(settings)
    gone, kept = _leave_files(files, lost), _leave_files(files, requeued)
    result = reconcile_once(database, settings, RecordingDispatcher())
    assert result.failed == (lost,) and result.requeued == (requeued,)
    assert not any(path.exists() for path in gone)
    assert all(path.exists() for path in kept)  # its retry resumes from them


def test_the_reconciler_and_these_files_stay_torch_free() -> None:
    """The reconciler runs in the API process and as its own small service: no torch there."""
    code = "import sys, kernel.reconciler, kernel.jobs.private_files; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_erase_removes_every_private_file_of_the_jobs_and_only_theirs(settings: Settings) -> None:
    """A deleted dataset's erasure: checkpoints, hold-out splits, torn writes and tuning trials'
    models of its jobs go; another job's files stay."""
    files = _private_files(settings)
    mine = [*_leave_files(files, "job_a"), files.folder / "job_a.trial-1-2-1.safetensors"]
    mine[-1].write_bytes(b"a trial's model")
    theirs = _leave_files(files, "job_b")
    files.erase(["job_a", "job_c"])
    assert not any(path.exists() for path in mine)
    assert all(path.exists() for path in theirs)
    files.erase([])  # nothing to do, no listing
