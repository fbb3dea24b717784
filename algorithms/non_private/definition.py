"""Non-private optimizers (``sgd``, ``adam``): for datasets their owner declared public only.

A job on a public dataset has no privacy budget to protect (docs/pretraining-and-finetuning.md),
so plain minibatch training is allowed there: this is how a user pretrains a base model inside
the service. These entries release every gradient exactly; submission refuses them on any
dataset that is not public (``/problems/non-private-on-private-data``), and the job lifecycle
refuses them again at admission.

Their plan's event is the empty composition: the mechanism adds no noise and claims nothing; it
exists so that the planning and worker machinery (steps, batch size, progress) stays one path.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from algorithms.registry import (
    AlgorithmDefinition,
    H,
    PrivacyPlan,
    poisson_schedule,
    register_algorithm,
)
from algorithms.steps_charges import NOT_CHARGED
from algorithms.training_fields import ALL_TRAINING_FIELDS, batch_size_of
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import ComposedEvent, PrivacyEvent
from kernel.schemas.jobs import TrainingSpec

NON_PRIVATE_FAMILY = "non-private"


def no_release_event(_noise_multiplier: float, _steps: int) -> PrivacyEvent:
    """The empty composition: a non-private job claims no guarantee and is charged nothing."""
    return ComposedEvent(events=())


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SGDHyperparameters(_Strict):
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 penalty (coupled)")


class AdamHyperparameters(_Strict):
    beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam's first-moment decay")
    beta2: float = Field(default=0.999, ge=0, lt=1, description="Adam's second-moment decay")
    eps: float = Field(default=1e-8, gt=0, le=1, description="Adam's denominator constant")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 penalty (coupled, not AdamW)")


class _NonPrivate(AlgorithmDefinition[H]):
    """Minibatches of ``training.batch_size`` rows drawn uniformly; no clipping, no noise."""

    family = NON_PRIVATE_FAMILY
    private: ClassVar[bool] = False
    training_fields: ClassVar[frozenset[str]] = ALL_TRAINING_FIELDS

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
            sensitivity=0.0,
            sampling="uniform-minibatch",
            event_for=no_release_event,
        )


@register_algorithm
class SGD(_NonPrivate[SGDHyperparameters]):
    name = "sgd"
    steps_charge = NOT_CHARGED
    paper = "plain minibatch SGD with momentum (not differentially private)"
    summary = (
        "Non-private minibatch SGD (momentum, weight decay) for datasets declared public: no "
        "clipping, no noise, no privacy guarantee. Refused on every other dataset."
    )
    Hyperparameters = SGDHyperparameters


@register_algorithm
class Adam(_NonPrivate[AdamHyperparameters]):
    name = "adam"
    steps_charge = NOT_CHARGED
    paper = "Kingma & Ba 2015, Adam: A Method for Stochastic Optimization (not differentially private)"
    summary = (
        "Non-private minibatch Adam for datasets declared public: no clipping, no noise, no "
        "privacy guarantee. Refused on every other dataset."
    )
    Hyperparameters = AdamHyperparameters
