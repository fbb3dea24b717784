"""A tuning's price: every configuration of its pool planned as a job, and one ledger event for all.

Each trial is one configuration of the pool, chosen at random, run as the job its spec describes
(training and its DP hold-out metric: the candidate's whole event). The tuning's event is
Papernot-Steinke's bound for releasing the best of K ~ D trials (kernel/privacy/tuning.py), over the
pointwise maximum of the candidates' curves: it is what the ledger reserves and commits, whatever K
turns out to be. The worker re-derives every candidate from the stored spec and refuses a job
whose event differs (:func:`rebuild_candidates`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from kernel import privacy
from kernel.db.orm import Dataset
from kernel.errors import InvalidInput
from kernel.jobs.planning import JobPlan, RebuiltJob, compose_job_event, rebuild_job
from kernel.privacy import HyperparameterTuningEvent, PoissonTrials, TrialDistribution, TruncatedNegativeBinomial
from kernel.privacy.curves import add_curves, max_curves, zero_curve
from kernel.privacy.events import BoundedPoissonTrials, BoundedTrialDistribution, BoundedTruncatedNegativeBinomial
from kernel.privacy.tuning import bounded_for_mean
from kernel.schemas.jobs import JobCreate
from kernel.schemas.stored_spec import (
    StoredCandidate,
    StoredJobSpec,
    StoredSchedule,
    StoredSearchRange,
    StoredSelection,
    StoredTrials,
    StoredTuning,
    parse_stored_spec,
    stored_spec,
)
from kernel.schemas.tuning import TrialsSpec, TuningCreate
from kernel.tuning.search_space import Assignment, apply, candidate_pool

DEFAULT_ETA: Final[float] = 0.0
"""The logarithmic distribution: for the same mean, its bound is the lowest of the η Papernot and
Steinke recommend when the trials are costly (docs/tuning.md)."""
METRIC_DIRECTIONS: Final[dict[str, Literal["max", "min"]]] = {"accuracy": "max", "mse": "min", "perplexity": "min"}


def _invalid(detail: str, slug: str = "invalid-tuning-spec") -> InvalidInput:
    return InvalidInput(slug=slug, detail=detail)


@dataclass(frozen=True)
class TuningLimits:
    """The service's settings a tuning is planned under (frozen into its schedule at admission)."""

    max_trials: int
    """PRIVTRAIN_TUNING_MAX_TRIALS: the largest public maximum of K, i.e. of slots."""
    slot_margin_s: float
    """PRIVTRAIN_TUNING_SLOT_MARGIN_S: a slot lasts the trial time limit plus this."""
    parallel_slots: int
    """PRIVTRAIN_TUNING_PARALLEL_TRIALS: at most this many of a tuning's slots run at once."""
    max_slot_seconds: float
    """PRIVTRAIN_JOB_TIME_LIMIT_S: one slot is one task, which may not run longer."""


def distribution_for(trials: TrialsSpec, *, max_trials: int) -> BoundedTrialDistribution:
    """The trial-count distribution a request names: conditioned on K <= its public maximum (given,
    or the default of :func:`kernel.privacy.tuning.default_maximum`), with E[K] = its mean."""
    if trials.maximum is not None and trials.maximum > max_trials:
        raise _invalid(
            f"trials.maximum {trials.maximum} is above this service's limit of {max_trials} "
            "(PRIVTRAIN_TUNING_MAX_TRIALS): every possible trial is a slot of worker time"
        )
    return bounded_for_mean(
        trials.distribution,
        mean=trials.mean,
        maximum=trials.maximum,
        cap=max_trials,
        eta=DEFAULT_ETA if trials.eta is None else trials.eta,
    )


def stored_trials(distribution: TrialDistribution) -> StoredTrials:
    """The public description stored with the tuning (and shown in its view)."""
    maximum = getattr(distribution, "maximum", None)
    bound = {} if maximum is None else {"maximum": maximum}
    mean = privacy.expected_trials(distribution)
    if isinstance(distribution, (PoissonTrials, BoundedPoissonTrials)):
        return StoredTrials(distribution="poisson", parameters={"mean": distribution.mean}, **bound, mean=mean)
    assert isinstance(distribution, (TruncatedNegativeBinomial, BoundedTruncatedNegativeBinomial))
    return StoredTrials(
        distribution="truncated-negative-binomial",
        parameters={"eta": distribution.eta, "gamma": distribution.gamma},
        **bound,
        mean=mean,
    )


def distribution_from_stored(stored: StoredTrials) -> TrialDistribution:
    parameters, maximum = stored.parameters, stored.maximum
    if stored.distribution == "poisson":
        mean = float(parameters["mean"])
        return PoissonTrials(mean=mean) if maximum is None else BoundedPoissonTrials(mean=mean, maximum=int(maximum))
    eta, gamma = float(parameters["eta"]), float(parameters["gamma"])
    if maximum is None:
        return TruncatedNegativeBinomial(eta=eta, gamma=gamma)
    return BoundedTruncatedNegativeBinomial(eta=eta, gamma=gamma, maximum=int(maximum))


def schedule_for(request: TuningCreate, *, slots: int, limits: TuningLimits) -> StoredSchedule:
    """The tuning's public slots: one per possible trial, each the trial time limit plus a margin
    long. The base spec must bound a trial's time: every slot lasts that long whatever it held."""
    limit = request.base.training.time_limit_s
    if limit is None:
        raise _invalid(
            "a tuning runs every possible trial in a slot of fixed length, so that its running time does not "
            "tell how many trials it drew: give base.training.time_limit_s, a bound on one trial's duration "
            "(a trial still training then releases nothing); run one configuration as an ordinary job to see "
            "how long a trial takes",
            "tuning-needs-time-limit",
        )
    slot_seconds = limit + limits.slot_margin_s
    if slot_seconds > limits.max_slot_seconds:
        raise _invalid(
            f"a slot would last {slot_seconds:g} s (base.training.time_limit_s {limit:g} + a margin of "
            f"{limits.slot_margin_s:g} s), above this service's limit of {limits.max_slot_seconds:g} s for one task"
        )
    return StoredSchedule(
        slots=slots, trial_time_limit_s=limit, slot_seconds=slot_seconds, parallel_slots=limits.parallel_slots
    )


@dataclass(frozen=True)
class TrialPlan:
    assignment: Assignment
    plan: JobPlan


@dataclass(frozen=True)
class TuningPlan:
    carrier: JobPlan
    """The job that runs the trials: candidate 0's plan with the tuning's spec, event and charge."""
    trials: tuple[TrialPlan, ...]
    distribution: TrialDistribution
    epsilon_one_trial: float
    """The costliest candidate, run once as an ordinary job."""
    epsilon_separate_jobs: float
    """⌈E[K]⌉ runs of the costliest candidate as separate jobs, composed."""


def tuning_event(distribution: TrialDistribution, trial_events: list[dict[str, Any]]) -> HyperparameterTuningEvent:
    return HyperparameterTuningEvent(
        distribution=distribution, candidates=tuple(privacy.event_from_json(event) for event in trial_events)
    )


def _plan_candidate(
    request: TuningCreate, assignment: Assignment, plan_candidate: Callable[[JobCreate], JobPlan]
) -> JobPlan:
    spec_json = apply(request.base.model_dump(mode="json", exclude_none=True), assignment)
    try:
        spec = JobCreate.model_validate(spec_json)
    except ValueError as exc:
        raise _invalid(f"the configuration {assignment} is not a valid job spec: {exc}") from None
    try:
        return plan_candidate(spec)
    except InvalidInput as exc:
        raise InvalidInput(
            slug=exc.slug, detail=f"the configuration {assignment}: {exc.detail}", extra=exc.extra
        ) from None


def plan_tuning(
    request: TuningCreate,
    dataset: Dataset,
    *,
    plan_candidate: Callable[[JobCreate], JobPlan],
    rng: random.Random,
    limits: TuningLimits,
) -> TuningPlan:
    """Validate the request, draw its pool (``rng``: public randomness) and price the whole tuning;
    ``plan_candidate`` prices one job spec on ``dataset`` (kernel.jobs.planning.plan_job with the
    service's limits)."""
    if dataset.public:
        raise _invalid(
            "a public dataset has no budget to protect: run its trials as ordinary jobs and compare them",
            "tuning-on-public-dataset",
        )
    if request.base.evaluation is None:
        raise _invalid(
            "the trials are compared by a DP hold-out metric: give the base spec an evaluation block "
            '(e.g. {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5})',
            "tuning-needs-evaluation",
        )
    try:
        distribution = distribution_for(request.trials, max_trials=limits.max_trials)
    except privacy.PrivacyEventError as exc:
        raise _invalid(f"trials: {exc}") from None
    schedule = schedule_for(request, slots=distribution.maximum, limits=limits)
    pool = candidate_pool(request.search_space, size=request.candidates, rng=rng)
    trials = tuple(
        TrialPlan(assignment=assignment, plan=_plan_candidate(request, assignment, plan_candidate))
        for assignment in pool
    )
    for trial in trials:
        evaluation = trial.plan.evaluation
        assert evaluation is not None  # the base has an evaluation block, and the search space cannot remove it
        if evaluation.metric != request.selection.metric:
            raise _invalid(
                f"selection.metric {request.selection.metric} is not the metric the base's evaluation releases "
                f"on this dataset ({evaluation.metric}); select by {evaluation.metric}"
            )
    event = tuning_event(distribution, [trial.plan.event_json for trial in trials])
    try:
        curve = privacy.rdp_curve(event)
    except privacy.PrivacyEventError as exc:
        raise _invalid(f"the tuning's privacy cost cannot be computed: {exc}") from None
    delta = trials[0].plan.delta
    worst = max_curves(trial.plan.curve for trial in trials)
    separate = math.ceil(privacy.expected_trials(distribution))
    epsilon_one_trial = privacy.ledger_epsilon(worst, delta)
    epsilon_separate_jobs = privacy.ledger_epsilon(_scaled(worst, separate), delta)
    first = trials[0].plan
    tuning = StoredTuning(
        search_space={
            path: values if isinstance(values, list) else StoredSearchRange(**values.model_dump())
            for path, values in request.search_space.items()
        },
        trials=stored_trials(distribution),
        schedule=schedule,
        selection=StoredSelection(metric=request.selection.metric, goal=METRIC_DIRECTIONS[request.selection.metric]),
        epsilon_one_trial=epsilon_one_trial,
        epsilon_separate_jobs=epsilon_separate_jobs,
        candidates=[
            StoredCandidate(
                assignment=trial.assignment,
                spec=stored_spec(trial.plan),
                noise_multiplier=trial.plan.noise_multiplier,
                sampling_probability=trial.plan.plan.sampling_probability,
                steps=trial.plan.plan.steps,
                epsilon_ledger=trial.plan.epsilon_ledger,
            )
            for trial in trials
        ],
    )
    carrier = dataclasses.replace(
        first,
        spec=stored_spec(first).with_tuning(tuning).to_json(),
        event_json=privacy.event_to_json(event),
        curve=curve,
        epsilon_ledger=privacy.ledger_epsilon(curve, delta),
        epsilon_prv=None,
        epsilon_prv_method=None,
    )
    return TuningPlan(
        carrier=carrier,
        trials=trials,
        distribution=distribution,
        epsilon_one_trial=epsilon_one_trial,
        epsilon_separate_jobs=epsilon_separate_jobs,
    )


def _scaled(curve: tuple[float, ...], times: int) -> tuple[float, ...]:
    total = zero_curve()
    for _ in range(times):
        total = add_curves(total, curve)
    return total


@dataclass(frozen=True)
class RebuiltCandidate:
    """One configuration of an admitted tuning, re-derived from its stored spec."""

    stored: StoredCandidate
    rebuilt: RebuiltJob

    @property
    def assignment(self) -> Assignment:
        return dict(self.stored.assignment)

    @property
    def noise_multiplier(self) -> float:
        return self.stored.noise_multiplier

    @property
    def spec(self) -> dict[str, Any]:
        """The candidate's spec as stored (the dict a job row of it holds)."""
        return self.stored.spec.to_json()

    @property
    def steps(self) -> int:
        return self.rebuilt.plan.steps

    @property
    def sampling_probability(self) -> float:
        return self.rebuilt.plan.sampling_probability

    def event_json(self) -> dict[str, Any]:
        return privacy.event_to_json(
            compose_job_event(
                self.rebuilt.plan,
                self.rebuilt.evaluation,
                noise_multiplier=self.noise_multiplier,
                steps=self.steps,
                evaluated=True,
            )
        )


def is_tuning(spec: StoredJobSpec | Mapping[str, Any]) -> bool:
    """Whether a stored spec (typed, or the dict a job row holds) is a tuning's."""
    return (spec if isinstance(spec, StoredJobSpec) else parse_stored_spec(spec)).is_tuning


def rebuild_candidates(
    spec: StoredJobSpec | Mapping[str, Any], algorithm: str, dataset: Dataset, charged_event: dict[str, Any]
) -> tuple[TrialDistribution, tuple[RebuiltCandidate, ...]]:
    """Every stored candidate re-validated and re-planned; raises when their tuning event is not the
    one the job was charged (the worker then refuses the job). ``spec``: the tuning job's stored
    spec, typed or the dict its row holds."""
    tuning = (spec if isinstance(spec, StoredJobSpec) else parse_stored_spec(spec)).tuning
    if tuning is None:
        raise RuntimeError("the job is not a tuning")
    distribution = distribution_from_stored(tuning.trials)
    candidates = []
    for stored in tuning.candidates:
        rebuilt = rebuild_job(stored.spec, algorithm, dataset)
        if rebuilt.plan.steps != stored.steps:
            raise RuntimeError("a candidate's steps differ from its re-derived plan")
        candidates.append(RebuiltCandidate(stored=stored, rebuilt=rebuilt))
    event = tuning_event(distribution, [candidate.event_json() for candidate in candidates])
    if privacy.event_to_json(event) != charged_event:
        raise RuntimeError("the tuning's stored event differs from its re-derived candidates")
    return distribution, tuple(candidates)
