"""Settling a job's attempt: succeed (store the model, commit the charge with its report), stop
early after a cancel (commit the steps that ran) or fail (commit the whole reservation), each in
one transaction of kernel/jobs/lifecycle.py through kernel/jobs/job_run.py, with its report.

The numeric accountants behind a report's single-job ε and an init chain's guarantees may take a
while: they run here, before the commit, never under the database write lock. A stale attempt
(a newer one owns the job) settles nothing.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from kernel import privacy
from kernel.jobs import lifecycle
from kernel.jobs.planning import RebuiltJob
from kernel.jobs.status import JobStatus
from kernel.reporting.ended_report import EndedReportWriter, ended_report_inputs
from kernel.reporting.init_report import chain_guarantees, init_section
from kernel.reporting.privacy_report import (
    augmentation_section,
    build_public_report,
    released_weights_section,
    report_single_job_epsilon,
)
from kernel.reporting.released_report import ReleasedTraining, released_model_report
from worker.claim import Claimed
from worker.context import WorkerContext
from worker.single_job_prefetch import SingleJobPrefetch
from worker.train import Outcome

__all__ = ["fail", "settle_stopped", "stale", "succeed"]

log = logging.getLogger("privtrain.worker")


def succeed(
    ctx: WorkerContext, claimed: Claimed, outcome: Outcome, *, single_job: SingleJobPrefetch | None = None
) -> str:
    """Store the model, then commit the charge and write the report in one transaction;
    ``single_job``: the planned run's single-job ε, if it was started while training."""
    assert outcome.model_path is not None
    model_key, model_sha = ctx.blobs.put_file(outcome.model_path)
    steps_run = outcome.result.steps_run
    actual = claimed.event_json(steps_run, evaluated=True)
    # Numeric accountants may take a while: never under the database write lock.
    epsilon = (single_job.result_for(actual) if single_job is not None else None) or report_single_job_epsilon(
        actual, delta=claimed.job.delta, algorithm=claimed.job.algorithm
    )
    public = claimed.dataset.public
    provenance = claimed.spec.init
    init = provenance.to_json() if provenance is not None else None  # a tuning's trials share one init: its carrier's
    chain = chain_guarantees(  # the init chain's composed guarantees, also slow: before the commit
        init,
        actual_event=None if public else actual,
        delta=claimed.job.delta,
        algorithm=claimed.job.algorithm,
        numeric=True,
    )
    unit_column = claimed.dataset.privacy_unit_column

    def write_report(commit: lifecycle.CommitRecord) -> str:
        if commit.commit_entry is None or commit.budget_before is None or commit.budget_after is None:
            report = build_public_report(  # a public dataset: no ledger, no guarantee
                job=commit.job,
                dataset=claimed.dataset,
                expected_batch_size=claimed.plan.expected_batch_size,
                sampling=claimed.plan.sampling,
                metrics=outcome.metrics,
                model_sha256=model_sha,
            )
            report["init"] = init_section(init, guarantees=chain, privacy_unit_column=unit_column, public_dataset=True)
            report["released_weights"] = released_weights_section(claimed.training.ema_decay)
            report["augmentation"] = augmentation_section(claimed.training.augmult, private=False)
            report["execution"] = outcome.execution
            report_key, _ = ctx.blobs.put_bytes(json.dumps(report, indent=2, allow_nan=False).encode())
            return report_key
        report = released_model_report(
            commit,
            dataset=claimed.dataset,
            trained=ReleasedTraining(
                plan=claimed.plan, hyperparameters=claimed.hyperparameters, training=claimed.training
            ),
            actual_event=actual,
            metrics=outcome.metrics,
            model_sha256=model_sha,
            secure_gaussian=ctx.settings.secure_noise,
            single_job=epsilon,
            chain=chain,
        )
        report["execution"] = outcome.execution
        report_key, _ = ctx.blobs.put_bytes(json.dumps(report, indent=2, allow_nan=False).encode())
        return report_key

    success = lifecycle.Success(
        steps_run=steps_run,
        actual_event=actual,
        model_blob=model_key,
        model_sha256=model_sha,
        metrics=outcome.metrics,
        epsilon_prv=epsilon.epsilon,
    )
    if not ctx.kernel.succeed(attempt=claimed.held, success=success, write_report=write_report):
        return stale(claimed)
    log.info("job succeeded", extra={"job_id": claimed.job.id})
    return JobStatus.SUCCEEDED


def settle_stopped(ctx: WorkerContext, claimed: Claimed, steps_run: int) -> str:
    """Cancel after TOUCH: commit the steps that ran (no evaluation was released), release the
    rest, and store a report of them (its single-job ε for the steps run, not the plan)."""
    actual = claimed.event_json(steps_run, evaluated=False)
    writer = None
    if not claimed.dataset.public:
        # Numeric accountants may take a while: never under the database write lock.
        single_job = _single_job_beating(ctx, claimed, actual)
        writer = ended_report(ctx, claimed, committed_event=actual, single_job=single_job)
    if not ctx.kernel.stop_early(attempt=claimed.held, steps_run=steps_run, actual_event=actual, write_report=writer):
        return stale(claimed)
    return JobStatus.CANCELLED


def fail(ctx: WorkerContext, claimed: Claimed, *, error_code: str) -> None:
    """Commit the whole reservation (the data was opened) with its report."""
    writer = None if claimed.dataset.public else ended_report(ctx, claimed, committed_event=claimed.job.event)
    if not ctx.kernel.fail(attempt=claimed.held, error_code=error_code, write_report=writer):
        stale(claimed)


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


def ended_report(
    ctx: WorkerContext,
    claimed: Claimed,
    *,
    committed_event: dict[str, Any],
    single_job: privacy.SingleJobEpsilon | None = None,
) -> EndedReportWriter:
    """The report writer of a job this worker ends without success; its inputs computed now,
    outside the settling transaction (a failure here leaves them to the writer)."""
    secure = ctx.settings.secure_noise
    rebuilt = (
        None
        if claimed.tuning is not None  # a tuning's mechanism is its pool's, not one plan's
        else RebuiltJob(
            plan=claimed.plan,
            evaluation=claimed.evaluation,
            hyperparameters=claimed.hyperparameters,
            training=claimed.training,
        )
    )
    try:
        inputs = ended_report_inputs(
            claimed.job,
            claimed.dataset,
            committed_event=committed_event,
            single_job=single_job,
            secure_gaussian=secure,
            rebuilt=rebuilt,
        )
    except Exception:
        log.exception("could not prepare an ended job's report", extra={"job_id": claimed.job.id})
        inputs = None
    return EndedReportWriter(ctx.blobs, inputs, secure_gaussian=secure)


def stale(claimed: Claimed) -> str:
    log.warning("stale attempt finished; ignoring", extra={"job_id": claimed.job.id, "attempt": claimed.attempt})
    return "stale"
