"""A running tuning's trials, drawn when it opens, taken one by one by its slots.

The worker that opens a tuning draws K and the candidate of each trial and writes them here
(kernel/tuning/slots.py :func:`open_tuning`, with the slots); each slot then takes the earliest
pending trial, if any, and records its result: ``done`` with its released metric (and, when it
may win, its model as a private file, kernel/tuning/trial_files.py), or ``lapsed`` when the trial was
still training at the trial time limit and released nothing. The worker that closes the tuning
selects the best ``done`` trial (kernel/tuning/selection.py).

The rules, each one conditional update so that two workers never disagree:

* A trial is taken only while its job is running the attempt that enqueued it and no cancel was
  asked for.
* A trial's result is written only by the worker that holds it, while its attempt runs.
* A lost trial is never run again: a lost slot fails the whole tuning (kernel/tuning/slots.py says why).

K is secret (Papernot and Steinke's bound holds for the best trial only while K stays unknown):
these rows are the service's, never shown by any API field, event or log line, and are deleted
when the job settles (:func:`clear`), by the worker that closes it or by the reconciler.

Torch-free: the reconciler uses it in the API process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.orm import Session

from kernel.db.changed_rows import changed_rows
from kernel.db.engine import Database
from kernel.db.orm import Job, TuningTrial, utcnow
from kernel.jobs.status import JobStatus

__all__ = [
    "DONE",
    "LAPSED",
    "PENDING",
    "RUNNING",
    "FinishedTrial",
    "TakenTrial",
    "TrialCounts",
    "clear",
    "clear_abandoned",
    "counts",
    "finish",
    "finished",
    "lapse",
    "take",
]

PENDING, RUNNING, DONE, LAPSED = "pending", "running", "done", "lapsed"


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
    """The trained model's private file; None when it could not win when it finished."""
    device: str | None
    """What it trained on (the report's execution section names it for the released trial)."""


@dataclass(frozen=True)
class TrialCounts:
    pending: int
    running: int
    done: int
    lapsed: int

    @property
    def drawn(self) -> int:
        return self.pending + self.running + self.done + self.lapsed


def _job_runs(tx: Session, job_id: str, attempt: int) -> bool:
    job = tx.get(Job, job_id, populate_existing=True)
    return job is not None and job.status == JobStatus.RUNNING and job.attempt == attempt and not job.cancel_requested


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


def finish(
    db: Database,
    *,
    trial: TakenTrial,
    score: float,
    metrics: dict[str, Any],
    model_file: str | None,
    device: str,
) -> bool:
    """Record a held trial's result; False when it is no longer this worker's to record, or its
    attempt is over (its caller then discards ``model_file``)."""
    with db.write_transaction() as tx:
        return _job_runs(tx, trial.job_id, trial.attempt) and (
            changed_rows(
                tx,
                update(TuningTrial)
                .where(_held(trial))
                .values(
                    state=DONE,
                    score=score,
                    metrics=metrics,
                    model_file=model_file,
                    device=device,
                    heartbeat_at=utcnow(),
                ),
            )
            == 1
        )


def lapse(db: Database, *, trial: TakenTrial) -> bool:
    """A held trial that was still training at the trial time limit: it released nothing."""
    with db.write_transaction() as tx:
        return _job_runs(tx, trial.job_id, trial.attempt) and (
            changed_rows(tx, update(TuningTrial).where(_held(trial)).values(state=LAPSED, heartbeat_at=utcnow())) == 1
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
    return TrialCounts(
        pending=rows.get(PENDING, 0), running=rows.get(RUNNING, 0), done=rows.get(DONE, 0), lapsed=rows.get(LAPSED, 0)
    )


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
            device=row.device,
        )
        for row in rows
    ]


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
