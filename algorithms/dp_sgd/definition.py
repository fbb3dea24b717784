"""DP-SGD (Abadi et al. 2016) with Poisson sampling.

Mechanism per step: S = Σ_{i∈batch} clip_C(g_i) + N(0, σ²C² I), then S / (q·n).
Add/remove sensitivity of the clipped sum is C (adding a row adds one term of norm ≤ C), and the
normaliser q·n is public, so each step is a Poisson-subsampled Gaussian with noise multiplier σ
(q = 1: a plain Gaussian). T steps compose.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from algorithms.registry import PoissonGaussianAlgorithm, register_algorithm
from algorithms.steps_charges import COMPOSED
from algorithms.training_fields import ALL_TRAINING_FIELDS


class DPSGDHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    clipping_norm: float = Field(default=1.0, gt=0, le=1e4, description="per-sample L2 clip C")
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)


@register_algorithm
class DPSGD(PoissonGaussianAlgorithm[DPSGDHyperparameters]):
    name = "dp-sgd"
    steps_charge = COMPOSED
    family = "dp-sgd"
    paper = "Abadi et al. 2016, Deep Learning with Differential Privacy (CCS)"
    summary = (
        "Per-sample gradients clipped to C, summed, Gaussian noise σ·C added, divided by the "
        "expected batch size; SGD with momentum on the privatised gradient."
    )
    Hyperparameters = DPSGDHyperparameters
    training_fields: ClassVar[frozenset[str]] = ALL_TRAINING_FIELDS  # augmult, precision: per-sample-map trainer
    clips_per_sample: ClassVar[bool] = True
    privacy_units: ClassVar[bool] = True  # the per-sample-map trainer averages a unit's rows, then maps

    def sensitivity(self, hyperparameters: DPSGDHyperparameters) -> float:
        return hyperparameters.clipping_norm
