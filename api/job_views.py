"""Rendering of jobs and their events for the API (public values only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kernel.db.orm import Job, JobEvent
from kernel.jobs.status import TERMINAL_STATUSES, JobStatus
from kernel.schemas.jobs import JobEventOut, JobOut

EpsilonBasis = Literal["reserved", "committed"]


@dataclass(frozen=True)
class JobEpsilon:
    """The one ε to show for a job, and what it is: a reservation (still running) or a spend."""

    value: float
    basis: EpsilonBasis


def job_epsilon(job: Job) -> JobEpsilon:
    """Committed ε once the job has ended, reserved ε while it is queued or running.

    Why: a job that stopped early or was cancelled spends less than it reserved, and the rest goes
    back to the budget; showing the reservation after the end would overstate what it cost. A
    finished job with no recorded commitment (a row older than the column, never backfilled) keeps
    the reserved basis rather than pretending to know its spend.
    """
    if job.status in TERMINAL_STATUSES and job.epsilon_committed is not None:
        return JobEpsilon(value=job.epsilon_committed, basis="committed")
    return JobEpsilon(value=job.epsilon_ledger, basis="reserved")


def single_job_epsilon(job: Job) -> float | None:
    """The single-job ε of what :func:`job_epsilon` counts, on the same basis.

    The column holds the planned run's number from admission until the job ends; the transition
    that ends it replaces it with the number of the event it committed (kernel.jobs.lifecycle). A job
    that spent nothing states 0. A job that ended without succeeding before that replacement
    existed still holds its plan's number: that is not what it spent, unless it committed its
    whole reservation (a failure), so it states none rather than the plan's as if spent.
    """
    if job.epsilon_prv is None:  # a public dataset: no budget, no ε
        return None
    if job.status not in TERMINAL_STATUSES or job.epsilon_committed is None:
        return job.epsilon_prv  # the planned run's, beside the reservation
    if job.epsilon_committed == 0.0:
        return 0.0
    if job.status == JobStatus.SUCCEEDED or job.report_blob is not None or job.epsilon_committed == job.epsilon_ledger:
        return job.epsilon_prv
    return None


def job_out(job: Job) -> JobOut:
    links = {"self": f"/v1/jobs/{job.id}", "events": f"/v1/jobs/{job.id}/events"}
    if job.status == JobStatus.SUCCEEDED and job.model_blob is not None:  # None: deleted with its dataset
        links["model"] = f"/v1/jobs/{job.id}/model"
    if job.report_blob is not None:  # a succeeded job's, or one that ended having committed ε
        links["report"] = f"/v1/jobs/{job.id}/report"
    shown = job_epsilon(job)
    return JobOut(
        id=job.id,
        dataset_id=job.dataset_id,
        status=job.status,
        algorithm=job.algorithm,
        model=job.model_name,
        queue=job.queue,
        spec=job.spec,
        noise_multiplier=job.noise_multiplier,
        steps_planned=job.steps_planned,
        steps_run=job.steps_run,
        delta=job.delta,
        epsilon=shown.value,
        epsilon_basis=shown.basis,
        epsilon_reserved=job.epsilon_ledger,
        epsilon_committed=job.epsilon_committed,
        epsilon_single_job=single_job_epsilon(job),
        attempt=job.attempt,
        cancel_requested=job.cancel_requested,
        error_code=job.error_code,
        metrics=job.metrics,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        links=links,
    )


def event_out(event: JobEvent) -> JobEventOut:
    """An event as clients see it: ``seq`` is its number within the job."""
    return JobEventOut(seq=event.seq, kind=event.kind, payload=event.payload, created_at=event.created_at)
