"""Fair sharing of the workers between tenants: how queued jobs reach the broker.

Why: the broker is first in, first out. Sending every admitted job at once would put one tenant's
hundreds of queued jobs in front of another tenant's first one. Instead at most
``PRIVTRAIN_DISPATCH_PER_TENANT`` of a tenant's jobs wait in the broker at a time; the rest wait in
the database, and each time a slot frees (a job starts, or a new one is admitted) the next job is
picked round robin over tenants: the tenant with the fewest jobs waiting in the broker first, ties
to the tenant whose oldest waiting job is oldest, oldest job first within a tenant. Another
tenant's first job therefore waits behind at most ``PRIVTRAIN_DISPATCH_PER_TENANT`` jobs of each
busy tenant, whatever their backlog.

A private tuning's work reaches the broker the same way, as its public slots (kernel/tuning/slots.py):
each slot is one unit of its tenant's share, like a job, so a tenant's tunings take their turns
with every other tenant's jobs, one slot at a time, and a tuning weighs what its slots weigh (its
public maximum number of trials), never one job. At most ``PRIVTRAIN_TUNING_PARALLEL_TRIALS`` of
one tuning's slots are out (sent or running) at once.

Who calls it: the API after admitting a job, a worker after claiming one (its slot is free), and
the reconciler each round (jobs whose sending failed). A job or slot is marked sent with a
conditional update before its message goes out, so two callers never send the same one twice; a
message that is lost is re-sent by the reconciler (``PRIVTRAIN_REDISPATCH_AFTER_S``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select, update

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, utcnow
from kernel.jobs.status import JobStatus
from kernel.tuning import slots as tuning_slots

__all__ = ["Dispatcher", "WaitingJob", "dispatch_fairly", "dispatch_with_settings", "fair_order"]

SLOT_PREFIX = "slot:"
"""The ids of slots in :func:`fair_order` (jobs keep their own ids)."""

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    """What sends a job's message (kernel.services.CeleryDispatcher; a recorder in tests)."""

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None: ...

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None: ...


@dataclass(frozen=True)
class WaitingJob:
    """A job, or one slot of a tuning (``group``: the tuning's job id), waiting to be sent."""

    id: str
    tenant_id: str
    queue: str | None
    created_at_order: int  # rank by creation time (ties by id): the oldest is 0
    sent: bool  # waiting in the broker (True) or only in the database (False)
    group: str | None = None


def fair_order(
    jobs: Iterable[WaitingJob], *, per_tenant: int, per_group: int = 1, group_running: dict[str, int] | None = None
) -> list[str]:
    """The unsent jobs and slots to send now, in order: pure, so the policy is tested without a
    database. Shares are per tenant and queue: a tenant's GPU backlog never holds up its own CPU
    jobs. A group (one tuning's slots) has at most ``per_group`` out at a time, counting those
    sent and those running (``group_running``)."""
    in_broker: dict[tuple[str, str | None], int] = defaultdict(int)
    out: dict[str, int] = defaultdict(int, group_running or {})
    backlog: dict[tuple[str, str | None], list[WaitingJob]] = defaultdict(list)
    for job in jobs:
        if job.sent:
            in_broker[job.tenant_id, job.queue] += 1
            if job.group is not None:
                out[job.group] += 1
        else:
            backlog[job.tenant_id, job.queue].append(job)
    for waiting in backlog.values():
        waiting.sort(key=lambda job: job.created_at_order)

    def next_of(share: tuple[str, str | None]) -> WaitingJob | None:
        """The share's oldest job or slot whose group has room."""
        return next((job for job in backlog[share] if job.group is None or out[job.group] < per_group), None)

    picked: list[str] = []
    while True:
        ready: dict[tuple[str, str | None], WaitingJob] = {}
        for share in backlog:
            if in_broker[share] < per_tenant and (first := next_of(share)) is not None:
                ready[share] = first
        if not ready:
            return picked
        share = min(ready, key=lambda s: (in_broker[s], ready[s].created_at_order))
        job = ready[share]
        backlog[share].remove(job)
        picked.append(job.id)
        in_broker[share] += 1
        if job.group is not None:
            out[job.group] += 1


@dataclass(frozen=True)
class _Waiting:
    units: list[WaitingJob]
    slots: dict[str, tuning_slots.SlotWork]
    group_running: dict[str, int]


def _waiting(db: Database) -> _Waiting:
    with db.read_session() as session:
        jobs = session.execute(
            select(Job.id, Job.tenant_id, Job.queue, Job.created_at, Job.dispatched_at).where(
                Job.status == JobStatus.QUEUED
            )
        ).all()
        slots = tuning_slots.waiting(session)
        group_running = tuning_slots.running_per_tuning(session)
    rows: list[tuple[dt.datetime, str, int, WaitingJob]] = []  # oldest first; a tuning's slots in order
    for job_id, tenant_id, queue, created_at, dispatched_at in jobs:
        rows.append((_utc(created_at), job_id, -1, WaitingJob(job_id, tenant_id, queue, 0, dispatched_at is not None)))
    for slot in slots:
        unit = WaitingJob(f"{SLOT_PREFIX}{slot.id}", slot.tenant_id, slot.queue, 0, slot.sent, group=slot.job_id)
        rows.append((_utc(slot.created_at), slot.job_id, slot.slot, unit))
    rows.sort(key=lambda row: row[:3])
    units = [dataclasses.replace(row[3], created_at_order=rank) for rank, row in enumerate(rows)]
    return _Waiting(units, {f"{SLOT_PREFIX}{slot.id}": slot for slot in slots}, group_running)


def _utc(value: dt.datetime) -> dt.datetime:
    """SQLite gives naive datetimes (stored as UTC), PostgreSQL aware ones."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


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


def dispatch_fairly(db: Database, dispatcher: Dispatcher, *, per_tenant: int, per_tuning: int) -> list[str]:
    """Send the jobs and slots :func:`fair_order` picks; returns the ids sent (a slot as
    ``slot:<id>``). A failed send is given back (unsent) and ends the round: the broker is likely
    down, the next caller tries again."""
    sent: list[str] = []
    waiting = _waiting(db)
    queue_of = {unit.id: unit.queue for unit in waiting.units}
    for unit_id in fair_order(
        waiting.units, per_tenant=per_tenant, per_group=per_tuning, group_running=waiting.group_running
    ):
        slot = waiting.slots.get(unit_id)
        if slot is not None:
            if not tuning_slots.mark_sent(db, slot.id):
                continue
            try:
                dispatcher.dispatch_slot(slot.job_id, attempt=slot.attempt, slot=slot.slot, queue=slot.queue)
            except Exception:
                log.exception("dispatch failed; the slot waits for the next round", extra={"job_id": slot.job_id})
                tuning_slots.give_back(db, slot.id)
                break
            sent.append(unit_id)
            continue
        if not _take(db, unit_id):
            continue
        try:
            dispatcher.dispatch(unit_id, queue=queue_of[unit_id])
        except Exception:
            log.exception("dispatch failed; the job waits for the next round", extra={"job_id": unit_id})
            _give_back(db, unit_id)
            break
        sent.append(unit_id)
    return sent


def dispatch_with_settings(db: Database, dispatcher: Dispatcher, settings: Settings) -> list[str]:
    """:func:`dispatch_fairly` with the service's shares."""
    return dispatch_fairly(
        db,
        dispatcher,
        per_tenant=settings.dispatch_per_tenant,
        per_tuning=settings.tuning_parallel_trials,
    )
