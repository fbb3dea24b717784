"""The service in this process, for benchmarks that run its jobs themselves with ``JobRunner``:
a fresh database under the settings' data directory, one API key, and scikit-learn's digits
uploaded as a CSV."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING
from unittest import mock

from fastapi.testclient import TestClient
from sklearn.datasets import load_digits

from api.main import create_app
from kernel.access.keys import generate_api_key, get_or_create_tenant, register_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import TuningSlot

if TYPE_CHECKING:
    from worker.runner import JobRunner


class NoDispatch:
    def dispatch(self, job_id: str, *, queue: str | None = None) -> None:
        """Jobs are run by the benchmark, not sent."""

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None:
        """So are tuning slots."""


def digits_csv() -> bytes:
    X, y = load_digits(return_X_y=True)
    rows = ["label," + ",".join(f"p{i}" for i in range(X.shape[1]))]
    rows += [f"{label}," + ",".join(str(int(v)) for v in row) for row, label in zip(X, y, strict=True)]
    return ("\n".join(rows) + "\n").encode()


@contextlib.contextmanager
def in_process_service(settings: Settings) -> Iterator[tuple[TestClient, Database, str]]:
    """(an authorised client, the database, the digits dataset's id); the database is disposed after."""
    migrate(settings)
    db = Database(settings.resolved_database_url)
    key = generate_api_key()
    with db.write_transaction() as session:
        register_api_key(session, tenant=get_or_create_tenant(session, "bench"), key=key)
    try:
        with TestClient(create_app(settings, dispatcher=NoDispatch())) as client:
            client.headers["Authorization"] = f"Bearer {key}"
            uploaded = client.post(
                "/v1/datasets",
                params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 100, "delta": 1e-5},
                content=digits_csv(),
                headers={"Content-Type": "text/csv"},
            )
            assert uploaded.status_code == 201, uploaded.text
            yield client, db, str(uploaded.json()["id"])
    finally:
        db.dispose()


def run_tuning_without_waiting(runner: JobRunner, db: Database, job_id: str) -> str:
    """Open a tuning's job and run its slots one after another on ``runner``, each ending as soon as
    its trial did (benchmarks measure what a tuning releases, not its schedule: the service waits
    every slot out so that its timing says nothing of K). Returns the job's status."""
    from sqlalchemy import select

    from kernel.db.orm import Job

    assert runner.run(job_id) == "opened"
    with db.read_session() as session:
        slots = session.execute(select(TuningSlot.attempt, TuningSlot.slot).where(TuningSlot.job_id == job_id)).all()
    with mock.patch("worker.slot_runner.wait_out", return_value=True):
        for attempt, slot in slots:
            runner.run_slot(job_id, attempt=attempt, slot=slot)
    with db.read_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status
