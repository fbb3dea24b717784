"""Settles jobs whose worker vanished and re-sends queued jobs whose message was lost.

Torch-free, so it runs in the API process (embedded mode), as ``privtrain-admin reconcile`` or as
its own service. What it does to a stale job is a lifecycle transition
(:func:`app.jobs.lifecycle.requeue_or_fail`, whose module states the rules); here are only the
rounds: find running jobs without a heartbeat for ``stale_after_s`` (the report of one that fails
is prepared before its transaction, app.reporting.ended_report), queued jobs older than
``redispatch_after_s`` to send again, and trial queues of tunings no worker will settle. A
duplicate message is a no-op because claiming is a conditional UPDATE.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass

from sqlalchemy import or_, select

from app.config import Settings
from app.db import Database
from app.fair_dispatch import dispatch_fairly
from app.job_private_files import JobPrivateFiles
from app.jobs import lifecycle
from app.jobs.status import JobStatus
from app.models import Dataset, Job, utcnow
from app.reporting.ended_report import EndedReportWriter, ended_report_inputs
from app.services import JobDispatcher
from app.storage import BlobStore, blob_store_from_settings
from app.tuning import trial_queue
from app.tuning.trial_files import TrialFiles

log = logging.getLogger("privtrain.reconciler")


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
                Job.status == JobStatus.RUNNING, or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < cutoff)
            )
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def _report_writer(db: Database, blobs: BlobStore, job_id: str, *, max_attempts: int) -> EndedReportWriter | None:
    """The report of a stale job that will fail here (its last attempt, or a cancel asked for): its
    inputs for the whole reservation it then commits, computed before the settling transaction.
    Jobs that will be requeued get a writer without inputs (used only if they fail after all)."""
    with db.read_session() as session:
        job = session.get(Job, job_id)
        dataset = session.get(Dataset, job.dataset_id) if job is not None else None
    if job is None or dataset is None or dataset.public:
        return None
    if job.touched_at is None or (job.attempt < max_attempts and not job.cancel_requested):
        return EndedReportWriter(blobs)
    try:
        return EndedReportWriter(blobs, ended_report_inputs(job, dataset))
    except Exception:
        log.exception("could not prepare a lost job's report", extra={"job_id": job_id})
        return EndedReportWriter(blobs)


def _due_for_dispatch(db: Database, cutoff: dt.datetime) -> list[tuple[str, str | None]]:
    """(job id, queue) of jobs sent long ago that no worker started: their message was lost."""
    with db.read_session() as session:
        return list(
            session.execute(
                select(Job.id, Job.queue).where(
                    Job.status == JobStatus.QUEUED,
                    Job.dispatched_at.is_not(None),  # never sent: app/fair_dispatch.py sends those
                    Job.dispatched_at < cutoff,
                )
            )
        )


def _clear_abandoned_trials(db: Database, settings: Settings) -> None:
    """The trial queues of tunings that ended, or whose worker was lost, with their models'
    private files (app/tuning/trial_queue.py): a tuning's own worker clears them when it settles."""
    try:
        files = trial_queue.clear_abandoned(db)
        if files:
            TrialFiles(settings.checkpoint_dir, blob_store_from_settings(settings)).discard(files)
    except Exception:
        log.exception("clearing abandoned tuning trials failed; the next round tries again")


def _discard_private_files(settings: Settings, job_ids: list[str]) -> None:
    """The checkpoints and hold-out splits of jobs failed here: their worker is gone and will not
    delete them (a lost worker's own host deletes its copies when a worker starts there again)."""
    try:
        files = JobPrivateFiles(settings.checkpoint_dir, blob_store_from_settings(settings))
        for job_id in job_ids:
            files.discard(job_id)
    except Exception:
        log.exception("deleting the private files of failed jobs failed")


def reconcile_once(db: Database, settings: Settings, dispatcher: JobDispatcher) -> ReconcileResult:
    now = _now()
    stale_cutoff = now - dt.timedelta(seconds=settings.stale_after_s)
    requeued: list[str] = []
    failed: list[str] = []
    stale = _stale_running(db, stale_cutoff)
    blobs = blob_store_from_settings(settings) if stale else None
    for job_id, dataset_id, attempt in stale:
        assert blobs is not None
        outcome = lifecycle.requeue_or_fail(
            db,
            job_id=job_id,
            dataset_id=dataset_id,
            attempt=attempt,
            stale_before=stale_cutoff,
            max_attempts=settings.max_attempts,
            write_report=_report_writer(db, blobs, job_id, max_attempts=settings.max_attempts),
        )
        if outcome == JobStatus.QUEUED:
            requeued.append(job_id)
        elif outcome == JobStatus.FAILED:
            failed.append(job_id)
    if failed:
        _discard_private_files(settings, failed)
    _clear_abandoned_trials(db, settings)
    redispatched: list[str] = []
    # Lost messages (sent long ago, never started) are sent again as they were; requeued and
    # never-sent jobs take their turn through fair dispatch.
    for job_id, queue in sorted(_due_for_dispatch(db, now - dt.timedelta(seconds=settings.redispatch_after_s))):
        try:
            dispatcher.dispatch(job_id, queue=queue)
        except Exception:  # the broker may be down; the next round tries again
            log.exception("re-dispatch failed", extra={"job_id": job_id})
            continue
        lifecycle.mark_dispatched(db, job_id)
        redispatched.append(job_id)
    try:
        redispatched.extend(dispatch_fairly(db, dispatcher, per_tenant=settings.dispatch_per_tenant))
    except Exception:
        log.exception("fair dispatch failed; the next round tries again")
    if requeued or failed or redispatched:
        log.info(
            "reconciled",
            extra={"requeued": len(requeued), "failed": len(failed), "redispatched": len(redispatched)},
        )
    return ReconcileResult(tuple(requeued), tuple(failed), tuple(redispatched))


def run_periodically(db: Database, settings: Settings, dispatcher: JobDispatcher, stop: threading.Event) -> None:
    """Loop until ``stop`` is set; errors are logged and retried next round, never fatal."""
    while not stop.wait(settings.reconcile_interval_s):
        try:
            reconcile_once(db, settings, dispatcher)
        except Exception:
            log.exception("reconcile round failed")
