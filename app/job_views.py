"""Rendering of jobs and their events for the API (public values only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.models import TERMINAL_STATUSES, Job, JobEvent
from app.schemas.jobs import JobEventOut, JobOut

EpsilonBasis = Literal["reserved", "committed"]


@dataclass(frozen=True)
class JobEpsilon:
    """The one ε to show for a job, and what it is: a reservation (still running) or a spend."""

    value: float
    basis: EpsilonBasis


def job_epsilon(job: Job) -> JobEpsilon:
    """Committed ε once the job has ended, reserved ε while it is queued or running.

    Why: a job that stopped early or was cancelled spends less than it reserved, and the rest goes
    back to the budget; showing the reservation after the end would overstate what it cost. A
    finished job with no recorded commitment (a row older than the column, never backfilled) keeps
    the reserved basis rather than pretending to know its spend.
    """
    if job.status in TERMINAL_STATUSES and job.epsilon_committed is not None:
        return JobEpsilon(value=job.epsilon_committed, basis="committed")
    return JobEpsilon(value=job.epsilon_ledger, basis="reserved")


def job_out(job: Job) -> JobOut:
    links = {"self": f"/v1/jobs/{job.id}", "events": f"/v1/jobs/{job.id}/events"}
    if job.status == "succeeded":
        links["model"] = f"/v1/jobs/{job.id}/model"
        links["report"] = f"/v1/jobs/{job.id}/report"
    shown = job_epsilon(job)
    return JobOut(
        id=job.id,
        dataset_id=job.dataset_id,
        status=job.status,
        algorithm=job.algorithm,
        model=job.model_name,
        spec=job.spec,
        noise_multiplier=job.noise_multiplier,
        steps_planned=job.steps_planned,
        steps_run=job.steps_run,
        delta=job.delta,
        epsilon=shown.value,
        epsilon_basis=shown.basis,
        epsilon_ledger=job.epsilon_ledger,
        epsilon_committed=job.epsilon_committed,
        epsilon_prv=job.epsilon_prv,
        attempt=job.attempt,
        cancel_requested=job.cancel_requested,
        error_code=job.error_code,
        metrics=job.metrics,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        links=links,
    )


def add_job_event(session: Session, job_id: str, kind: str, payload: dict[str, Any]) -> JobEvent:
    """Append a progress/lifecycle event numbered after the job's last one. Callers pass public
    values only (docs/privacy-model.md §1).

    Why an UPDATE … RETURNING on the job row: it bumps ``event_count`` and takes the row's write
    lock in one statement, so the worker and the API (cancel) can never number two events alike,
    on PostgreSQL or SQLite, and numbers are never reused.
    """
    seq = session.execute(
        update(Job).where(Job.id == job_id).values(event_count=Job.event_count + 1)
        .returning(Job.event_count).execution_options(synchronize_session=False)
    ).scalar_one()
    event = JobEvent(job_id=job_id, seq=seq, kind=kind, payload=payload)
    session.add(event)
    return event


def event_out(event: JobEvent) -> JobEventOut:
    """An event as clients see it: ``seq`` is its number within the job."""
    return JobEventOut(seq=event.seq, kind=event.kind, payload=event.payload, created_at=event.created_at)
