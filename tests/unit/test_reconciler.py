"""The reconciler: lost workers are retried inside the reservation, then settled; lost messages re-sent."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry, utcnow
from kernel.ledger import operations as ledger
from kernel.reconciler import reconcile_once
from tests.conftest import RecordingDispatcher, dp_sgd_spec, upload


def _running(database: Database, job_id: str, *, attempt: int, heartbeat_age_s: float) -> None:
    """What a claimed job looks like: running, touched, with a heartbeat of some age."""
    with database.write_transaction() as tx:
        job = tx.get(Job, job_id)
        budget = ledger.lock_budget(tx, job.dataset_id)
        if job.touched_at is None:
            ledger.touch(tx, budget, job=job, actor="worker:test")
        job.status, job.attempt = "running", attempt
        job.touched_at = utcnow()
        job.heartbeat_at = utcnow() - dt.timedelta(seconds=heartbeat_age_s)


@pytest.fixture
def job_id(alice: TestClient, digits_csv: bytes) -> str:
    dataset_id = upload(alice, digits_csv).json()["id"]
    return alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=2.0)).json()["id"]


def test_fresh_heartbeat_is_left_alone(database: Database, settings: Settings, job_id: str) -> None:
    _running(database, job_id, attempt=1, heartbeat_age_s=1)
    result = reconcile_once(database, settings, RecordingDispatcher())
    assert result.requeued == () and result.failed == ()


def test_stale_job_is_requeued_inside_its_reservation(database: Database, settings: Settings, job_id: str) -> None:
    _running(database, job_id, attempt=1, heartbeat_age_s=settings.stale_after_s + 5)
    dispatcher = RecordingDispatcher()
    result = reconcile_once(database, settings, dispatcher)
    assert result.requeued == (job_id,) and dispatcher.sent == [job_id]
    with database.read_session() as s:
        job = s.get(Job, job_id)
        kinds = list(s.scalars(select(LedgerEntry.kind).order_by(LedgerEntry.seq)))
    assert job.status == "queued" and job.touched_at is not None
    assert kinds == ["RESERVE", "TOUCH"]  # no new reservation, nothing settled yet


def test_last_attempt_fails_and_commits_the_full_reservation(
    database: Database, settings: Settings, job_id: str
) -> None:
    _running(database, job_id, attempt=settings.max_attempts, heartbeat_age_s=settings.stale_after_s + 5)
    result = reconcile_once(database, settings, RecordingDispatcher())
    assert result.failed == (job_id,)
    with database.read_session() as s:
        job = s.get(Job, job_id)
        commit = s.scalar(select(LedgerEntry).where(LedgerEntry.kind == "COMMIT"))
    assert job.status == "failed" and job.error_code == "worker-lost"
    assert commit.curve == job.reserved_curve and commit.details["reason"] == "failed: worker-lost"


def test_lost_queued_messages_are_resent_but_not_too_often(database: Database, settings: Settings, job_id: str) -> None:
    dispatcher = RecordingDispatcher()
    assert reconcile_once(database, settings, dispatcher).redispatched == ()  # just dispatched
    with database.write_transaction() as tx:
        job = tx.get(Job, job_id)
        job.created_at = job.dispatched_at = utcnow() - dt.timedelta(seconds=settings.redispatch_after_s + 1)
    assert reconcile_once(database, settings, dispatcher).redispatched == (job_id,)
    assert reconcile_once(database, settings, dispatcher).redispatched == ()
