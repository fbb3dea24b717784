"""Cancelling a job: the one rule that ``POST /v1/jobs/{id}/cancel`` and the dashboard's cancel
button both apply, so the two can never settle a cancelled job's budget differently.

The caller has checked that its tenant may cancel the job (``app.access.job_for(need="cancel")``)
and runs this in a write transaction; the budget lock orders it against the worker.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from app import ledger
from app.job_views import add_job_event
from app.models import Job, utcnow

__all__ = ["JobNotCancellable", "cancel_job"]


class JobNotCancellable(Exception):
    """The job has already ended (``status`` says how)."""

    def __init__(self, status: str) -> None:
        super().__init__(f"the job is already {status}")
        self.status = status


def cancel_job(tx: Session, *, job_id: str, dataset_id: str, actor: str) -> Job:
    """Cancel under the dataset's budget lock and return the job as it now is.

    A queued job ends at once: its reservation goes back to the budget, unless a lost attempt
    already opened the data (requeued), in which case the whole reservation is committed, as for a
    crash. A running job gets ``cancel_requested`` and stops at its next step (the worker settles
    it). Raises :class:`JobNotCancellable` for a job that has already ended.
    """
    budget = ledger.lock_budget(tx, dataset_id)
    result = tx.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "queued")
        .values(status="cancelled", cancel_requested=True, finished_at=utcnow())
    )
    job = tx.get(Job, job_id, populate_existing=True)
    assert job is not None
    if result.rowcount == 1 and job.touched_at is None:
        ledger.release(tx, budget, job=job, actor=actor, reason="cancelled before start")
        add_job_event(tx, job.id, "cancelled", {"steps_run": 0})
    elif result.rowcount == 1:
        # Requeued after a lost worker: the data was opened and the lost attempt's steps are not
        # known exactly, so the whole reservation is committed, as for a crash.
        ledger.commit(tx, budget, job=job, actual_event=job.event, actor=actor, reason="cancelled after a lost attempt")
        add_job_event(tx, job.id, "cancelled", {"steps_run": job.steps_run})
    elif job.status == "running":
        job.cancel_requested = True
        add_job_event(tx, job.id, "cancel-requested", {})
    else:
        raise JobNotCancellable(job.status)
    return job
