"""A job's life on a worker: claim → touch → train → evaluate → write artifacts → commit.

Every state change is a transition of kernel.jobs.lifecycle (one database transaction that first
locks the dataset's budget row, so the job row and the ledger always move together; the module
states the privacy rules), reached through kernel/job_run.py. Only the torch work is on the
worker. A retried attempt (after a lost worker) runs inside the same reservation: it is claimed
again but never reserves or touches again, and resumes from its checkpoint with the same
SecureRandom state and hold-out split (both secret: worker storage only, never in a log line,
event, report or model artifact). Messages of an old attempt are no-ops. Errors shown to users
are generic codes; tracebacks go to operator logs only (docs/privacy-model.md §1).

:class:`JobRunner` is the facade the Celery tasks call; each step lives in its own module:
worker/claim.py, worker/job_data.py, worker/model_setup.py, worker/train.py,
worker/model_output.py, worker/settle.py, worker/slot_runner.py, sharing worker/context.py.
"""

from __future__ import annotations

import logging

from kernel.config import Settings
from kernel.datasets.deletion import DatasetEraser
from kernel.db.engine import Database
from kernel.job_run import replan
from kernel.jobs.dispatch import Dispatcher
from kernel.jobs.private_files import JobPrivateFiles
from kernel.jobs.status import JobStatus
from kernel.storage.blobs import BlobStore, StorageUnavailable
from kernel.tuning.closing import Closer
from kernel.tuning.trial_files import TrialFiles
from worker import claim as claiming
from worker import settle
from worker import train as training
from worker.claim import Claimed
from worker.context import WorkerContext, device_label, training_device
from worker.single_job_prefetch import SingleJobPrefetch
from worker.slot_runner import OPENED, SLOT_DONE, SlotRunner
from worker.train import PROGRESS_MIN_GAP_S, Outcome, rows_per_chunk

__all__ = [
    "OPENED",
    "PREFETCH_SINGLE_JOB_ON",
    "PROGRESS_MIN_GAP_S",
    "SLOT_DONE",
    "Claimed",
    "JobRunner",
    "Outcome",
    "device_label",
    "replan",
    "rows_per_chunk",
]

log = logging.getLogger("privtrain.worker")

PREFETCH_SINGLE_JOB_ON: set[str] = {"cuda"}
"""Device types whose workers compute the report's single-job ε while the job trains."""


class JobRunner:
    def __init__(
        self,
        settings: Settings,
        *,
        db: Database | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        """``dispatcher``: sends the next queued job or tuning slot once this worker has taken one
        (fair sharing, kernel/jobs/dispatch.py); None in tests that run jobs in process."""
        self.ctx = WorkerContext.build(settings, db=db, dispatcher=dispatcher)
        self.slots = SlotRunner(self.ctx)
        """This worker's tuning slots (it keeps the tuning it ran last, its data loaded for the next slot)."""

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def db(self) -> Database:
        return self.ctx.db

    @property
    def blobs(self) -> BlobStore:
        return self.ctx.blobs

    @property
    def private_files(self) -> JobPrivateFiles:
        return self.ctx.private_files

    @property
    def trial_files(self) -> TrialFiles:
        return self.ctx.trial_files

    @property
    def eraser(self) -> DatasetEraser:
        return self.ctx.eraser

    @property
    def actor(self) -> str:
        return self.ctx.actor

    def _send_next(self) -> None:
        self.ctx.send_next()

    def claim(self, job_id: str) -> Claimed | None:
        """queued → running (attempt + 1) and, on the first attempt, TOUCH — one short transaction."""
        return claiming.claim(self.ctx, job_id=job_id)

    def run(self, job_id: str) -> str:
        self.slots.tuning = None  # an ordinary job needs the memory more than a tuning's next slot would
        claimed = self.claim(job_id)
        if claimed is None:
            return "skipped"
        self.ctx.send_next()
        if claimed.tuning is not None:
            return self.slots.open(claimed)
        # On a GPU worker the report's single-job ε of the planned run is computed on the idle CPU
        # while the job trains (used when the job ran exactly as planned); on a CPU worker it would
        # only take cores from training, so it is computed afterwards.
        single_job = (
            SingleJobPrefetch.start(
                claimed.event_json(claimed.job.steps_planned, evaluated=True),
                delta=claimed.job.delta,
                algorithm=claimed.job.algorithm,
            )
            if training_device().type in PREFETCH_SINGLE_JOB_ON
            else None
        )
        try:
            outcome = training.train(self.ctx, claimed)
        except StorageUnavailable:
            # Not the job's fault: leave it running without heartbeats, so the reconciler requeues
            # it inside its reservation once it is stale, as for a lost worker (up to max_attempts).
            log.warning("object store unavailable; the job will be retried", extra={"job_id": job_id})
            return "storage-unavailable"
        except Exception:
            log.exception("job failed", extra={"job_id": job_id})
            self.fail(claimed, error_code="training-failed")
            return JobStatus.FAILED
        try:
            if outcome.timed_out:
                self.fail(claimed, error_code="time-limit")
                return JobStatus.FAILED
            if outcome.result.stopped_early:
                return self.settle_stopped(claimed, outcome.result.steps_run)
            assert outcome.model_path is not None
            return self.succeed(claimed, outcome, single_job=single_job)
        except Exception:
            log.exception("finishing the job failed", extra={"job_id": job_id})
            self.fail(claimed, error_code="artifact-write-failed")
            return JobStatus.FAILED
        finally:
            if outcome.model_path is not None:
                outcome.model_path.unlink(missing_ok=True)

    def run_slot(self, job_id: str, *, attempt: int, slot: int) -> str:
        """One slot of a tuning (worker/slot_runner.py)."""
        return self.slots.run_slot(job_id, attempt=attempt, slot=slot)

    def closer(self) -> Closer:
        return self.slots.closer()

    def succeed(self, claimed: Claimed, outcome: Outcome, *, single_job: SingleJobPrefetch | None = None) -> str:
        return settle.succeed(self.ctx, claimed, outcome, single_job=single_job)

    def settle_stopped(self, claimed: Claimed, steps_run: int) -> str:
        return settle.settle_stopped(self.ctx, claimed, steps_run)

    def fail(self, claimed: Claimed, *, error_code: str) -> None:
        settle.fail(self.ctx, claimed, error_code=error_code)
