"""A running tuning's trials as a queue that several workers share (docs/tuning.md#parallel-trials).

Why a queue: a tuning's K trials are independent, so they can run at the same time on free
workers. The tuning's own worker (the one that claimed its job) draws K and the candidate of each
trial, enqueues them here and asks up to ``PRIVTRAIN_TUNING_PARALLEL_TRIALS − 1`` other workers to
help; every worker then takes pending trials one at a time until none is left, and the job's worker
waits for the others, selects the best and settles the job. With one worker (embedded mode) it
simply runs them all.

The rules, each one conditional update so that two workers never disagree:

* A trial is taken only while its job is running the attempt that enqueued it and no cancel was
  asked for; a helper's heartbeat stops it as soon as that is no longer so.
* A trial whose worker stopped beating for ``stale_after_s`` goes back to pending, to be run again
  from scratch (nothing of it was released, as for a job's retry); after ``max_attempts`` takes
  the tuning fails (:class:`TrialsLost`), committing its whole reservation like a job whose
  worker was lost on every attempt.
* A finished trial is written only by the worker that holds it.

K is secret (Papernot and Steinke's bound holds for the best trial only while K stays unknown):
these rows are the service's, never shown by any API field, event or log line, and are deleted
when the job settles (:func:`clear`), by its worker or by the reconciler.

Torch-free: the reconciler uses it in the API process.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.orm import Session

from app.changed_rows import changed_rows
from app.db import Database
from app.jobs.status import JobStatus
from app.models import Job, TuningTrial, utcnow

__all__ = [
    "DONE",
    "PENDING",
    "RUNNING",
    "FinishedTrial",
    "TakenTrial",
    "TrialCounts",
    "TrialsLost",
    "clear",
    "clear_abandoned",
    "counts",
    "enqueue",
    "finish",
    "finished",
    "heartbeat",
    "requeue_stale",
    "take",
]

PENDING, RUNNING, DONE = "pending", "running", "done"


class TrialsLost(Exception):
    """A trial's worker vanished on every one of its takes: the tuning fails (``worker-lost``)."""


@dataclass(frozen=True)
class TakenTrial:
    """One worker's hold on one trial: only it may beat for it or finish it."""

    id: int
    job_id: str
    attempt: int
    seq: int
    candidate: int
    worker: str
    claims: int


@dataclass(frozen=True)
class FinishedTrial:
    seq: int
    candidate: int
    score: float
    metrics: dict[str, Any]
    model_file: str | None
    """A helper's model (a private file), None when the job's own worker kept it."""


@dataclass(frozen=True)
class TrialCounts:
    pending: int
    running: int
    done: int


def _job_runs(tx: Session, job_id: str, attempt: int) -> bool:
    job = tx.get(Job, job_id, populate_existing=True)
    return job is not None and job.status == JobStatus.RUNNING and job.attempt == attempt and not job.cancel_requested


def enqueue(db: Database, *, job_id: str, attempt: int, candidates: Sequence[int]) -> None:
    """The attempt's trials, in the order they were drawn (``seq``), all pending."""
    with db.write_transaction() as tx:
        tx.add_all(
            TuningTrial(job_id=job_id, attempt=attempt, seq=seq, candidate=candidate, state=PENDING, claims=0)
            for seq, candidate in enumerate(candidates)
        )


def take(db: Database, *, job_id: str, attempt: int, worker: str) -> TakenTrial | None:
    """The earliest pending trial, now held by ``worker``; None when none is pending or the
    attempt no longer runs."""
    while True:
        with db.write_transaction() as tx:
            if not _job_runs(tx, job_id, attempt):
                return None
            row = tx.execute(
                select(TuningTrial.id, TuningTrial.seq, TuningTrial.candidate, TuningTrial.claims)
                .where(TuningTrial.job_id == job_id, TuningTrial.attempt == attempt, TuningTrial.state == PENDING)
                .order_by(TuningTrial.seq)
                .limit(1)
            ).first()
            if row is None:
                return None
            taken = changed_rows(
                tx,
                update(TuningTrial)
                .where(TuningTrial.id == row.id, TuningTrial.state == PENDING)
                .values(state=RUNNING, worker=worker, claims=row.claims + 1, heartbeat_at=utcnow()),
            )
            if taken == 1:
                return TakenTrial(
                    id=row.id,
                    job_id=job_id,
                    attempt=attempt,
                    seq=row.seq,
                    candidate=row.candidate,
                    worker=worker,
                    claims=row.claims + 1,
                )
        # another worker took it between the read and the update (PostgreSQL): try the next one


def _held(trial: TakenTrial) -> Any:
    return (
        (TuningTrial.id == trial.id)
        & (TuningTrial.state == RUNNING)
        & (TuningTrial.worker == trial.worker)
        & (TuningTrial.claims == trial.claims)
    )


def heartbeat(db: Database, *, trial: TakenTrial) -> bool:
    """Beat for a held trial; True when its worker should stop (the trial was given to another
    worker, the attempt ended, or a cancel was asked for)."""
    with db.write_transaction() as tx:
        mine = changed_rows(tx, update(TuningTrial).where(_held(trial)).values(heartbeat_at=utcnow()))
        return mine != 1 or not _job_runs(tx, trial.job_id, trial.attempt)


def finish(db: Database, *, trial: TakenTrial, score: float, metrics: dict[str, Any], model_file: str | None) -> bool:
    """Record a held trial's result; False when it is no longer this worker's to record, or its
    attempt is over (its caller then discards ``model_file``)."""
    with db.write_transaction() as tx:
        return _job_runs(tx, trial.job_id, trial.attempt) and (
            changed_rows(
                tx,
                update(TuningTrial)
                .where(_held(trial))
                .values(state=DONE, score=score, metrics=metrics, model_file=model_file, heartbeat_at=utcnow()),
            )
            == 1
        )


def counts(db: Database, *, job_id: str, attempt: int) -> TrialCounts:
    with db.read_session() as session:
        rows: dict[str, int] = {
            state: n
            for state, n in session.execute(
                select(TuningTrial.state, func.count())
                .where(TuningTrial.job_id == job_id, TuningTrial.attempt == attempt)
                .group_by(TuningTrial.state)
            )
        }
    return TrialCounts(pending=rows.get(PENDING, 0), running=rows.get(RUNNING, 0), done=rows.get(DONE, 0))


def finished(db: Database, *, job_id: str, attempt: int) -> list[FinishedTrial]:
    """The attempt's finished trials in the order they were drawn."""
    with db.read_session() as session:
        rows = session.scalars(
            select(TuningTrial)
            .where(TuningTrial.job_id == job_id, TuningTrial.attempt == attempt, TuningTrial.state == DONE)
            .order_by(TuningTrial.seq)
        ).all()
    return [
        FinishedTrial(
            seq=row.seq,
            candidate=row.candidate,
            score=float(row.score if row.score is not None else "nan"),
            metrics=dict(row.metrics or {}),
            model_file=row.model_file,
        )
        for row in rows
    ]


def requeue_stale(db: Database, *, job_id: str, attempt: int, stale_before: dt.datetime, max_takes: int) -> int:
    """Running trials whose worker stopped beating go back to pending (run again from scratch);
    returns how many. Raises :class:`TrialsLost` when one was already taken ``max_takes`` times."""
    with db.write_transaction() as tx:
        stale = tx.scalars(
            select(TuningTrial).where(
                TuningTrial.job_id == job_id,
                TuningTrial.attempt == attempt,
                TuningTrial.state == RUNNING,
                TuningTrial.heartbeat_at < stale_before,
            )
        ).all()
        for row in stale:
            if row.claims >= max_takes:
                raise TrialsLost(job_id)
            row.state, row.worker, row.heartbeat_at = PENDING, None, None
        return len(stale)


def _delete(tx: Session, condition: Any) -> list[str]:
    """Delete the trials matching ``condition``, returning their private model files (one
    statement: a row that matches is deleted with its file named, never one without the other)."""
    deleted = tx.scalars(delete(TuningTrial).where(condition).returning(TuningTrial.model_file))
    return [name for name in deleted if name is not None]


def clear(db: Database, *, job_id: str, keep_attempt: int | None = None) -> list[str]:
    """Delete the job's trials (all attempts but ``keep_attempt``); returns their private model
    files, for the caller to discard once the rows are gone."""
    condition = TuningTrial.job_id == job_id
    if keep_attempt is not None:
        condition = condition & (TuningTrial.attempt != keep_attempt)
    with db.write_transaction() as tx:
        return _delete(tx, condition)


def clear_abandoned(db: Database) -> list[str]:
    """Delete the trials no worker will settle (their job no longer runs the attempt that
    enqueued them: it ended, or its worker was lost); returns their private model files. The
    reconciler's round: a job's own worker clears its trials itself when it settles."""
    running_attempt = exists().where(
        Job.id == TuningTrial.job_id, Job.status == JobStatus.RUNNING, Job.attempt == TuningTrial.attempt
    )
    with db.read_session() as session:  # the usual round finds none: no write lock for nothing
        if session.scalar(select(TuningTrial.id).where(~running_attempt).limit(1)) is None:
            return []
    with db.write_transaction() as tx:
        return _delete(tx, ~running_attempt)
