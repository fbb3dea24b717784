"""Settling a job's attempt: succeed (store the model, commit the charge with its report), stop
early after a cancel (commit the steps that ran) or fail (commit the whole reservation), each in
one transaction of kernel/jobs/lifecycle.py through kernel/job_run.py, which also prepares the
report before it and uploads it after it.

A cancelled job's numeric single-job ε may take a while: it runs here, with the job's heartbeat
kept, before the commit, never under the database write lock. A stale attempt (a newer one owns
the job) settles nothing.
"""

from __future__ import annotations

import logging
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from kernel import privacy
from kernel.jobs.planning import RebuiltJob
from kernel.jobs.status import JobStatus
from worker.claim import Claimed
from worker.context import WorkerContext
from worker.single_job_prefetch import SingleJobPrefetch
from worker.train import Outcome

__all__ = ["fail", "settle_stopped", "stale", "succeed"]

log = logging.getLogger("privtrain.worker")


def succeed(
    ctx: WorkerContext, claimed: Claimed, outcome: Outcome, *, single_job: SingleJobPrefetch | None = None
) -> str:
    """Store the model, then commit the charge and stage the report in one transaction;
    ``single_job``: the planned run's single-job ε, if it was started while training."""
    assert outcome.model_path is not None
    rebuilt = _ran(claimed)
    assert rebuilt is not None  # a tuning releases through its closer, not here
    released = ctx.kernel.release(
        attempt=claimed.held,
        job=claimed.job,
        dataset=claimed.dataset,
        rebuilt=rebuilt,
        model_path=outcome.model_path,
        steps_run=outcome.result.steps_run,
        metrics=outcome.metrics,
        ran=outcome.execution,
        single_job=single_job.result_for if single_job is not None else None,
    )
    if not released:
        return stale(claimed)
    log.info("job succeeded", extra={"job_id": claimed.job.id})
    return JobStatus.SUCCEEDED


def settle_stopped(ctx: WorkerContext, claimed: Claimed, steps_run: int) -> str:
    """Cancel after TOUCH: commit the steps that ran (no evaluation was released), release the
    rest, and store a report of them (its single-job ε for the steps run, not the plan)."""
    actual = claimed.event_json(steps_run, evaluated=False)
    # Numeric accountants may take a while: never under the database write lock.
    single_job = None if claimed.dataset.public else _single_job_beating(ctx, claimed, actual)
    stopped = ctx.kernel.stop_early(
        attempt=claimed.held,
        job=claimed.job,
        dataset=claimed.dataset,
        rebuilt=_ran(claimed),
        steps_run=steps_run,
        actual_event=actual,
        single_job=single_job,
    )
    return JobStatus.CANCELLED if stopped else stale(claimed)


def fail(ctx: WorkerContext, claimed: Claimed, *, error_code: str) -> None:
    """Commit the whole reservation (the data was opened) with its report."""
    failed = ctx.kernel.fail(
        attempt=claimed.held, job=claimed.job, dataset=claimed.dataset, rebuilt=_ran(claimed), error_code=error_code
    )
    if not failed:
        stale(claimed)


def _ran(claimed: Claimed) -> RebuiltJob | None:
    """The plan the attempt ran, for an ended job's report (None for a tuning: its mechanism is its pool's)."""
    if claimed.tuning is not None:
        return None
    return RebuiltJob(
        plan=claimed.plan,
        evaluation=claimed.evaluation,
        hyperparameters=claimed.hyperparameters,
        training=claimed.training,
    )


def _single_job_beating(ctx: WorkerContext, claimed: Claimed, event: dict[str, Any]) -> privacy.SingleJobEpsilon | None:
    """The numeric single-job ε of ``event`` (up to the accountants' time cap, 120 s), with the
    job's heartbeat kept meanwhile: a cancelled job taken for lost would be failed by the
    reconciler and charged its whole reservation instead of the steps it ran. None if it
    failed (the report then takes the closed forms)."""
    pending = SingleJobPrefetch.start(event, delta=claimed.job.delta, algorithm=claimed.job.algorithm).future
    while True:
        try:
            return pending.result(timeout=ctx.settings.heartbeat_interval_s)
        except FutureTimeout:
            ctx.kernel.heartbeat(claimed.held)
        except Exception:
            log.exception("the single-job epsilon of a cancelled job failed", extra={"job_id": claimed.job.id})
            return None


def stale(claimed: Claimed) -> str:
    log.warning("stale attempt finished; ignoring", extra={"job_id": claimed.job.id, "attempt": claimed.attempt})
    return "stale"
