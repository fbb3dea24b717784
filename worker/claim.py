"""Preparing and claiming a job: re-derive its charge (kernel/job_run.py), check its model
fits before any lock is taken, then claim it in one short transaction.

A refused job (its charge cannot be re-derived, or its spec does not fit its model) is failed by
the claim itself, before TOUCH: nothing of its data was read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from algorithms import PrivacyPlan
from algorithms.trainers import preflight
from kernel.datasets.facts import DatasetFacts
from kernel.db.orm import Dataset, Job
from kernel.job_run import Rederived, job_event_json
from kernel.jobs import lifecycle
from kernel.jobs.evaluation import EvaluationPlan
from kernel.schemas.jobs import TrainingSpec
from kernel.schemas.stored_spec import StoredJobSpec
from worker.context import WorkerContext
from worker.model_setup import starting_model
from worker.tuning import TuningClaim

__all__ = ["Claimed", "claim", "prepare"]

log = logging.getLogger("privtrain.worker")


@dataclass(frozen=True)
class Claimed:
    job: Job
    dataset: Dataset
    plan: PrivacyPlan
    evaluation: EvaluationPlan | None
    hyperparameters: BaseModel
    """Re-validated from the stored spec by the catalogue (what the trainer reads)."""
    training: TrainingSpec
    spec: StoredJobSpec
    """The stored spec the attempt runs (a tuning's trial: its candidate's)."""
    facts: DatasetFacts
    n_outputs: int
    """The model's outputs on this dataset."""
    tuning: TuningClaim | None = None
    """A tuning's candidates (the job runs its trials); None for an ordinary job."""

    @classmethod
    def of(cls, rederived: Rederived, job: Job) -> Claimed:
        """The job as its attempt runs it (only for a job that was not refused)."""
        rebuilt, facts, n_outputs, spec = rederived.rebuilt, rederived.facts, rederived.n_outputs, rederived.spec
        assert rebuilt is not None and facts is not None and n_outputs is not None and spec is not None  # else refused
        pool = rederived.tuning
        return cls(
            job=job,
            dataset=rederived.dataset,
            plan=rebuilt.plan,
            evaluation=rebuilt.evaluation,
            hyperparameters=rebuilt.hyperparameters,
            training=rebuilt.training,
            spec=spec,
            facts=facts,
            n_outputs=n_outputs,
            tuning=None if pool is None else TuningClaim(pool.distribution, pool.candidates, metric=pool.metric),
        )

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def held(self) -> lifecycle.Attempt:
        """This attempt's hold on the job, as the lifecycle transitions check it."""
        return lifecycle.Attempt(job_id=self.job.id, dataset_id=self.dataset.id, number=self.job.attempt)

    def event_json(self, steps: int, *, evaluated: bool) -> dict[str, Any]:
        if self.tuning is not None:  # a tuning commits its whole event, however it ends
            return dict(self.job.event)
        return job_event_json(
            self.plan, self.evaluation, noise_multiplier=self.job.noise_multiplier, steps=steps, evaluated=evaluated
        )


def prepare(ctx: WorkerContext, *, job_id: str) -> Rederived | None:
    """Re-derive the job's charge and check it against its model, before any lock is taken.

    Why outside the claim's transaction: building a model (and planning) can take seconds for
    large models, and on SQLite the write transaction blocks every other writer meanwhile
    (another tenant's upload, a submission). A job's spec and dataset facts never change
    after submission, so what is computed here still holds when the claim commits.
    """
    rederived = ctx.kernel.prepare(job_id)
    if rederived is None or rederived.refusal is not None:
        return rederived
    job, dataset, rebuilt, n_outputs = rederived.job, rederived.dataset, rederived.rebuilt, rederived.n_outputs
    assert rebuilt is not None and n_outputs is not None and rederived.spec is not None
    try:  # checks that need the model but not the data: fail before TOUCH
        for spec, hyperparameters in (
            [(c.stored.spec, c.rebuilt.hyperparameters) for c in rederived.tuning.candidates]
            if rederived.tuning is not None
            else [(rederived.spec, rebuilt.hyperparameters)]
        ):
            model = starting_model(ctx, model_name=job.model_name, spec=spec, dataset=dataset, n_outputs=n_outputs)
            preflight(job.algorithm, model, hyperparameters)
    except ValueError:
        log.exception("job spec does not fit its model", extra={"job_id": job_id})
        return Rederived(job=job, dataset=dataset, refusal="invalid-for-model")
    return rederived


def claim(ctx: WorkerContext, *, job_id: str) -> Claimed | None:
    """queued → running (attempt + 1) and, on the first attempt, TOUCH — one short transaction."""
    prepared = prepare(ctx, job_id=job_id)
    if prepared is None:
        log.warning("unknown job", extra={"job_id": job_id})
        return None
    refusal = prepared.refusal or ("plan-mismatch" if prepared.rebuilt is None else None)
    job = ctx.kernel.claim(job_id=job_id, dataset=prepared.dataset, refusal=refusal)
    if job is None:
        if refusal is None:
            log.info("job not claimable (duplicate or late message)", extra={"job_id": job_id})
        return None
    return Claimed.of(prepared, job)
