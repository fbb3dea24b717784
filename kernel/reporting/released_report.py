"""The report of a released model: one builder for a job's worker and for the closer of a private
tuning (kernel/tuning/closing.py), so that both state the same sections.

Two halves, because of the budget-row lock. :func:`prepare_release` computes what takes time (the
single-job ε from the numeric accountants, the init chain's composed guarantees) before the
settling transaction; :func:`released_model_report` runs inside it, from the commit's ledger
record, and only assembles. The lifecycle stages the result; it is uploaded after the commit
(kernel/jobs/report_outbox.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from algorithms import PrivacyPlan, get_algorithm
from kernel import privacy
from kernel.db.orm import Dataset, Job
from kernel.jobs.lifecycle import CommitRecord
from kernel.reporting.init_report import apply_init_chain, chain_guarantees, init_section
from kernel.reporting.privacy_report import (
    augmentation_section,
    build_public_report,
    build_report,
    released_weights_section,
    report_single_job_epsilon,
)
from kernel.reporting.privacy_unit import privacy_unit_section
from kernel.schemas.jobs import TrainingSpec
from kernel.schemas.stored_spec import stored_spec

__all__ = ["ReleasedModel", "ReleasedTraining", "prepare_release", "released_model_report"]


@dataclass(frozen=True)
class ReleasedTraining:
    """How the released model trained: the plan, hyperparameters and training block it ran with
    (a tuning's: its selected configuration's)."""

    plan: PrivacyPlan
    hyperparameters: BaseModel
    training: TrainingSpec


@dataclass(frozen=True)
class ReleasedModel:
    """Everything a released model's report states besides its commit, computed before the
    settling transaction (:func:`prepare_release`)."""

    dataset: Dataset
    trained: ReleasedTraining
    actual_event: dict[str, Any]
    """The event of the steps run and the released evaluation: what the job commits."""
    metrics: dict[str, Any] | None
    model_sha256: str
    secure_gaussian: bool
    single_job: privacy.SingleJobEpsilon
    chain: dict[str, Any] | None
    """The init chain's composed guarantees (None without a chain)."""
    execution: dict[str, Any] | None
    """Where and how fast it ran (the report's execution section)."""


def prepare_release(
    job: Job,
    *,
    dataset: Dataset,
    trained: ReleasedTraining,
    actual_event: dict[str, Any],
    metrics: dict[str, Any] | None,
    model_sha256: str,
    secure_gaussian: bool,
    execution: dict[str, Any] | None,
    single_job: privacy.SingleJobEpsilon | None = None,
) -> ReleasedModel:
    """The slow parts of ``job``'s report, outside any lock: its single-job ε (unless the caller
    computed it already, e.g. while the job trained) and its init chain's guarantees. A tuning's
    trials share one init, its carrier's: ``job`` is the carrier."""
    init = stored_spec(job).init
    return ReleasedModel(
        dataset=dataset,
        trained=trained,
        actual_event=actual_event,
        metrics=metrics,
        model_sha256=model_sha256,
        secure_gaussian=secure_gaussian,
        single_job=single_job or report_single_job_epsilon(actual_event, delta=job.delta, algorithm=job.algorithm),
        chain=chain_guarantees(
            init.to_json() if init is not None else None,
            actual_event=None if dataset.public else actual_event,
            delta=job.delta,
            algorithm=job.algorithm,
            numeric=True,
        ),
        execution=execution,
    )


def released_model_report(commit: CommitRecord, *, release: ReleasedModel) -> dict[str, Any]:
    """The report of ``commit``'s job, whose model is released: with its ledger view on a private
    dataset, plainly without a guarantee on a public one (the commit then has no ledger entry)."""
    report = _public_report(commit, release) if commit.commit_entry is None else _private_report(commit, release)
    report["execution"] = release.execution
    return report


def _private_report(commit: CommitRecord, release: ReleasedModel) -> dict[str, Any]:
    assert commit.commit_entry is not None and commit.budget_before is not None and commit.budget_after is not None
    job, plan, dataset = commit.job, release.trained.plan, release.dataset
    report = build_report(
        job=job,
        dataset=dataset,
        sensitivity=plan.sensitivity,
        expected_batch_size=plan.expected_batch_size,
        sampling=plan.sampling,
        sensitivity_norm=plan.sensitivity_norm,
        actual_event=release.actual_event,
        budget_before=commit.budget_before,
        budget_after=commit.budget_after,
        commit_entry=commit.commit_entry,
        adjustments=commit.adjustments,
        metrics=release.metrics,
        algorithm_notes=get_algorithm(job.algorithm).report_notes(
            release.trained.hyperparameters, plan, noise_multiplier=job.noise_multiplier, delta=job.delta
        ),
        model_sha256=release.model_sha256,
        secure_gaussian=release.secure_gaussian,
        single_job=release.single_job,
    )
    spec = stored_spec(job)
    if spec.init is not None:  # where the weights started; the chain's events on these rows compose
        unit = privacy_unit_section(dataset, spec.training.to_json())["guarantee_unit"]
        section = init_section(
            spec.init.to_json(), guarantees=release.chain, privacy_unit_column=dataset.privacy_unit_column
        )
        apply_init_chain(report, section, guarantee_unit=unit)
    report["released_weights"] = released_weights_section(release.trained.training.ema_decay)
    report["augmentation"] = augmentation_section(release.trained.training.augmult)
    return report


def _public_report(commit: CommitRecord, release: ReleasedModel) -> dict[str, Any]:
    """A public dataset: no ledger, no guarantee; what ran and where its weights started."""
    plan, dataset = release.trained.plan, release.dataset
    report = build_public_report(
        job=commit.job,
        dataset=dataset,
        expected_batch_size=plan.expected_batch_size,
        sampling=plan.sampling,
        metrics=release.metrics,
        model_sha256=release.model_sha256,
    )
    init: Mapping[str, Any] | None = None if (start := stored_spec(commit.job).init) is None else start.to_json()
    report["init"] = init_section(
        init, guarantees=release.chain, privacy_unit_column=dataset.privacy_unit_column, public_dataset=True
    )
    report["released_weights"] = released_weights_section(release.trained.training.ema_decay)
    report["augmentation"] = augmentation_section(release.trained.training.augmult, private=False)
    return report
