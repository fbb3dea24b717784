"""Rendering of jobs and their events for the API (public values only)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.models import Job, JobEvent
from app.schemas.jobs import JobEventOut, JobOut


def job_out(job: Job) -> JobOut:
    links = {"self": f"/v1/jobs/{job.id}", "events": f"/v1/jobs/{job.id}/events"}
    if job.status == "succeeded":
        links["model"] = f"/v1/jobs/{job.id}/model"
        links["report"] = f"/v1/jobs/{job.id}/report"
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
        epsilon_ledger=job.epsilon_ledger,
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
