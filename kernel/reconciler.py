"""Settles jobs whose worker vanished and re-sends queued jobs whose message was lost.

Torch-free, so it runs in the API process (embedded mode), as ``privtrain-admin reconcile`` or as
its own service. What it does to a stale job is a lifecycle transition
(:func:`kernel.jobs.lifecycle.requeue_or_fail`, whose module states the rules); here are only the
rounds: find running jobs without a heartbeat for ``stale_after_s`` (the report of one that fails
is prepared before its transaction, kernel.reporting.ended_report), queued jobs older than
``redispatch_after_s`` to send again, trial queues of tunings no worker will settle, and dataset
deletions whose jobs have settled but whose erasure was not finished (kernel/datasets/deletion.py). A
duplicate message is a no-op because claiming is a conditional UPDATE.

An opened private tuning has no heartbeat of its own: its slots beat (kernel/tuning/slots.py). A slot
whose worker stopped beating fails the tuning (``worker-lost``; a retried slot would make the
tuning's timing depend on which slots held trials), a slot message that was lost is sent again,
and a tuning whose slots are all done but which nobody closed (its last slot's worker was lost
after finishing) is closed here.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass

from sqlalchemy import exists, or_, select

from kernel.config import Settings
from kernel.datasets.deletion import DatasetEraser
from kernel.datasets.status import DatasetStatus
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job, TuningSlot, utcnow
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.dispatch import dispatch_with_settings
from kernel.jobs.private_files import JobPrivateFiles
from kernel.jobs.status import JobStatus
from kernel.reporting.ended_report import EndedReportWriter, reservation_report_writer
from kernel.services import JobDispatcher
from kernel.storage.configured import blob_store_from_settings
from kernel.storage.erasure import evict_erased_copies
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from kernel.tuning.closing import Closer
from kernel.tuning.trial_files import TrialFiles

log = logging.getLogger("privtrain.reconciler")


@dataclass(frozen=True)
class ReconcileResult:
    requeued: tuple[str, ...]
    failed: tuple[str, ...]
    redispatched: tuple[str, ...]


def _now() -> dt.datetime:
    return utcnow()


def _stale_running(db: Database, cutoff: dt.datetime) -> list[tuple[str, str, int]]:
    """Running jobs without a recent heartbeat, but opened tunings (their slots beat instead)."""
    opened = exists().where(TuningSlot.job_id == Job.id, TuningSlot.attempt == Job.attempt)
    with db.read_session() as session:
        rows = session.execute(
            select(Job.id, Job.dataset_id, Job.attempt).where(
                Job.status == JobStatus.RUNNING,
                or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < cutoff),
                ~opened,
            )
        ).all()
    return [(r[0], r[1], r[2]) for r in rows]


def _settle_tunings(db: Database, settings: Settings, cutoff: dt.datetime) -> list[str]:
    """Fail the tunings with a lost slot; close those whose last slot's worker did not. Returns
    the ids of the tunings failed here."""
    with db.read_session() as session:
        lost = tuning_slots.stale_running(session, cutoff)
        unclosed = tuning_slots.finished_unclosed(session, cutoff)
    failed = [
        job_id
        for job_id, dataset_id, attempt in lost
        if lifecycle.fail(
            db,
            attempt=lifecycle.Attempt(job_id=job_id, dataset_id=dataset_id, number=attempt),
            error_code="worker-lost",
            actor=lifecycle.RECONCILER_ACTOR,
            write_report=_report_writer(db, job_id, will_fail=True),
        )
    ]
    if unclosed:
        blobs = blob_store_from_settings(settings)
        closer = Closer(
            db=db,
            blobs=blobs,
            files=TrialFiles(settings.checkpoint_dir, blobs),
            secure_gaussian=settings.secure_noise,
            actor=lifecycle.RECONCILER_ACTOR,
        )
        for job_id, attempt in unclosed:
            try:
                closer.close(job_id=job_id, attempt=attempt)
            except Exception:
                log.exception("closing a tuning failed; the next round tries again", extra={"job_id": job_id})
    tuning_slots.drop_abandoned(db)
    return failed


def _redispatch_lost_slots(db: Database, dispatcher: JobDispatcher, cutoff: dt.datetime) -> list[str]:
    """Slot messages sent long ago that no worker claimed: sent again as they were."""
    with db.read_session() as session:
        lost = tuning_slots.sent_long_ago(session, cutoff)
    sent = []
    for slot in lost:
        try:
            dispatcher.dispatch_slot(slot.job_id, attempt=slot.attempt, slot=slot.slot, queue=slot.queue)
        except Exception:  # the broker may be down; the next round tries again
            log.exception("re-dispatch of a tuning slot failed", extra={"job_id": slot.job_id})
            continue
        tuning_slots.mark_resent(db, slot.id)
        sent.append(f"slot:{slot.id}")
    return sent


def _report_writer(
    db: Database, job_id: str, *, max_attempts: int = 0, will_fail: bool = False
) -> EndedReportWriter | None:
    """The report of a stale job that will fail here (its last attempt, a cancel asked for, or
    ``will_fail``: a tuning with a lost slot): its inputs for the whole reservation it then
    commits, computed before the settling transaction. Jobs that will be requeued get a writer
    without inputs (used only if they fail after all)."""
    with db.read_session() as session:
        job = session.get(Job, job_id)
        dataset = session.get(Dataset, job.dataset_id) if job is not None else None
    fails = job is not None and (will_fail or job.attempt >= max_attempts or job.cancel_requested)
    touched = job is not None and job.touched_at is not None
    return reservation_report_writer(job, dataset, commits_reservation=touched and fails)


def _due_for_dispatch(db: Database, cutoff: dt.datetime) -> list[tuple[str, str | None]]:
    """(job id, queue) of jobs sent long ago that no worker started: their message was lost."""
    with db.read_session() as session:
        return list(
            session.execute(
                select(Job.id, Job.queue).where(
                    Job.status == JobStatus.QUEUED,
                    Job.dispatched_at.is_not(None),  # never sent: kernel/jobs/dispatch.py sends those
                    Job.dispatched_at < cutoff,
                )
            )
        )


def _clear_abandoned_trials(db: Database, settings: Settings) -> None:
    """The trial queues of tunings that ended, or whose worker was lost, with their models'
    private files (kernel/tuning/trial_queue.py): the worker that closes a tuning clears them."""
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


def _deliver_reports(db: Database, settings: Settings) -> None:
    """Upload the reports whose settlement committed but whose upload did not follow (a crash, or
    the store down): kernel/jobs/report_outbox.py."""
    try:
        if report_outbox.has_pending(db):
            report_outbox.deliver(db, blob_store_from_settings(settings))
    except Exception:
        log.exception("delivering pending reports failed; the next round tries again")


def _finish_deletions(db: Database, settings: Settings) -> None:
    """Deletions whose jobs settled without a worker to finish them (lost, failed here), or whose
    erasure an outage interrupted; and this host's cached copies of erased blobs."""
    try:
        with db.read_session() as session:
            pending = session.scalar(select(Dataset.id).where(Dataset.status == DatasetStatus.DELETING).limit(1))
        if pending is None and not settings.blob_cache_dir.is_dir():
            return  # the usual round: nothing to finish, no cache on this host
        eraser = DatasetEraser.from_settings(settings, db=db)
        eraser.finish_pending()
        evict_erased_copies(db, eraser.blobs)
    except Exception:
        log.exception("finishing dataset deletions failed; the next round tries again")


def reconcile_once(db: Database, settings: Settings, dispatcher: JobDispatcher) -> ReconcileResult:
    now = _now()
    stale_cutoff = now - dt.timedelta(seconds=settings.stale_after_s)
    requeued: list[str] = []
    failed: list[str] = []
    stale = _stale_running(db, stale_cutoff)
    for job_id, dataset_id, attempt in stale:
        outcome = lifecycle.requeue_or_fail(
            db,
            job_id=job_id,
            dataset_id=dataset_id,
            attempt=attempt,
            stale_before=stale_cutoff,
            max_attempts=settings.max_attempts,
            write_report=_report_writer(db, job_id, max_attempts=settings.max_attempts),
        )
        if outcome == JobStatus.QUEUED:
            requeued.append(job_id)
        elif outcome == JobStatus.FAILED:
            failed.append(job_id)
    try:
        failed.extend(_settle_tunings(db, settings, stale_cutoff))
    except Exception:
        log.exception("settling tunings failed; the next round tries again")
    if failed:
        _discard_private_files(settings, failed)
    _clear_abandoned_trials(db, settings)
    _deliver_reports(db, settings)
    _finish_deletions(db, settings)
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
    redispatched.extend(_redispatch_lost_slots(db, dispatcher, now - dt.timedelta(seconds=settings.redispatch_after_s)))
    try:
        redispatched.extend(dispatch_with_settings(db, dispatcher, settings))
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
