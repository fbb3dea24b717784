"""The report of a model released on a private dataset: one builder for a job's worker and for
the closer of a private tuning (kernel/tuning/closing.py), so that both state the same sections.

Slow parts (the single-job ε, the init chain's composed guarantees) are computed by the caller
before the commit transaction; this runs inside it, from the commit's ledger record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from algorithms import PrivacyPlan, get_algorithm
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.reporting.init_report import apply_init_chain, init_section
from kernel.reporting.privacy_report import augmentation_section, build_report, released_weights_section
from kernel.reporting.privacy_unit import privacy_unit_section
from kernel.schemas.jobs import TrainingSpec
from kernel.schemas.stored_spec import stored_spec

if TYPE_CHECKING:  # the lifecycle imports kernel.reporting
    from kernel.jobs.lifecycle import CommitRecord

__all__ = ["ReleasedTraining", "released_model_report"]


@dataclass(frozen=True)
class ReleasedTraining:
    """How the released model trained: the plan, hyperparameters and training block it ran with
    (a tuning's: its selected configuration's)."""

    plan: PrivacyPlan
    hyperparameters: BaseModel
    training: TrainingSpec


def released_model_report(
    commit: CommitRecord,
    *,
    dataset: Dataset,
    trained: ReleasedTraining,
    actual_event: dict[str, Any],
    metrics: dict[str, Any] | None,
    model_sha256: str,
    secure_gaussian: bool,
    single_job: privacy.SingleJobEpsilon,
    chain: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report of ``commit``'s job, whose model is released (a private dataset: the commit has
    its ledger entry and budgets). ``chain``: the init chain's composed guarantees
    (kernel.reporting.init_report.chain_guarantees); the caller adds its ``execution`` section."""
    assert commit.commit_entry is not None and commit.budget_before is not None and commit.budget_after is not None
    job, plan = commit.job, trained.plan
    report = build_report(
        job=job,
        dataset=dataset,
        sensitivity=plan.sensitivity,
        expected_batch_size=plan.expected_batch_size,
        sampling=plan.sampling,
        sensitivity_norm=plan.sensitivity_norm,
        actual_event=actual_event,
        budget_before=commit.budget_before,
        budget_after=commit.budget_after,
        commit_entry=commit.commit_entry,
        adjustments=commit.adjustments,
        metrics=metrics,
        algorithm_notes=get_algorithm(job.algorithm).report_notes(
            trained.hyperparameters, plan, noise_multiplier=job.noise_multiplier, delta=job.delta
        ),
        model_sha256=model_sha256,
        secure_gaussian=secure_gaussian,
        single_job=single_job,
    )
    spec = stored_spec(job)
    if spec.init is not None:  # where the weights started; the chain's events on these rows compose
        unit = privacy_unit_section(dataset, spec.training.to_json())["guarantee_unit"]
        section = init_section(spec.init.to_json(), guarantees=chain, privacy_unit_column=dataset.privacy_unit_column)
        apply_init_chain(report, section, guarantee_unit=unit)
    report["released_weights"] = released_weights_section(trained.training.ema_decay)
    report["augmentation"] = augmentation_section(trained.training.augmult)
    return report
