"""Fair sharing of the workers between tenants: how queued jobs reach the broker.

Why: the broker is first in, first out. Sending every admitted job at once would put one tenant's
hundreds of queued jobs in front of another tenant's first one. Instead at most
``PRIVTRAIN_DISPATCH_PER_TENANT`` of a tenant's jobs wait in the broker at a time; the rest wait in
the database, and each time a slot frees (a job starts, or a new one is admitted) the next job is
picked round robin over tenants: the tenant with the fewest jobs waiting in the broker first, ties
to the tenant whose oldest waiting job is oldest, oldest job first within a tenant. Another
tenant's first job therefore waits behind at most ``PRIVTRAIN_DISPATCH_PER_TENANT`` jobs of each
busy tenant, whatever their backlog.

Who calls it: the API after admitting a job, a worker after claiming one (its slot is free), and
the reconciler each round (jobs whose sending failed). A job is marked sent with a conditional
update before its message goes out, so two callers never send the same job twice; a message that
is lost is re-sent by the reconciler (``PRIVTRAIN_REDISPATCH_AFTER_S``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select, update

from app.db import Database
from app.jobs.status import JobStatus
from app.models import Job, utcnow

__all__ = ["Dispatcher", "WaitingJob", "dispatch_fairly", "fair_order"]

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    """What sends a job's message (app.services.CeleryDispatcher; a recorder in tests)."""

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None: ...


@dataclass(frozen=True)
class WaitingJob:
    id: str
    tenant_id: str
    queue: str | None
    created_at_order: int  # rank by creation time (ties by id): the oldest is 0
    sent: bool  # waiting in the broker (True) or only in the database (False)


def fair_order(jobs: Iterable[WaitingJob], *, per_tenant: int) -> list[str]:
    """The unsent jobs to send now, in order: pure, so the policy is tested without a database.
    Shares are per tenant and queue: a tenant's GPU backlog never holds up its own CPU jobs."""
    in_broker: dict[tuple[str, str | None], int] = defaultdict(int)
    backlog: dict[tuple[str, str | None], list[WaitingJob]] = defaultdict(list)
    for job in jobs:
        if job.sent:
            in_broker[job.tenant_id, job.queue] += 1
        else:
            backlog[job.tenant_id, job.queue].append(job)
    for waiting in backlog.values():
        waiting.sort(key=lambda job: job.created_at_order)
    picked: list[str] = []
    while True:
        ready = [share for share, waiting in backlog.items() if waiting and in_broker[share] < per_tenant]
        if not ready:
            return picked
        share = min(ready, key=lambda s: (in_broker[s], backlog[s][0].created_at_order))
        picked.append(backlog[share].pop(0).id)
        in_broker[share] += 1


def _waiting(db: Database) -> list[WaitingJob]:
    with db.read_session() as session:
        rows = session.execute(
            select(Job.id, Job.tenant_id, Job.queue, Job.dispatched_at)
            .where(Job.status == JobStatus.QUEUED)
            .order_by(Job.created_at, Job.id)
        ).all()
    return [
        WaitingJob(id=job_id, tenant_id=tenant_id, queue=queue, created_at_order=rank, sent=dispatched_at is not None)
        for rank, (job_id, tenant_id, queue, dispatched_at) in enumerate(rows)
    ]


def _take(db: Database, job_id: str) -> bool:
    """Mark the job sent unless another caller did first (or it is no longer queued)."""
    with db.write_transaction() as tx:
        result = tx.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.dispatched_at.is_(None))
            .values(dispatched_at=utcnow())
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]  # CursorResult of an UPDATE


def _give_back(db: Database, job_id: str) -> None:
    with db.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED).values(dispatched_at=None))


def dispatch_fairly(db: Database, dispatcher: Dispatcher, *, per_tenant: int) -> list[str]:
    """Send the jobs :func:`fair_order` picks; returns the ids sent. A failed send is given back
    (unsent) and ends the round: the broker is likely down, the next caller tries again."""
    sent: list[str] = []
    waiting = _waiting(db)
    queue_of = {job.id: job.queue for job in waiting}
    for job_id in fair_order(waiting, per_tenant=per_tenant):
        if not _take(db, job_id):
            continue
        try:
            dispatcher.dispatch(job_id, queue=queue_of[job_id])
        except Exception:
            log.exception("dispatch failed; the job waits for the next round", extra={"job_id": job_id})
            _give_back(db, job_id)
            break
        sent.append(job_id)
    return sent
