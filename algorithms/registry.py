"""Registry of algorithm definitions (decorator-based; no if/elif factories)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from algorithms.errors import InvalidHyperparameters
from algorithms.steps_charges import StepsCharge
from algorithms.training_fields import (
    DEFAULT_TRAINING_FIELDS,
    ENGINE_OPTION_UNUSED_REASONS,
    accept_training,
    batch_size_of,
    training_schema,
)
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import GaussianEvent, PoissonSampledGaussianEvent, PrivacyEvent
from kernel.registry import Registry, UnknownName
from kernel.schemas.jobs import TrainingSpec

__all__ = [
    "ALGORITHMS",
    "AlgorithmDefinition",
    "H",
    "InvalidHyperparameters",
    "PoissonGaussianAlgorithm",
    "PrivacyPlan",
    "UnknownAlgorithm",
    "definition_of",
    "get_algorithm",
    "poisson_schedule",
    "register_algorithm",
    "subsampled_gaussian_steps",
]

UnknownAlgorithm = UnknownName

H = TypeVar("H", bound=BaseModel)
"""An algorithm's hyperparameters model: every method of its definition takes that type."""


@dataclass(frozen=True)
class PrivacyPlan:
    """Everything public about a job's mechanism except σ, which calibration chooses.

    ``event_for(σ, k)`` is the privacy event of the first k steps: the ledger charges
    ``event_for(σ, steps)`` at admission and ``event_for(σ, steps_run)`` for a cancelled run.
    """

    steps: int
    sampling_probability: float
    expected_batch_size: float
    sensitivity: float
    sampling: str
    event_for: Callable[[float, int], PrivacyEvent]
    sensitivity_norm: str = "l2"
    """What ``sensitivity`` bounds: "l2" for Gaussian sums (noise std σ·Δ on the sum);
    "score" for an exponential mechanism's utility score; "linf" for Laplace/Peeling releases."""

    def event(self, noise_multiplier: float) -> PrivacyEvent:
        return self.event_for(noise_multiplier, self.steps)


class AlgorithmDefinition(Generic[H]):
    """Base of every catalogue entry; subclasses set the class attributes and ``plan``.

    Generic in the hyperparameters model ``H``, so a definition's methods (and the worker's
    trainer of the same name) read typed fields without casts."""

    name: ClassVar[str]
    family: ClassVar[str]
    paper: ClassVar[str]
    summary: ClassVar[str]
    Hyperparameters: type[H]
    zcdp_leaves_are_gaussian: ClassVar[bool] = False
    """True only when every release behind the plan's ZCDPEvent leaves is Gaussian noise on a
    bounded-L2 sum: the report may then use the exact Gaussian-DP bound (kernel.privacy.single_job)."""
    training_fields: ClassVar[frozenset[str]] = DEFAULT_TRAINING_FIELDS
    """The ``training.*`` fields this algorithm reads; submitting any other is refused (422)."""
    unused_training_reasons: ClassVar[Mapping[str, str]] = ENGINE_OPTION_UNUSED_REASONS
    """Why each field outside ``training_fields`` is unused, completing '<name> … and does not use it'."""
    full_batch: ClassVar[bool] = False
    """Every step uses all n rows: the service records ``training.batch_size = n`` itself."""
    private: ClassVar[bool] = True
    """False for the non-private optimizers (algorithms.non_private.definition): public datasets only."""
    tasks: ClassVar[frozenset[str]] = frozenset({"classification", "regression", "language-model"})
    """The dataset tasks this algorithm trains on; submission refuses the others (422)."""
    clips_per_sample: ClassVar[bool] = False
    """Bounds each row's (unit's) gradient with a per-sample map (clipping, normalisation): its report
    states what the floating-point clipping bound covers (docs/privacy-model.md#clipping-in-floating-point)."""
    privacy_units: ClassVar[bool] = False
    """Trains on datasets whose privacy unit is a person (a privacy unit column): samples units and
    bounds each unit's contribution. The others are refused there (422 privacy-unit-unsupported)."""
    steps_charge: ClassVar[StepsCharge]
    """How ``training.steps`` enters the charge (algorithms/steps_charges.py): declared by every
    entry (registration refuses one without), read by the estimate's largest-steps search."""
    models: ClassVar[frozenset[str] | None] = None
    """The catalogue models this algorithm can train (None: any); submission refuses the others
    (422 model-incompatible), so the worker's own check of the built model never refuses a job."""

    def validate_hyperparameters(self, raw: dict[str, Any]) -> H:
        try:
            return self.Hyperparameters.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(part) for part in first["loc"])
            raise InvalidHyperparameters(f"algorithm.hyperparameters.{loc}: {first['msg']}") from exc

    def adopt_privacy_target(self, hyperparameters: H, *, target_epsilon: float | None) -> H:
        """Hyperparameters whose public defaults depend on the job's target ε (a public part of
        the spec) get it here, before planning; most algorithms have none."""
        return hyperparameters

    def accept_training(self, training: TrainingSpec, facts: DatasetFacts) -> TrainingSpec:
        """The submitted training spec as this algorithm runs it: fields it does not read are
        refused (UnusedTrainingField), the ones it reads required (MissingTrainingFields), and a
        full-batch algorithm's ``batch_size`` is the dataset's public n (of rows, or of privacy
        units on a dataset with a privacy unit column: every step then uses every unit)."""
        return accept_training(
            training,
            algorithm=self.name,
            reads=self.training_fields,
            unused_reasons=self.unused_training_reasons,
            full_batch_rows=facts.n_privacy_units if self.full_batch else None,
        )

    def plan(
        self,
        hyperparameters: H,
        training: TrainingSpec,
        facts: DatasetFacts,
        *,
        training_fraction: float = 1.0,
    ) -> PrivacyPlan:
        """The mechanism for training on the rows not held out (expected (1 − f)·n of them)."""
        raise NotImplementedError

    def report_notes(
        self,
        hyperparameters: H,
        plan: PrivacyPlan,
        *,
        noise_multiplier: float,
        delta: float,
    ) -> dict[str, Any]:
        """Algorithm-specific sections of the privacy report (e.g. a paper's claimed number,
        always labelled); the default has none."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "paper": self.paper,
            "summary": self.summary,
            "hyperparameters_schema": self.Hyperparameters.model_json_schema(),
            "defaults": self.Hyperparameters().model_dump(mode="json"),
            "training_fields": sorted(self.training_fields),
            "full_batch": self.full_batch,
            "private": self.private,
            "tasks": sorted(self.tasks),
            "privacy_units": self.privacy_units,
            "training_schema": training_schema(self.training_fields),
        }


ALGORITHMS: Registry[AlgorithmDefinition[Any]] = Registry("algorithm")
get_algorithm = ALGORITHMS.get

D = TypeVar("D", bound=AlgorithmDefinition[Any])


def register_algorithm(cls: type[D]) -> type[D]:
    """Class decorator: one instance of each definition is registered under its ``name``."""
    if not isinstance(getattr(cls, "steps_charge", None), StepsCharge):
        raise TypeError(f"algorithm '{cls.name}' declares no steps_charge (algorithms/steps_charges.py)")
    ALGORITHMS.add(cls.name, cls())
    return cls


def definition_of(cls: type[D]) -> D:
    """The registered instance of a catalogue class, typed as that class (for the worker's trainers)."""
    entry = ALGORITHMS.get(cls.name)
    if not isinstance(entry, cls):
        raise TypeError(f"algorithm '{cls.name}' is registered as {type(entry).__name__}, not {cls.__name__}")
    return entry


def poisson_schedule(
    training: TrainingSpec, facts: DatasetFacts, *, training_fraction: float = 1.0
) -> tuple[float, int]:
    """(q, T) for Poisson sampling with expected batch size B over the expected m = (1 − f)·n
    training units: q = B/m, T = steps or ⌈E·m/B⌉ = ⌈E/q⌉. Every quantity is public. A unit is a
    row, or on a dataset with a privacy unit column one unit (person) with all its rows: then B
    counts units and an epoch is one expected pass over the units."""
    training_rows = training_fraction * facts.n_privacy_units
    batch_size = batch_size_of(training)
    if batch_size > training_rows:
        what = "privacy units" if facts.unit_level else "rows"
        raise InvalidHyperparameters(
            f"training.batch_size {batch_size} exceeds the {training_rows:g} {what} expected for training"
        )
    q = batch_size / training_rows
    if training.steps is not None:
        return q, training.steps
    assert training.epochs is not None
    return q, max(1, math.ceil(training.epochs / q))


def subsampled_gaussian_steps(q: float) -> Callable[[float, int], PrivacyEvent]:
    """Event builder for k steps of a (Poisson-subsampled) Gaussian with sampling rate q."""

    def event_for(noise_multiplier: float, steps: int) -> PrivacyEvent:
        if q >= 1.0:
            return GaussianEvent(noise_multiplier=noise_multiplier, count=steps)
        return PoissonSampledGaussianEvent(sampling_probability=q, noise_multiplier=noise_multiplier, count=steps)

    return event_for


class PoissonGaussianAlgorithm(AlgorithmDefinition[H]):
    """Every algorithm whose step is: Poisson batch, a sum with add/remove sensitivity S, Gaussian
    noise σ·S, division by the public B. Subclasses give S (and, if a step releases more than the
    noisy sum, the event builder)."""

    def sensitivity(self, hyperparameters: H) -> float:
        raise NotImplementedError

    def event_builder(self, hyperparameters: H, q: float) -> Callable[[float, int], PrivacyEvent]:
        return subsampled_gaussian_steps(q)

    def plan(
        self,
        hyperparameters: H,
        training: TrainingSpec,
        facts: DatasetFacts,
        *,
        training_fraction: float = 1.0,
    ) -> PrivacyPlan:
        q, steps = poisson_schedule(training, facts, training_fraction=training_fraction)
        return PrivacyPlan(
            steps=steps,
            sampling_probability=q,
            expected_batch_size=float(batch_size_of(training)),
            sensitivity=self.sensitivity(hyperparameters),
            sampling="poisson",
            event_for=self.event_builder(hyperparameters, q),
        )
