"""Settles jobs whose worker vanished and re-sends queued jobs whose message was lost.

Torch-free, so it can run in the API process (embedded mode), as ``privtrain-admin reconcile``
or as its own service. Rules (privacy.md §4): a running job without a heartbeat for
``stale_after_s`` goes back to the queue inside its reservation while attempts remain (it keeps
its TOUCH and resumes from its checkpoint); after the last attempt it fails and its full
reservation is committed. Queued jobs older than ``redispatch_after_s`` are sent again; a
duplicate message is a no-op because claiming is a conditional UPDATE.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass

from sqlalchemy import or_, select

from app import ledger
from app.config import Settings
from app.db import Database
from app.job_settlement import mark_dispatched, settle_failed_job
from app.job_views import add_job_event
from app.models import Job, utcnow
from app.services import JobDispatcher

log = logging.getLogger("privtrain.reconciler")
ACTOR = "reconciler"


@dataclass(frozen=True)
class ReconcileResult:
    requeued: tuple[str, ...]
    failed: tuple[str, ...]
    redispatched: tuple[str, ...]


def _now() -> dt.datetime:
    return utcnow()


def _stale_running(db: Database, cutoff: dt.datetime) -> list[tuple[str, str, int]]:
    with db.read_session() as session:
        rows = session.execute(
            select(Job.id, Job.dataset_id, Job.attempt).where(
                Job.status == "running", or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < cutoff)
            )
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def _settle_stale(db: Database, settings: Settings, job_id: str, dataset_id: str, attempt: int, cutoff: dt.datetime) -> str | None:
    """Requeue or fail one stale job; re-checks staleness under the lock (the worker may be back)."""
    with db.write_transaction() as tx:
        budget = ledger.lock_budget(tx, dataset_id)
        job = tx.get(Job, job_id, populate_existing=True)
        if job is None or job.status != "running" or job.attempt != attempt:
            return None
        heartbeat = job.heartbeat_at
        if heartbeat is not None and heartbeat.replace(tzinfo=dt.UTC) >= cutoff.replace(tzinfo=dt.UTC):
            return None
        if job.attempt < settings.max_attempts and not job.cancel_requested:
            job.status = "queued"
            job.dispatched_at = None
            add_job_event(tx, job.id, "requeued", {"attempt": job.attempt, "reason": "worker-lost"})
            return "requeued"
        settle_failed_job(tx, budget, job, error_code="worker-lost", actor=ACTOR)
        return "failed"


def _due_for_dispatch(db: Database, cutoff: dt.datetime) -> list[str]:
    with db.read_session() as session:
        return list(
            session.scalars(
                select(Job.id).where(
                    Job.status == "queued",
                    or_(Job.dispatched_at.is_(None), Job.dispatched_at < cutoff),
                    Job.created_at < cutoff,
                )
            )
        )


def reconcile_once(db: Database, settings: Settings, dispatcher: JobDispatcher) -> ReconcileResult:
    now = _now()
    stale_cutoff = now - dt.timedelta(seconds=settings.stale_after_s)
    requeued: list[str] = []
    failed: list[str] = []
    for job_id, dataset_id, attempt in _stale_running(db, stale_cutoff):
        outcome = _settle_stale(db, settings, job_id, dataset_id, attempt, stale_cutoff)
        if outcome == "requeued":
            requeued.append(job_id)
        elif outcome == "failed":
            failed.append(job_id)
    redispatched: list[str] = []
    due = set(_due_for_dispatch(db, now - dt.timedelta(seconds=settings.redispatch_after_s)))
    for job_id in [*requeued, *sorted(due - set(requeued))]:
        try:
            dispatcher.dispatch(job_id)
        except Exception:  # the broker may be down; the next round tries again
            log.exception("re-dispatch failed", extra={"job_id": job_id})
            continue
        mark_dispatched(db, job_id)
        redispatched.append(job_id)
    if requeued or failed or redispatched:
        log.info(
            "reconciled",
            extra={"requeued": len(requeued), "failed": len(failed), "redispatched": len(redispatched)},
        )
    return ReconcileResult(tuple(requeued), tuple(failed), tuple(redispatched))


def run_periodically(
    db: Database, settings: Settings, dispatcher: JobDispatcher, stop: threading.Event
) -> None:
    """Loop until ``stop`` is set; errors are logged and retried next round, never fatal."""
    while not stop.wait(settings.reconcile_interval_s):
        try:
            reconcile_once(db, settings, dispatcher)
        except Exception:
            log.exception("reconcile round failed")
