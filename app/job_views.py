"""Rendering of jobs and their events for the API (public values only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.jobs.status import TERMINAL_STATUSES, JobStatus
from app.models import Job, JobEvent
from app.schemas.jobs import JobEventOut, JobOut

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


def job_out(job: Job) -> JobOut:
    links = {"self": f"/v1/jobs/{job.id}", "events": f"/v1/jobs/{job.id}/events"}
    if job.status == JobStatus.SUCCEEDED:
        if job.model_blob is not None:  # None: deleted with its dataset, at the owner's choice
            links["model"] = f"/v1/jobs/{job.id}/model"
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
        epsilon_ledger=job.epsilon_ledger,
        epsilon_committed=job.epsilon_committed,
        epsilon_prv=job.epsilon_prv,
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
