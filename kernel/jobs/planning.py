"""Turn a validated job spec and a dataset's public facts into a priced plan.

Shared by ``/v1/jobs/estimate`` (dry run) and ``/v1/jobs`` (admission): the same function
decides σ, the privacy event and its RDP curve, so an estimate is exactly what a submit charges.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from algorithms import (
    ALGORITHMS,
    AlgorithmDefinition,
    InvalidHyperparameters,
    MissingTrainingFields,
    PrivacyPlan,
    UnknownAlgorithm,
    get_algorithm,
)
from kernel import privacy, suggestions
from kernel.base_models.init import InitSource, check_init_fits, dataset_classes, head_is_new
from kernel.datasets.facts import DatasetFacts
from kernel.datasets.stored_facts import facts_of
from kernel.db.orm import Dataset, PrivacyBudget
from kernel.errors import InvalidInput
from kernel.jobs.evaluation import EvaluationPlan, InvalidEvaluation, plan_evaluation
from kernel.ledger import operations as ledger
from kernel.model_catalogue import (
    MODELS,
    ModelDefinition,
    ModelIncompatible,
    ModelSizeLimits,
    UnknownModel,
    get_model,
)
from kernel.privacy import PrivacyEvent
from kernel.privacy.admissible import (
    FilterState,
    largest_admissible_steps,
    linear_steps_guess,
    smallest_admissible_noise_multiplier,
)
from kernel.privacy.calibration import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER
from kernel.privacy.orders import Curve
from kernel.privacy.ranges import NOISE_MULTIPLIER_MAX, NOISE_MULTIPLIER_MIN
from kernel.schemas.jobs import JobCreate, TrainingSpec
from kernel.schemas.stored_spec import StoredJobSpec, admitted_spec, parse_stored_spec
from privtrain_common.directed_rounding import format_remaining


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
    algorithm: AlgorithmDefinition[Any]
    model_name: str
    hyperparameters: BaseModel
    """As the catalogue validated them (defaults and the privacy target filled in)."""
    training: TrainingSpec
    """As the algorithm accepted it (unused fields refused, a full-batch batch_size filled in)."""
    plan: PrivacyPlan
    evaluation: EvaluationPlan | None
    noise_multiplier: float
    delta: float
    event_json: dict[str, Any]
    curve: tuple[float, ...]
    epsilon_ledger: float
    epsilon_prv: float | None
    epsilon_prv_method: str | None = None
    """Which single-job method gave ``epsilon_prv`` (kernel.privacy.single_job.METHODS)."""
    public_dataset: bool = False
    """The dataset was declared public: the job reserves and commits nothing (zero curve, ε 0)."""

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


@dataclass(frozen=True)
class JobChoices:
    """What an estimate offers besides the price: what would remain, and the nearest specs that fit.

    Every number is the filter's own answer for the budget as it stands (committed + reserved).
    """

    remaining_after_epsilon: float | None
    largest_admissible_epsilon: float
    smallest_admissible_noise_multiplier: float | None
    smallest_admissible_noise_multiplier_reason: str | None
    largest_admissible_steps: int | None
    largest_admissible_steps_reason: str | None


def filter_state(budget: PrivacyBudget) -> FilterState:
    """The budget's filter as the ledger sees it (the same curves ``ledger.check_admissible`` uses)."""
    return FilterState(
        committed=tuple(budget.committed),
        reserved=tuple(budget.reserved),
        capacity=ledger.capacity(budget.epsilon, budget.delta),
    )


def _computable(build: Callable[[], PrivacyEvent]) -> Curve | None:
    """The event's curve, or None where its RDP overflows (a cost the filter could never admit)."""
    try:
        return privacy.rdp_curve(build())
    except privacy.PrivacyEventError:
        return None


def _smallest_sigma(job: JobPlan, state: FilterState) -> float | None:
    """Smallest σ admitted now for the job's steps, searched over calibration's whole range.

    Admission is monotone in σ for every algorithm of the catalogue (each event's RDP falls as its
    noise grows), so a bisection in log σ finds the boundary.
    """
    return smallest_admissible_noise_multiplier(
        cost_of_sigma=lambda sigma: _computable(lambda: job.event_for_sigma(sigma)),
        state=state,
        low=MIN_NOISE_MULTIPLIER,
        high=MAX_NOISE_MULTIPLIER,
    )


def _ledger_epsilon_at(job: JobPlan, sigma: float | None) -> float:
    """The largest target ε the spec could be given and still be admitted: the ledger ε of the
    smallest admitted σ (the target that calibrates to it); 0 when no σ ≤ 1e6 fits."""
    if sigma is None:
        return 0.0
    return privacy.RdpAccountant().compose(job.event_for_sigma(sigma)).epsilon(job.delta)


def _accepted_sigma(sigma: float | None, job: JobPlan) -> tuple[float | None, str | None]:
    """The smallest admitted σ a spec may name (within the validated range), or why there is none."""
    if sigma is None or sigma > NOISE_MULTIPLIER_MAX:
        what = f"{job.plan.steps} steps" + ("" if job.evaluation is None else " with the evaluation")
        return None, (
            f"no noise multiplier up to {NOISE_MULTIPLIER_MAX:g} (the largest accepted) lets "
            f"{what} fit the remaining budget"
        )
    return max(sigma, NOISE_MULTIPLIER_MIN), None


def _largest_steps(job: JobPlan, state: FilterState, *, max_steps: int) -> tuple[int | None, str | None]:
    """The most steps at the job's σ that fit now (at most ``max_steps``), or why there is none."""
    charge = job.algorithm.steps_charge
    if not charge.composes:
        return None, charge.reason

    def cost_of_steps(steps: int) -> Curve | None:
        return _computable(
            lambda: compose_job_event(
                job.plan, job.evaluation, noise_multiplier=job.noise_multiplier, steps=steps, evaluated=True
            )
        )

    without_steps = cost_of_steps(0)
    guess = (
        None
        if without_steps is None
        else linear_steps_guess(cost_without_steps=without_steps, cost_at=job.curve, steps=job.plan.steps, state=state)
    )
    steps = largest_admissible_steps(cost_of_steps=cost_of_steps, state=state, max_steps=max_steps, guess=guess)
    if steps is None:
        what = "one step" if job.evaluation is None else "one step with the evaluation"
        return None, f"not even {what} at σ = {job.noise_multiplier:g} fits the remaining budget"
    return steps, None


def job_choices(job: JobPlan, budget: PrivacyBudget, *, max_steps: int) -> JobChoices:
    """The estimate's choices for ``job`` against ``budget`` now; bounded: a bisection in σ (at
    most 27 closed-form curves) and a search in steps (a few from a linear guess, at most
    2·log2(max_steps) + 2)."""
    state = filter_state(budget)
    smallest = _smallest_sigma(job, state)
    sigma, sigma_reason = _accepted_sigma(smallest, job)
    steps, steps_reason = _largest_steps(job, state, max_steps=max_steps)
    return JobChoices(
        remaining_after_epsilon=state.remaining_epsilon_after(job.curve, delta=budget.delta),
        largest_admissible_epsilon=_ledger_epsilon_at(job, smallest),
        smallest_admissible_noise_multiplier=sigma,
        smallest_admissible_noise_multiplier_reason=sigma_reason,
        largest_admissible_steps=steps,
        largest_admissible_steps_reason=steps_reason,
    )


FIELDS_ADDED_LATER: tuple[tuple[str, str], ...] = (
    ("model", "init"),
    ("training", "finetune"),
    ("training", "finetune_k"),
    ("training", "ema_decay"),
    ("training", "augmult"),
    ("training", "precision"),
    ("training", "rows_per_unit"),
    ("training", "lora"),
    ("training", "token_loss"),
    ("evaluation", "loss_clip"),
)
"""Spec fields newer than stored Idempotency-Key digests: left out of the digest while unset, so a
retry of a job submitted before they existed still matches its first attempt."""
SECTIONS_ADDED_LATER: tuple[str, ...] = ("resources",)
"""Top-level spec sections newer than stored digests, left out the same way while unset."""


def request_hash(spec: JobCreate) -> str:
    """The digest an Idempotency-Key retry must match (canonical JSON of the validated spec)."""
    body = spec.model_dump(mode="json")
    for section, field in FIELDS_ADDED_LATER:
        part = body.get(section)
        if isinstance(part, dict) and part.get(field) is None:
            part.pop(field, None)
    for section in SECTIONS_ADDED_LATER:
        if body.get(section) is None:
            body.pop(section, None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _invalid(slug: str, detail: str) -> InvalidInput:
    return InvalidInput(slug=slug, detail=detail)


PUBLIC_JOB_DELTA = 1e-5


def public_job_delta(n_rows: int) -> float:
    """δ of a DP mechanism run on a public dataset when the spec names none: it calibrates the
    noise only (nothing is charged), so any value below 1/n serves; min(1e-5, 0.1/n)."""
    return min(PUBLIC_JOB_DELTA, 0.1 / n_rows)


def _check_init(
    spec: JobCreate,
    init: InitSource | None,
    *,
    model_name: str,
    model_params: dict[str, Any],
    facts: DatasetFacts,
    params_from_init: bool = False,
    body_from: frozenset[str] = frozenset(),
) -> None:
    """``model.init`` was resolved by the caller and must fit; ``training.finetune`` needs one."""
    if (spec.model.init is None) != (init is None):
        raise AssertionError("model.init must be resolved by the caller before planning")
    if init is None:
        if spec.training.finetune is not None:
            raise _invalid("invalid-job-spec", "training.finetune needs model.init (the weights to fine-tune)")
        return
    if params_from_init:  # the model took its params from the weights and checked the rows itself
        return
    check_init_fits(
        init, architecture=model_name, params=model_params, input_shape=facts.feature_shape, body_from=body_from
    )


def _check_augmult_fits_dataset(spec: JobCreate, dataset: Dataset) -> None:
    """Augmented views are crops and flips of images: a dataset of other rows has none to make."""
    if spec.training.augmult is not None and dataset.modality != "image":
        raise _invalid(
            "augmult-needs-images",
            f"training.augmult: augmentation multiplicity makes cropped and flipped views of images, and "
            f"dataset {dataset.id} holds {dataset.modality or 'tabular'} rows; leave it out for this dataset",
        )


DEFAULT_ROWS_PER_UNIT = 4
"""A sampled unit's gradient is the mean of this many of its rows unless the spec says otherwise."""


def _check_privacy_unit(spec: JobCreate, algorithm: AlgorithmDefinition[Any], facts: DatasetFacts) -> None:
    """A dataset's privacy unit is fixed at upload: its jobs train per unit, and no field of a job
    can make them train per row (the spec has none); algorithms that cannot are refused."""
    if not facts.unit_level:
        if spec.training.rows_per_unit is not None:
            raise _invalid(
                "rows-per-unit-needs-privacy-units",
                "training.rows_per_unit applies to datasets with a privacy unit column (privacy_unit_column at "
                "upload), and this dataset's privacy unit is one row; leave it out",
            )
        return
    if not algorithm.privacy_units:
        supported = ", ".join(name for name in ALGORITHMS.names() if get_algorithm(name).privacy_units)
        raise _invalid(
            "privacy-unit-unsupported",
            f"this dataset's privacy unit is one {facts.privacy_unit_column} and all its rows, and algorithm "
            f"'{algorithm.name}' bounds each row's contribution, not each unit's; choose one that trains per "
            f"unit: {supported}",
        )


def with_unit_defaults(training: TrainingSpec, facts: DatasetFacts) -> TrainingSpec:
    """``rows_per_unit`` filled in on a privacy unit dataset, so the stored spec says what ran."""
    if facts.unit_level and training.rows_per_unit is None:
        return training.model_copy(update={"rows_per_unit": DEFAULT_ROWS_PER_UNIT})
    return training


def _check_task_fits(spec: JobCreate, algorithm: AlgorithmDefinition[Any], facts: DatasetFacts) -> None:
    """The algorithm and ``training.token_loss`` must make sense for the dataset's task (``evaluation``
    fields are checked against it by :func:`kernel.jobs.evaluation.plan_evaluation`)."""
    if facts.task not in algorithm.tasks:
        raise _invalid(
            "algorithm-unsupported-for-task",
            f"algorithm '{algorithm.name}' trains on {', '.join(sorted(algorithm.tasks))} datasets, and this "
            f"dataset's task is {facts.task}; choose a per-sample-gradient algorithm (e.g. dp-sgd, dp-adam, dicesgd)",
        )
    if spec.training.token_loss is not None and facts.task != "language-model":
        raise _invalid(
            "token-loss-needs-language-model",
            f"training.token_loss: a row's loss over its tokens applies to language-model datasets, and this "
            f"dataset's task is {facts.task}; leave it out",
        )


def _check_algorithm_trains_model(algorithm: AlgorithmDefinition[Any], model: ModelDefinition) -> None:
    """Some families train one model shape only (the heavy-tailed family: one linear layer)."""
    if algorithm.models is not None and model.name not in algorithm.models:
        raise _invalid(
            "model-incompatible",
            f"algorithm '{algorithm.name}' trains {' or '.join(sorted(algorithm.models))} only, not "
            f"'{model.name}'; choose one of those models, or a per-sample-gradient algorithm (e.g. dp-sgd) "
            f"for '{model.name}'",
        )


def _check_lora_fits_model(spec: JobCreate, model: ModelDefinition) -> None:
    """LoRA goes on models with attention: the zoo's transformers (the service's own adapters) and the
    `hf` models (PEFT's)."""
    if spec.training.finetune == "lora" and not model.lora:
        with_lora = ", ".join(name for name in MODELS.names() if get_model(name).lora)
        raise _invalid(
            "lora-unsupported-model",
            f"training.finetune lora puts adapters on the attention (and MLP) Linear layers of "
            f"{with_lora}; model '{model.name}' does not take them",
        )


def _check_privacy_fits_dataset(spec: JobCreate, algorithm: AlgorithmDefinition[Any], dataset: Dataset) -> None:
    """Non-private optimizers run on public datasets only; DP algorithms need a privacy block."""
    if not algorithm.private and not dataset.public:
        raise _invalid(
            "non-private-on-private-data",
            f"algorithm '{algorithm.name}' is not differentially private and runs only on datasets "
            "their owner declared public; choose a DP algorithm (e.g. dp-sgd) for this dataset",
        )
    if not algorithm.private and spec.privacy is not None:
        raise _invalid(
            "invalid-job-spec",
            f"privacy: algorithm '{algorithm.name}' is not private and takes no privacy block; leave it out",
        )
    if algorithm.private and spec.privacy is None:
        raise _invalid(
            "invalid-job-spec",
            f"privacy: algorithm '{algorithm.name}' is differentially private and needs privacy.target_epsilon "
            "or privacy.noise_multiplier",
        )


def plan_job(
    spec: JobCreate,
    dataset: Dataset,
    *,
    dataset_delta: float,
    max_steps: int,
    max_time_limit_s: float | None = None,
    model_limits: ModelSizeLimits | None = None,
    init: InitSource | None = None,
) -> JobPlan:
    """Validate the spec against the catalogues and price it; raises :class:`kernel.errors.InvalidInput`.

    ``model_limits``: the service's model-size limits (default: the process settings). ``init``:
    ``spec.model.init`` resolved by the caller (kernel.base_models.init); it must fit the model, and
    changes nothing in the price (the starting weights are treated as public)."""
    facts = facts_of(dataset)
    try:
        algorithm = get_algorithm(spec.algorithm.name)
    except UnknownAlgorithm:
        raise _invalid(
            "unknown-algorithm",
            suggestions.unknown_name(kind="algorithm", name=spec.algorithm.name, known=ALGORITHMS.names()),
        ) from None
    try:
        model = get_model(spec.model.name)
    except UnknownModel:
        raise _invalid(
            "unknown-model", suggestions.unknown_name(kind="model", name=spec.model.name, known=MODELS.names())
        ) from None
    _check_privacy_fits_dataset(spec, algorithm, dataset)
    _check_augmult_fits_dataset(spec, dataset)
    _check_task_fits(spec, algorithm, facts)
    _check_privacy_unit(spec, algorithm, facts)
    _check_algorithm_trains_model(algorithm, model)
    _check_lora_fits_model(spec, model)
    misnamed_param = suggestions.unknown_field(given=spec.model.params, model=model.params_model, where="model.params")
    if misnamed_param:
        raise _invalid("model-incompatible", misnamed_param)
    misnamed_hyperparameter = suggestions.unknown_field(
        given=spec.algorithm.hyperparameters, model=algorithm.Hyperparameters, where="algorithm.hyperparameters"
    )
    if misnamed_hyperparameter:
        raise _invalid("invalid-job-spec", misnamed_hyperparameter)
    try:
        given = (
            None
            if init is None or init.architecture != model.name
            else model.params_from_init(spec.model.params, init.params)
        )
        model_params = model.validate(spec.model.params if given is None else given, facts, limits=model_limits)
    except ModelIncompatible as exc:
        raise _invalid("model-incompatible", str(exc)) from None
    _check_init(
        spec,
        init,
        model_name=model.name,
        model_params=model_params,
        facts=facts,
        params_from_init=given is not None,
        body_from=model.body_from,
    )
    if spec.training.finetune == "last_k_blocks" and spec.training.finetune_k is not None:
        model.check_finetune_k(model_params, spec.training.finetune_k)  # 422 finetune-k-out-of-range
    lora_trains_head = False
    if spec.training.lora is not None:
        try:
            lora_trains_head = model.check_lora(model_params, spec.training.lora.target_modules)
        except ModelIncompatible as exc:
            raise _invalid("lora-unsupported-model", str(exc)) from None
    try:
        evaluation = plan_evaluation(spec.evaluation, facts) if spec.evaluation else None
        hyperparameters = algorithm.adopt_privacy_target(
            algorithm.validate_hyperparameters(spec.algorithm.hyperparameters),
            target_epsilon=spec.privacy.target_epsilon if spec.privacy is not None else None,
        )
        training = with_unit_defaults(algorithm.accept_training(spec.training, facts), facts)
        plan = algorithm.plan(
            hyperparameters,
            training,
            facts,
            training_fraction=1.0 - (evaluation.holdout_fraction if evaluation else 0.0),
        )
    except MissingTrainingFields as exc:  # the request's own missing-field error, as before
        raise InvalidInput(
            slug="validation-error",
            detail=f"body.training.{exc.fields[0]}: Field required",
            extra={
                "errors": [
                    {"loc": ["body", "training", field], "msg": "Field required", "type": "missing"}
                    for field in exc.fields
                ]
            },
        ) from None
    except (InvalidHyperparameters, InvalidEvaluation) as exc:
        raise _invalid("invalid-job-spec", str(exc)) from None
    except ArithmeticError as exc:  # a formula overflowed: the hyperparameters are out of range
        raise _invalid(
            "invalid-job-spec",
            f"the algorithm's formulas overflow for these hyperparameters ({type(exc).__name__}); "
            "choose values within the documented ranges",
        ) from None
    if plan.steps > max_steps:
        raise _invalid("invalid-job-spec", f"the job would run {plan.steps} steps; the limit is {max_steps}")
    limit = spec.training.time_limit_s
    if max_time_limit_s is not None and limit is not None and limit > max_time_limit_s:
        raise _invalid(
            "invalid-job-spec",
            f"training.time_limit_s {limit:g} is above the service's limit of {max_time_limit_s:g} s "
            "(with Redis it must stay below the broker's visibility timeout)",
        )
    if spec.privacy is not None and spec.privacy.delta is not None:
        delta = spec.privacy.delta
    else:
        delta = public_job_delta(facts.n_rows) if dataset.public else dataset_delta
    if delta >= 1.0 / facts.n_privacy_units:
        raise _invalid(
            "invalid-job-spec", f"privacy.delta must be below 1/n = {format_remaining(1 / facts.n_privacy_units)}"
        )

    def event_for_sigma(noise_multiplier: float) -> PrivacyEvent:
        return compose_job_event(plan, evaluation, noise_multiplier=noise_multiplier, steps=plan.steps, evaluated=True)

    if spec.privacy is None:  # a non-private optimizer (checked above): no noise to choose
        sigma = 0.0
    elif spec.privacy.noise_multiplier is not None:
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
    start: dict[str, Any] | None = None
    if init is not None:  # where the weights start, as the report states it
        new_head = head_is_new(init, n_outputs=model.n_outputs(facts), classes=dataset_classes(dataset))
        # The service's own LoRA (and an LM's) freezes the head: a fresh one would stay random.
        if new_head and spec.training.finetune == "lora" and not lora_trains_head:
            raise _invalid(
                "lora-needs-the-init-head",
                "training.finetune lora trains only adapters and keeps the head frozen, but this dataset's "
                "outputs differ from the init's (another class list or output count), so the head would stay "
                "newly initialised; start from a model trained on the same classes, or use finetune full or "
                "last_k_blocks",
            )
        start = {**init.provenance, "new_head": new_head}
    normalised = admitted_spec(
        spec,
        params=model_params,
        hyperparameters=hyperparameters.model_dump(mode="json"),
        training=training,
        delta=delta,
        init=start,
    )
    if dataset.public:  # nothing is reserved or charged: the dataset has no budget
        charged_curve: tuple[float, ...] = tuple(0.0 for _ in curve)
        epsilon_ledger, epsilon_prv, epsilon_prv_method = 0.0, None, None
    else:
        tight = privacy.single_job_epsilon(
            event, delta, zcdp_is_gaussian=algorithm.zcdp_leaves_are_gaussian, numeric=False
        )
        charged_curve = curve
        epsilon_ledger = privacy.ledger_epsilon(curve, delta)
        epsilon_prv, epsilon_prv_method = tight.epsilon, tight.method
    return JobPlan(
        spec=normalised.to_json(),
        algorithm=algorithm,
        model_name=model.name,
        hyperparameters=hyperparameters,
        training=training,
        plan=plan,
        evaluation=evaluation,
        noise_multiplier=sigma,
        delta=delta,
        event_json=privacy.event_to_json(event),
        curve=charged_curve,
        epsilon_ledger=epsilon_ledger,
        epsilon_prv=epsilon_prv,
        epsilon_prv_method=epsilon_prv_method,
        public_dataset=dataset.public,
    )


@dataclass(frozen=True)
class RebuiltJob:
    """An admitted job re-derived from its stored spec: every part re-validated, none trusted."""

    plan: PrivacyPlan
    evaluation: EvaluationPlan | None
    hyperparameters: BaseModel
    training: TrainingSpec


def rebuild_job(spec: StoredJobSpec | Mapping[str, Any], algorithm_name: str, dataset: Dataset) -> RebuiltJob:
    """The plan of an admitted job, from its stored (normalised) spec and the dataset's facts,
    with the hyperparameters and training spec it was priced with (re-validated here). ``spec``:
    the typed view, or the dict a job row holds.

    The worker uses it to check that what it runs is what was charged, and trains with its
    hyperparameters; the HTML report redraws ε against steps. The stored spec already holds
    every default the planner filled in.
    """
    facts = facts_of(dataset)
    stored = spec if isinstance(spec, StoredJobSpec) else parse_stored_spec(spec)
    evaluation = None if stored.evaluation is None else plan_evaluation(stored.evaluation.validated(), facts)
    algorithm = get_algorithm(algorithm_name)
    hyperparameters = algorithm.validate_hyperparameters(stored.algorithm.hyperparameters)
    training = stored.training.validated()
    plan = algorithm.plan(
        hyperparameters,
        training,
        facts,
        training_fraction=1.0 - (evaluation.holdout_fraction if evaluation else 0.0),
    )
    return RebuiltJob(plan=plan, evaluation=evaluation, hyperparameters=hyperparameters, training=training)


def rebuild_plan(
    spec: StoredJobSpec | Mapping[str, Any], algorithm_name: str, dataset: Dataset
) -> tuple[PrivacyPlan, EvaluationPlan | None]:
    """The (plan, evaluation) part of :func:`rebuild_job`."""
    rebuilt = rebuild_job(spec, algorithm_name, dataset)
    return rebuilt.plan, rebuilt.evaluation
