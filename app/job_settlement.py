"""Job lifecycle writes shared by the API, the worker and the reconciler (torch-free)."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from app import ledger
from app.db import Database
from app.job_views import add_job_event
from app.models import Job, LedgerEntry, PrivacyBudget, utcnow


def settle_failed_job(
    tx: Session, budget: PrivacyBudget, job: Job, *, error_code: str, actor: str
) -> LedgerEntry:
    """After TOUCH the data was opened: commit the full reservation. Before it: release it."""
    if job.touched_at is not None:
        entry = ledger.commit(
            tx, budget, job=job, actual_event=job.event, actor=actor, reason=f"failed: {error_code}"
        )
    else:
        entry = ledger.release(tx, budget, job=job, actor=actor, reason=f"failed: {error_code}")
    job.status = "failed"
    job.error_code = error_code
    job.finished_at = utcnow()
    add_job_event(tx, job.id, "failed", {"error_code": error_code})
    return entry


def mark_dispatched(db: Database, job_id: str) -> None:
    """Remember when the job's message was last sent, so the reconciler re-sends lost ones."""
    with db.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == job_id).values(dispatched_at=utcnow()))
