"""Numbered job events: the one way a job's event is written (by kernel.jobs.lifecycle)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from kernel.db.orm import Job, JobEvent
from kernel.jobs.status import JobEventKind

__all__ = ["add_job_event"]


def add_job_event(session: Session, job_id: str, kind: JobEventKind, payload: dict[str, Any]) -> JobEvent:
    """Append a progress/lifecycle event numbered after the job's last one. Callers pass public
    values only (docs/privacy-model.md §1).

    Why an UPDATE … RETURNING on the job row: it bumps ``event_count`` and takes the row's write
    lock in one statement, so the worker and the API (cancel) can never number two events alike,
    on PostgreSQL or SQLite, and numbers are never reused.
    """
    seq = session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(event_count=Job.event_count + 1)
        .returning(Job.event_count)
        .execution_options(synchronize_session=False)
    ).scalar_one()
    event = JobEvent(job_id=job_id, seq=seq, kind=kind, payload=payload)
    session.add(event)
    return event
