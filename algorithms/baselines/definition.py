"""Baselines of the DP-SGD family (docs/algorithms/dp-sgd.md): DP-Adam, Auto-S (≡ NSGD), DP-PSAC.

All three are the DP-SGD mechanism with a different per-sample map g ↦ ḡ (or, for DP-Adam, a
different post-processing of the release). Per step t, with Poisson sampling at rate q:

    s_t = Σ_{i∈B_t} ḡ_i + N(0, σ²·S² I),   then   s_t / B    (B = q·m, the PUBLIC expected batch)

where S is a bound on ||ḡ|| that holds for EVERY possible gradient g. Adding or removing one row
adds or removes one term of norm ≤ S, so the add/remove L2 sensitivity of s_t is S (docs/privacy-model.md#neighbours;
no factor 2 — that would be replace-one). Each step is therefore the Poisson-subsampled Gaussian
mechanism with noise multiplier σ and rate q (q = 1: a plain Gaussian); T steps compose. Dividing by
the public B and any optimizer update (SGD, momentum, Adam) are post-processing. The event is built
by the same code as dp-sgd's, with sensitivity = S; σ is calibrated at the job's full ε.

Bounds (proofs in ``dp/per_example/per_sample_maps.py``):

- dp-adam: Abadi clipping ḡ = g·min(1, C/||g||), S = C.
- auto-s:  ḡ = C·g/(||g|| + γ), γ > 0, so ||ḡ|| = C·||g||/(||g|| + γ) < C; S = C.
- dp-psac: ḡ = C·g/(||g|| + r/(||g|| + r)), r > 0, so ||ḡ|| = C·||g||/(||g|| + r/(||g||+r)) < C;
  S = C.

Torch-free like the rest of the catalogue: the worker's per-sample maps live in
``dp.per_example.per_sample_maps`` and its trainers in ``algorithms.baselines.trainer``; the
trainers check that the map's norm bound equals ``sensitivity(hyperparameters)`` below.
"""

from __future__ import annotations

from typing import ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from algorithms.registry import PoissonGaussianAlgorithm, register_algorithm
from algorithms.steps_charges import COMPOSED
from algorithms.training_fields import ALL_TRAINING_FIELDS

# Lower bound on γ and r. A per-sample norm is computed in the model's dtype (float32), where the
# squares of coordinates below ~4e-23 underflow: the computed norm n̂ can be smaller than the true
# norm by up to √(d·1.4e-45). Auto-S's scale C/(n̂ + γ) stays ≤ C/true-norm as long as γ exceeds
# that slack (≈4e-17 for d = 1e12 parameters), so γ ≥ 1e-6 keeps the bound S = C with a wide margin.
MIN_SMOOTHING = 1e-6
MAX_SMOOTHING = 1e4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DPAdamHyperparameters(_Strict):
    clipping_norm: float = Field(default=1.0, gt=0, le=1e4, description="per-sample L2 clip C")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam's first-moment decay")
    beta2: float = Field(default=0.999, ge=0, lt=1, description="Adam's second-moment decay")
    eps: float = Field(default=1e-8, gt=0, le=1, description="Adam's denominator constant")
    weight_decay: float = Field(
        default=0.0, ge=0, le=1, description="L2 penalty added to the privatised gradient (Adam, not AdamW)"
    )


class _NormalisingHyperparameters(_Strict):
    """Shared by auto-s and dp-psac: the map's C plus the optimizer the release is fed to."""

    clipping_norm: float = Field(default=1.0, gt=0, le=1e4, description="C: scale of the map and bound on every ||ḡ||")
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD momentum (sgd only)")
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    optimizer: Literal["sgd", "adam"] = Field(
        default="sgd", description="optimizer fed the privatised gradient (post-processing)"
    )

    @model_validator(mode="after")
    def _momentum_is_sgd_only(self) -> _NormalisingHyperparameters:
        if self.optimizer == "adam" and self.momentum != 0.0:
            raise ValueError("momentum applies to optimizer 'sgd' only; Adam uses betas (0.9, 0.999)")
        return self


class AutoSHyperparameters(_NormalisingHyperparameters):
    gamma: float = Field(
        default=0.01,
        ge=MIN_SMOOTHING,
        le=MAX_SMOOTHING,
        description="γ in C·g/(||g|| + γ) (NSGD's r); γ → 0 is plain normalisation",
    )


class DPPSACHyperparameters(_NormalisingHyperparameters):
    r: float = Field(
        default=0.01,
        ge=MIN_SMOOTHING,
        le=MAX_SMOOTHING,
        description="r in C·g/(||g|| + r/(||g|| + r))",
    )


_MapH = TypeVar("_MapH", DPAdamHyperparameters, AutoSHyperparameters, DPPSACHyperparameters)


class _PerSampleMapAlgorithm(PoissonGaussianAlgorithm[_MapH]):
    """DP-SGD's event with sensitivity = the per-sample map's norm bound S."""

    family = "dp-sgd"
    training_fields: ClassVar[frozenset[str]] = ALL_TRAINING_FIELDS  # augmult, precision: per-sample-map trainer
    clips_per_sample: ClassVar[bool] = True
    privacy_units: ClassVar[bool] = True  # the per-sample-map trainer averages a unit's rows, then maps

    def sensitivity(self, hyperparameters: _MapH) -> float:
        """S, the bound on every mapped per-sample gradient: the add/remove sensitivity of the sum."""
        return float(hyperparameters.clipping_norm)


@register_algorithm
class DPAdam(_PerSampleMapAlgorithm[DPAdamHyperparameters]):
    name = "dp-adam"
    steps_charge = COMPOSED
    paper = (
        "Abadi et al. 2016 (CCS) mechanism with Adam (Kingma & Ba 2015) as post-processing, "
        "as in e.g. Opacus' DPOptimizer over torch.optim.Adam"
    )
    summary = (
        "DP-SGD's release fed to Adam: per-sample gradients clipped to C, summed, Gaussian noise "
        "σ·C added, divided by the expected batch size; Adam (coupled L2 weight decay) steps on "
        "that privatised gradient. Same privacy cost as dp-sgd."
    )
    Hyperparameters = DPAdamHyperparameters


@register_algorithm
class AutoS(_PerSampleMapAlgorithm[AutoSHyperparameters]):
    name = "auto-s"
    steps_charge = COMPOSED
    paper = (
        "Bu, Wang, Zha, Karypis 2023, Automatic Clipping: Differentially Private Deep Learning Made "
        "Easier and Stronger (NeurIPS) — equivalent to NSGD, Yang et al. 2022"
    )
    summary = (
        "Automatic clipping (Auto-S): each per-sample gradient mapped to C·g/(||g|| + γ) "
        "(norm < C), summed, Gaussian noise σ·C added, divided by the expected batch size; SGD "
        "(momentum) or Adam on the result. Same event as dp-sgd with sensitivity C."
    )
    Hyperparameters = AutoSHyperparameters


@register_algorithm
class DPPSAC(_PerSampleMapAlgorithm[DPPSACHyperparameters]):
    name = "dp-psac"
    steps_charge = COMPOSED
    paper = (
        "Xia, Shen, Yu, Wang, Tang, Zheng, Liu, Yang 2023, Differentially Private Learning with "
        "Per-Sample Adaptive Clipping (AAAI)"
    )
    summary = (
        "Per-sample adaptive clipping in the form of Xia et al.: g ↦ C·g/(||g|| + r/(||g|| + r)) "
        "(norm < C; a non-monotone weight), summed, Gaussian noise σ·C added, divided by the "
        "expected batch size; SGD (momentum) or Adam on the result. This is NOT Opacus' "
        "PSACDPOptimizer variant (g·min(1, C_i/||g||) with C_i = C(||g||+r)/(||g||²+r||g||+r))."
    )
    Hyperparameters = DPPSACHyperparameters
