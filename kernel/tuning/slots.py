"""A running tuning's public slots: the schedule that keeps its number of trials K secret.

Papernot and Steinke's bound holds for the released trial only while K stays unknown, and
everything an analyst can observe must therefore be independent of K: the tuning's own status and
its times, and also the start times of anyone's other jobs, which tell when workers were busy.
So a tuning never runs "its trials": when its job is opened (:func:`open_tuning`) it draws K,
puts the K trials in its trial queue (kernel/tuning/trial_queue.py, secret) and creates exactly
``maximum`` slots, the public maximum of K. Each slot is one task that fair dispatch sends like a
job (kernel/jobs/dispatch.py), so other tenants' jobs take their turns between them. A worker that
claims a slot runs the next pending trial if there is one (stopped, releasing nothing, at the
trial time limit), then waits until the slot's fixed length has passed; a slot without a trial
only waits. How many slots exist, when each starts and how long each takes are all independent
of K. The last slot to finish closes the tuning (kernel/tuning/closing.py): the best trial is
released, or the tuning fails.

A slot that cannot keep its length (a lost worker, a trial that overran the margin, a training
error) fails the whole tuning, releasing nothing: a retry would make the tuning's timing depend on
which slots held trials. Success is then conditioned on no such fault, which the privacy model
accounts for (docs/privacy-model.md#tuning).

Torch-free: the API reads slot counts, fair dispatch sends slots and the reconciler settles lost ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from kernel.db.changed_rows import changed_rows
from kernel.db.engine import Database
from kernel.db.orm import Job, TuningSlot, TuningTrial, utcnow
from kernel.jobs.status import JobStatus

__all__ = [
    "DONE",
    "DROPPED",
    "OK",
    "QUEUED",
    "RUNNING",
    "ClaimedSlot",
    "SlotWork",
    "claim",
    "done_count",
    "drop_abandoned",
    "finish",
    "finished_unclosed",
    "give_back",
    "heartbeat",
    "mark_resent",
    "mark_sent",
    "open_tuning",
    "outcomes",
    "running_per_tuning",
    "sent_long_ago",
    "stale_running",
    "waiting",
]

QUEUED, RUNNING, DONE, DROPPED = "queued", "running", "done", "dropped"
OK = "ok"
"""A slot's outcome when it kept its length (with or without a trial)."""


@dataclass(frozen=True)
class ClaimedSlot:
    """One worker's hold on one slot."""

    id: int
    job_id: str
    attempt: int
    slot: int
    worker: str


@dataclass(frozen=True)
class SlotWork:
    """A queued slot as fair dispatch sees it."""

    id: int
    job_id: str
    attempt: int
    slot: int
    tenant_id: str
    queue: str | None
    created_at: dt.datetime
    dispatched_at: dt.datetime | None

    @property
    def sent(self) -> bool:
        """Waiting in the broker (True) or only in the database (False)."""
        return self.dispatched_at is not None


def _carrier_runs(tx: Session, job_id: str, attempt: int) -> bool:
    job = tx.get(Job, job_id, populate_existing=True)
    return job is not None and job.status == JobStatus.RUNNING and job.attempt == attempt and not job.cancel_requested


def open_tuning(db: Database, *, job_id: str, attempt: int, candidates: Sequence[int], slots: int) -> bool:
    """The attempt's K trials (their candidates in the order drawn) and its ``slots`` slots, in one
    transaction; False (nothing written) when the attempt no longer runs or was already opened."""
    if len(candidates) > slots:
        raise ValueError("a tuning cannot draw more trials than it has slots")
    with db.write_transaction() as tx:
        if not _carrier_runs(tx, job_id, attempt):
            return False
        opened = tx.scalar(select(TuningSlot.id).where(TuningSlot.job_id == job_id, TuningSlot.attempt == attempt))
        if opened is not None:
            return False
        now = utcnow()
        tx.add_all(
            TuningTrial(job_id=job_id, attempt=attempt, seq=seq, candidate=candidate, state="pending", claims=0)
            for seq, candidate in enumerate(candidates)
        )
        tx.add_all(
            TuningSlot(job_id=job_id, attempt=attempt, slot=index, state=QUEUED, created_at=now)
            for index in range(slots)
        )
    return True


def claim(db: Database, *, job_id: str, attempt: int, slot: int, worker: str) -> ClaimedSlot | None:
    """queued → running for this worker; None when the slot is not claimable (a duplicate message,
    or its tuning ended)."""
    with db.write_transaction() as tx:
        if not _carrier_runs(tx, job_id, attempt):
            return None
        row = tx.scalar(
            select(TuningSlot).where(
                TuningSlot.job_id == job_id, TuningSlot.attempt == attempt, TuningSlot.slot == slot
            )
        )
        if row is None:
            return None
        now = utcnow()
        taken = changed_rows(
            tx,
            update(TuningSlot)
            .where(TuningSlot.id == row.id, TuningSlot.state == QUEUED)
            .values(state=RUNNING, worker=worker, started_at=now, heartbeat_at=now),
        )
        if taken != 1:
            return None
        return ClaimedSlot(id=row.id, job_id=job_id, attempt=attempt, slot=slot, worker=worker)


def _held(slot: ClaimedSlot) -> Any:
    return (TuningSlot.id == slot.id) & (TuningSlot.state == RUNNING) & (TuningSlot.worker == slot.worker)


def heartbeat(db: Database, *, slot: ClaimedSlot) -> bool:
    """Beat for a held slot; True when its worker should stop (the tuning ended or was cancelled)."""
    with db.write_transaction() as tx:
        mine = changed_rows(tx, update(TuningSlot).where(_held(slot)).values(heartbeat_at=utcnow()))
        return mine != 1 or not _carrier_runs(tx, slot.job_id, slot.attempt)


def finish(db: Database, *, slot: ClaimedSlot, outcome: str) -> bool:
    """Record the held slot as done with ``outcome``; True when every slot of its attempt is now
    done (this worker then closes the tuning)."""
    with db.write_transaction() as tx:
        mine = changed_rows(
            tx,
            update(TuningSlot).where(_held(slot)).values(state=DONE, outcome=outcome, finished_at=utcnow()),
        )
        if mine != 1:
            return False
        return _all_done(tx, slot.job_id, slot.attempt)


def _all_done(tx: Session, job_id: str, attempt: int) -> bool:
    left = tx.scalar(
        select(func.count())
        .select_from(TuningSlot)
        .where(TuningSlot.job_id == job_id, TuningSlot.attempt == attempt, TuningSlot.state != DONE)
    )
    return left == 0


def outcomes(session: Session, *, job_id: str, attempt: int) -> list[str | None]:
    """Every slot's outcome, in slot order (None: not done)."""
    return list(
        session.scalars(
            select(TuningSlot.outcome)
            .where(TuningSlot.job_id == job_id, TuningSlot.attempt == attempt)
            .order_by(TuningSlot.slot)
        )
    )


def done_count(session: Session, job: Job) -> int:
    """How many of the job's current attempt's slots are done (public: every slot lasts the same)."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(TuningSlot)
            .where(TuningSlot.job_id == job.id, TuningSlot.attempt == job.attempt, TuningSlot.state == DONE)
        )
        or 0
    )


def waiting(session: Session) -> list[SlotWork]:
    """Queued slots of running tunings, oldest first, for fair dispatch."""
    rows = session.execute(
        select(
            TuningSlot.id,
            TuningSlot.job_id,
            TuningSlot.attempt,
            TuningSlot.slot,
            Job.tenant_id,
            Job.queue,
            TuningSlot.created_at,
            TuningSlot.dispatched_at,
        )
        .join(Job, Job.id == TuningSlot.job_id)
        .where(
            TuningSlot.state == QUEUED,
            Job.status == JobStatus.RUNNING,
            Job.attempt == TuningSlot.attempt,
            Job.cancel_requested.is_(False),
        )
        .order_by(TuningSlot.created_at, TuningSlot.job_id, TuningSlot.slot)
    ).all()
    return [
        SlotWork(
            id=row[0],
            job_id=row[1],
            attempt=row[2],
            slot=row[3],
            tenant_id=row[4],
            queue=row[5],
            created_at=row[6],
            dispatched_at=row[7],
        )
        for row in rows
    ]


def running_per_tuning(session: Session) -> dict[str, int]:
    """How many slots of each tuning are running now (they count against its parallel cap)."""
    return {
        job_id: int(n)
        for job_id, n in session.execute(
            select(TuningSlot.job_id, func.count()).where(TuningSlot.state == RUNNING).group_by(TuningSlot.job_id)
        )
    }


def mark_sent(db: Database, slot_id: int) -> bool:
    """Mark a queued slot sent unless another caller did first."""
    with db.write_transaction() as tx:
        return (
            changed_rows(
                tx,
                update(TuningSlot)
                .where(TuningSlot.id == slot_id, TuningSlot.state == QUEUED, TuningSlot.dispatched_at.is_(None))
                .values(dispatched_at=utcnow()),
            )
            == 1
        )


def mark_resent(db: Database, slot_id: int) -> None:
    """A lost message was sent again: its clock for the next re-send starts now."""
    with db.write_transaction() as tx:
        tx.execute(
            update(TuningSlot)
            .where(TuningSlot.id == slot_id, TuningSlot.state == QUEUED)
            .values(dispatched_at=utcnow())
        )


def give_back(db: Database, slot_id: int) -> None:
    with db.write_transaction() as tx:
        tx.execute(
            update(TuningSlot).where(TuningSlot.id == slot_id, TuningSlot.state == QUEUED).values(dispatched_at=None)
        )


def sent_long_ago(session: Session, cutoff: dt.datetime) -> list[SlotWork]:
    """Slots sent before ``cutoff`` that no worker claimed: their message was lost."""
    limit = cutoff.replace(tzinfo=dt.UTC)
    return [
        slot
        for slot in waiting(session)
        if slot.dispatched_at is not None and slot.dispatched_at.replace(tzinfo=dt.UTC) < limit
    ]


def stale_running(session: Session, cutoff: dt.datetime) -> list[tuple[str, str, int]]:
    """(job id, dataset id, attempt) of running tunings with a running slot that stopped beating."""
    rows = session.execute(
        select(Job.id, Job.dataset_id, Job.attempt)
        .join(TuningSlot, TuningSlot.job_id == Job.id)
        .where(
            Job.status == JobStatus.RUNNING,
            TuningSlot.attempt == Job.attempt,
            TuningSlot.state == RUNNING,
            TuningSlot.heartbeat_at < cutoff,
        )
        .distinct()
    ).all()
    return [(row[0], row[1], row[2]) for row in rows]


def finished_unclosed(session: Session, cutoff: dt.datetime) -> list[tuple[str, int]]:
    """(job id, attempt) of running tunings whose slots are all done, the last before ``cutoff``:
    the worker that finished it did not close the tuning (it was lost)."""
    last_finish = (
        select(TuningSlot.job_id, TuningSlot.attempt, func.max(TuningSlot.finished_at).label("last"))
        .group_by(TuningSlot.job_id, TuningSlot.attempt)
        .having(func.count() == func.count(TuningSlot.finished_at))
        .subquery()
    )
    rows = session.execute(
        select(Job.id, Job.attempt)
        .join(last_finish, (last_finish.c.job_id == Job.id) & (last_finish.c.attempt == Job.attempt))
        .where(Job.status == JobStatus.RUNNING, last_finish.c.last < cutoff)
    ).all()
    return [(row[0], row[1]) for row in rows]


def drop_abandoned(db: Database) -> int:
    """Queued or running slots of tunings that no longer run that attempt become ``dropped`` (they
    will never run; fair dispatch skips them anyway); returns how many."""
    with db.write_transaction() as tx:
        live = (
            select(Job.id)
            .where(Job.id == TuningSlot.job_id, Job.status == JobStatus.RUNNING, Job.attempt == TuningSlot.attempt)
            .exists()
        )
        return changed_rows(
            tx,
            update(TuningSlot)
            .where(TuningSlot.state.in_((QUEUED, RUNNING)), ~live)
            .values(state=DROPPED)
            .execution_options(synchronize_session=False),
        )
