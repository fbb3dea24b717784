"""Closing a tuning whose slots are all done: release its best trial, or fail (releasing nothing).

Called by the worker that finished the last slot, and by the reconciler for a tuning whose closer
was lost; both go through the same lifecycle transitions, which are conditional on the attempt
still running, so a tuning is closed once. Torch-free: the released trial's model file was
written by the slot that trained it (kernel/tuning/trial_files.py); closing only stores it as the
job's model, commits the tuning's whole reservation and writes the report.

What can end a tuning, all published when its slots are done, never earlier:

* a slot that could not keep its length (a trial's training error, a slot that overran its
  margin, a lost worker: the reconciler fails the tuning at once then, since nothing can be
  released) fails it with that slot's outcome;
* K = 0 (a Poisson count) fails it with ``no-trials-drawn``; every drawn trial stopped at the
  trial time limit fails it with ``no-trial-finished``: both are outputs of the mechanism (a
  release of "nothing"), covered by its charge;
* otherwise the best trial is released (kernel/tuning/selection.py).

However it ends, the whole reservation is committed: charging less would tell how many trials ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.status import JobStatus
from kernel.reporting.ended_report import EndedReportWriter, ended_report_inputs
from kernel.reporting.released_report import ReleasedTraining, prepare_release, released_model_report
from kernel.reporting.tuning import TUNING_CAVEAT, tuning_execution, tuning_section
from kernel.schemas.stored_spec import StoredTuning, stored_spec
from kernel.storage.blobs import BlobStore, StorageUnavailable
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from kernel.tuning.planning import rebuild_candidates
from kernel.tuning.selection import TrialResult, best_of
from kernel.tuning.trial_files import TrialFiles

__all__ = ["NO_TRIALS_DRAWN", "NO_TRIAL_FINISHED", "Closer"]

log = logging.getLogger("privtrain.tuning")

NO_TRIALS_DRAWN = "no-trials-drawn"
NO_TRIAL_FINISHED = "no-trial-finished"


@dataclass(frozen=True)
class Closer:
    """What closing needs: the database, the blob store, the trial files and the report's noise flag."""

    db: Database
    blobs: BlobStore
    files: TrialFiles
    secure_gaussian: bool
    actor: str

    def close(self, *, job_id: str, attempt: int) -> str:
        """Settle the tuning if every slot of ``attempt`` is done and it still runs; returns the
        status it ended with ("open" when slots remain, "stale" when it had already ended)."""
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            dataset = session.get(Dataset, job.dataset_id) if job is not None else None
            outcomes = tuning_slots.outcomes(session, job_id=job_id, attempt=attempt)
        if job is None or dataset is None or job.status != JobStatus.RUNNING or job.attempt != attempt:
            self.clear(job_id)
            return "stale"
        if not outcomes or any(outcome is None for outcome in outcomes):
            return "open"
        held = lifecycle.Attempt(job_id=job_id, dataset_id=dataset.id, number=attempt)
        failure = next((outcome for outcome in outcomes if outcome != tuning_slots.OK), None)
        if failure is None:
            counts = trial_queue.counts(self.db, job_id=job_id, attempt=attempt)
            finished = trial_queue.finished(self.db, job_id=job_id, attempt=attempt)
            metric = _tuning_of(job).selection.metric
            best = best_of((_result(trial) for trial in finished), metric)
            if best is not None:
                chosen = next(trial for trial in finished if trial.seq == best.seq)
                return self._release(job, dataset, held, best, model_file=chosen.model_file, device=chosen.device)
            failure = NO_TRIALS_DRAWN if counts.drawn == 0 else NO_TRIAL_FINISHED
        return self._fail(held, failure, job=job, dataset=dataset)

    def clear(self, job_id: str) -> None:
        """The tuning's secret trial queue and its trials' model files."""
        self.files.discard(trial_queue.clear(self.db, job_id=job_id))

    def _fail(self, held: lifecycle.Attempt, error_code: str, *, job: Job, dataset: Dataset) -> str:
        """Fail the tuning, committing its whole reservation, with the report of what it committed."""
        writer = EndedReportWriter(ended_report_inputs(job, dataset, secure_gaussian=self.secure_gaussian))
        ended = lifecycle.fail(self.db, attempt=held, error_code=error_code, actor=self.actor, write_report=writer)
        report_outbox.deliver(self.db, self.blobs, job_id=held.job_id)
        self.clear(held.job_id)
        return JobStatus.FAILED if ended else "stale"

    def _release(
        self,
        job: Job,
        dataset: Dataset,
        held: lifecycle.Attempt,
        best: TrialResult,
        *,
        model_file: str | None,
        device: str | None,
    ) -> str:
        _, candidates = rebuild_candidates(job.spec, job.algorithm, dataset, job.event)
        chosen = candidates[best.candidate]
        if model_file is None:  # kept whenever a trial may win: the best one always has its file
            log.error("a tuning's best trial has no model file", extra={"job_id": job.id})
            return self._fail(held, "artifact-write-failed", job=job, dataset=dataset)
        try:
            path = self.files.fetch(model_file)
            model_key, model_sha = self.blobs.put_file(path)
        except StorageUnavailable:
            log.exception("could not store a tuning's released model", extra={"job_id": job.id})
            return self._fail(held, "artifact-write-failed", job=job, dataset=dataset)
        # The whole reservation is committed, whatever ran: its event is the tuning's.
        actual = dict(job.event)
        trained = chosen.rebuilt
        release = prepare_release(
            job,
            dataset=dataset,
            trained=ReleasedTraining(
                plan=trained.plan, hyperparameters=trained.hyperparameters, training=trained.training
            ),
            actual_event=actual,
            metrics=best.metrics,
            model_sha256=model_sha,
            secure_gaussian=self.secure_gaussian,
            execution=tuning_execution(device or "an unrecorded device"),
        )
        selected = lifecycle.SelectedTrial(
            spec=stored_spec(job).released_trial(chosen.stored).to_json(),
            noise_multiplier=chosen.noise_multiplier,
            sampling_probability=chosen.sampling_probability,
            steps=chosen.steps,
        )

        def write_report(commit: lifecycle.CommitRecord) -> dict[str, Any]:
            assert commit.commit_entry is not None  # a tuning is never on a public dataset
            report = released_model_report(commit, release=release)
            report["tuning"] = tuning_section(_tuning_of(commit.job).to_json(), metrics=best.metrics)
            report["caveats"].insert(0, TUNING_CAVEAT)
            return report

        success = lifecycle.Success(
            steps_run=chosen.steps,
            actual_event=actual,
            model_blob=model_key,
            model_sha256=model_sha,
            metrics=best.metrics,
            epsilon_prv=release.single_job.epsilon,
            selected=selected,
        )
        ended = lifecycle.succeed(self.db, attempt=held, success=success, actor=self.actor, write_report=write_report)
        report_outbox.deliver(self.db, self.blobs, job_id=job.id)
        self.clear(job.id)
        if ended:
            log.info("tuning released its best trial", extra={"job_id": job.id})
        return JobStatus.SUCCEEDED if ended else "stale"


def _tuning_of(job: Job) -> StoredTuning:
    tuning = stored_spec(job).tuning
    if tuning is None:
        raise RuntimeError(f"job {job.id} is not a tuning")
    return tuning


def _result(trial: trial_queue.FinishedTrial) -> TrialResult:
    return TrialResult(seq=trial.seq, candidate=trial.candidate, metrics=trial.metrics, score=trial.score)
