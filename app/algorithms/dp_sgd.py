"""DP-SGD (Abadi et al. 2016) with Poisson sampling.

Mechanism per step: S = Σ_{i∈batch} clip_C(g_i) + N(0, σ²C² I), then S / (q·n).
Add/remove sensitivity of the clipped sum is C (adding a row adds one term of norm ≤ C), and the
normaliser q·n is public, so each step is a Poisson-subsampled Gaussian with noise multiplier σ
(q = 1: a plain Gaussian). T steps compose.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from app.algorithms.registry import (
    AlgorithmDefinition,
    PrivacyPlan,
    poisson_schedule,
    register_algorithm,
)
from app.facts import DatasetFacts
from app.privacy import GaussianEvent, PoissonSampledGaussianEvent, PrivacyEvent
from app.schemas.jobs import TrainingSpec


class DPSGDHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    clipping_norm: float = Field(default=1.0, gt=0, le=1e4, description="per-sample L2 clip C")
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)


def subsampled_gaussian_steps(q: float) -> Callable[[float, int], PrivacyEvent]:
    """Event builder for k steps of a (Poisson-subsampled) Gaussian with sampling rate q."""

    def event_for(noise_multiplier: float, steps: int) -> PrivacyEvent:
        if q >= 1.0:
            return GaussianEvent(noise_multiplier=noise_multiplier, count=steps)
        return PoissonSampledGaussianEvent(
            sampling_probability=q, noise_multiplier=noise_multiplier, count=steps
        )

    return event_for


@register_algorithm
class DPSGD(AlgorithmDefinition):
    name = "dp-sgd"
    family = "dp-sgd"
    paper = "Abadi et al. 2016, Deep Learning with Differential Privacy (CCS)"
    summary = (
        "Per-sample gradients clipped to C, summed, Gaussian noise σ·C added, divided by the "
        "expected batch size; SGD with momentum on the privatised gradient."
    )
    Hyperparameters = DPSGDHyperparameters

    def plan(
        self,
        hyperparameters: BaseModel,
        training: TrainingSpec,
        facts: DatasetFacts,
        *,
        training_fraction: float = 1.0,
    ) -> PrivacyPlan:
        assert isinstance(hyperparameters, DPSGDHyperparameters)
        q, steps = poisson_schedule(training, facts, training_fraction=training_fraction)
        return PrivacyPlan(
            steps=steps,
            sampling_probability=q,
            expected_batch_size=float(training.batch_size),
            sensitivity=hyperparameters.clipping_norm,
            sampling="poisson",
            event_for=subsampled_gaussian_steps(q),
        )
