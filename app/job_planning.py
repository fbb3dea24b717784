"""Turn a validated job spec and a dataset's public facts into a priced plan.

Shared by ``/v1/jobs/estimate`` (dry run) and ``/v1/jobs`` (admission): the same function
decides σ, the privacy event and its RDP curve, so an estimate is exactly what a submit charges.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from app import ledger, privacy
from app.algorithms import (
    AlgorithmDefinition,
    InvalidHyperparameters,
    PrivacyPlan,
    UnknownAlgorithm,
    get_algorithm,
)
from app.evaluation import EvaluationPlan, InvalidEvaluation, plan_evaluation
from app.facts import DatasetFacts
from app.model_catalogue import ModelIncompatible, ModelSizeLimits, UnknownModel, get_model
from app.models import Dataset, PrivacyBudget
from app.privacy import PrivacyEvent
from app.problems import Problem
from app.schemas.jobs import EvaluationSpec, JobCreate, TrainingSpec
from privtrain.directed_rounding import format_remaining


def compose_job_event(
    plan: PrivacyPlan,
    evaluation: EvaluationPlan | None,
    *,
    noise_multiplier: float,
    steps: int,
    evaluated: bool,
) -> PrivacyEvent:
    """The privacy event of a job that ran ``steps`` steps and, if ``evaluated``, released its metric."""
    training = plan.event_for(noise_multiplier, steps)
    if evaluation is None or not evaluated:
        return training
    return privacy.ComposedEvent(events=(training, evaluation.event()))


@dataclass(frozen=True)
class JobPlan:
    spec: dict[str, Any]
    algorithm: AlgorithmDefinition
    model_name: str
    plan: PrivacyPlan
    evaluation: EvaluationPlan | None
    noise_multiplier: float
    delta: float
    event_json: dict[str, Any]
    curve: tuple[float, ...]
    epsilon_ledger: float
    epsilon_prv: float | None
    epsilon_prv_method: str | None = None
    """Which single-job method gave ``epsilon_prv`` (app.privacy.single_job.METHODS)."""

    @property
    def noise_std_on_sum(self) -> float:
        return self.noise_multiplier * self.plan.sensitivity

    def event_for_sigma(self, noise_multiplier: float) -> PrivacyEvent:
        return compose_job_event(
            self.plan,
            self.evaluation,
            noise_multiplier=noise_multiplier,
            steps=self.plan.steps,
            evaluated=True,
        )


def largest_admissible_epsilon(job: JobPlan, budget: PrivacyBudget) -> float:
    """The largest target ε the same spec could be given and still be admitted now.

    Admission is monotone in σ, so bisect (in log σ) for the smallest admitted σ; its ledger ε
    is the answer (the target that calibrates to that σ). 0 when no σ ≤ 1e6 fits.
    """

    def admitted(sigma: float) -> bool:
        return ledger.check_admissible(budget, privacy.rdp_curve(job.event_for_sigma(sigma))) is not None

    low, high = 1e-4, 1e6
    if not admitted(high):
        return 0.0
    if admitted(low):
        return privacy.ledger_epsilon(privacy.rdp_curve(job.event_for_sigma(low)), job.delta)
    for _ in range(60):
        middle = math.sqrt(low * high)
        if admitted(middle):
            high = middle
        else:
            low = middle
        if high / low < 1 + 1e-6:
            break
    return privacy.ledger_epsilon(privacy.rdp_curve(job.event_for_sigma(high)), job.delta)


def facts_of(dataset: Dataset) -> DatasetFacts:
    return DatasetFacts(
        n_rows=dataset.n_rows,
        feature_shape=tuple(dataset.feature_shape),
        task=dataset.task,
        n_classes=dataset.n_classes,
    )


def request_hash(spec: JobCreate) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _invalid(slug: str, detail: str) -> Problem:
    return Problem(status=422, slug=slug, detail=detail)


def plan_job(
    spec: JobCreate,
    dataset: Dataset,
    *,
    dataset_delta: float,
    max_steps: int,
    max_time_limit_s: float | None = None,
    model_limits: ModelSizeLimits | None = None,
) -> JobPlan:
    """Validate the spec against the catalogues and price it; raises 422 problems.

    ``model_limits``: the service's model-size limits (default: the process settings)."""
    facts = facts_of(dataset)
    try:
        algorithm = get_algorithm(spec.algorithm.name)
    except UnknownAlgorithm:
        raise _invalid("unknown-algorithm", f"unknown algorithm '{spec.algorithm.name}'") from None
    try:
        model = get_model(spec.model.name)
    except UnknownModel:
        raise _invalid("unknown-model", f"unknown model '{spec.model.name}'") from None
    try:
        model_params = model.validate(spec.model.params, facts, limits=model_limits)
    except ModelIncompatible as exc:
        raise _invalid("model-incompatible", str(exc)) from None
    try:
        evaluation = plan_evaluation(spec.evaluation, facts) if spec.evaluation else None
        hyperparameters = algorithm.adopt_privacy_target(
            algorithm.validate_hyperparameters(spec.algorithm.hyperparameters),
            target_epsilon=spec.privacy.target_epsilon,
        )
        plan = algorithm.plan(
            hyperparameters,
            spec.training,
            facts,
            training_fraction=1.0 - (evaluation.holdout_fraction if evaluation else 0.0),
        )
    except (InvalidHyperparameters, InvalidEvaluation) as exc:
        raise _invalid("invalid-job-spec", str(exc)) from None
    except ArithmeticError as exc:  # a formula overflowed: the hyperparameters are out of range
        raise _invalid(
            "invalid-job-spec",
            f"the algorithm's formulas overflow for these hyperparameters ({type(exc).__name__}); "
            "choose values within the documented ranges",
        ) from None
    if plan.steps > max_steps:
        raise _invalid(
            "invalid-job-spec", f"the job would run {plan.steps} steps; the limit is {max_steps}"
        )
    limit = spec.training.time_limit_s
    if max_time_limit_s is not None and limit is not None and limit > max_time_limit_s:
        raise _invalid(
            "invalid-job-spec",
            f"training.time_limit_s {limit:g} is above the service's limit of {max_time_limit_s:g} s "
            "(with Redis it must stay below the broker's visibility timeout)",
        )
    delta = spec.privacy.delta if spec.privacy.delta is not None else dataset_delta
    if delta >= 1.0 / facts.n_rows:
        raise _invalid("invalid-job-spec", f"privacy.delta must be below 1/n = {format_remaining(1 / facts.n_rows)}")

    def event_for_sigma(noise_multiplier: float) -> PrivacyEvent:
        return compose_job_event(
            plan, evaluation, noise_multiplier=noise_multiplier, steps=plan.steps, evaluated=True
        )

    if spec.privacy.noise_multiplier is not None:
        sigma = spec.privacy.noise_multiplier
    else:
        assert spec.privacy.target_epsilon is not None
        try:
            sigma = privacy.calibrate_noise_multiplier(
                event_for_sigma, target_epsilon=spec.privacy.target_epsilon, delta=delta
            )
        except privacy.CalibrationError as exc:
            raise _invalid("calibration-failed", str(exc)) from None
    try:
        event = event_for_sigma(sigma)
        curve = privacy.rdp_curve(event)
    except privacy.PrivacyEventError as exc:
        raise _invalid("invalid-job-spec", f"the job's privacy cost cannot be computed: {exc}") from None
    normalised = spec.model_dump(mode="json")
    normalised["model"]["params"] = model_params
    normalised["algorithm"]["hyperparameters"] = hyperparameters.model_dump(mode="json")
    normalised["privacy"]["delta"] = delta
    return JobPlan(
        spec=normalised,
        algorithm=algorithm,
        model_name=model.name,
        plan=plan,
        evaluation=evaluation,
        noise_multiplier=sigma,
        delta=delta,
        event_json=privacy.event_to_json(event),
        curve=curve,
        epsilon_ledger=privacy.ledger_epsilon(curve, delta),
        epsilon_prv=(tight := privacy.single_job_epsilon(
            event, delta, zcdp_is_gaussian=algorithm.zcdp_leaves_are_gaussian, numeric=False
        )).epsilon,
        epsilon_prv_method=tight.method,
    )


def rebuild_plan(
    stored_spec: dict[str, Any], algorithm_name: str, dataset: Dataset
) -> tuple[PrivacyPlan, EvaluationPlan | None]:
    """The plan of an admitted job, from its stored (normalised) spec and the dataset's facts.

    The worker uses it to check that what it runs is what was charged; the HTML report to redraw
    ε against steps. The stored spec already holds every default the planner filled in.
    """
    facts = facts_of(dataset)
    evaluation_spec = stored_spec.get("evaluation")
    evaluation = (
        plan_evaluation(EvaluationSpec.model_validate(evaluation_spec), facts) if evaluation_spec else None
    )
    algorithm = get_algorithm(algorithm_name)
    hyperparameters = algorithm.validate_hyperparameters(stored_spec["algorithm"]["hyperparameters"])
    training = TrainingSpec.model_validate(stored_spec["training"])
    plan = algorithm.plan(
        hyperparameters, training, facts,
        training_fraction=1.0 - (evaluation.holdout_fraction if evaluation else 0.0),
    )
    return plan, evaluation
