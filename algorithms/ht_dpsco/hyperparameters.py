"""The heavy-tailed DP-SCO family's hyperparameter models (algorithms/ht_dpsco/definition.py).

Every field is a PUBLIC constant the user declares (moment bounds, scales, radii, s*); none is
ever estimated from the data. Each algorithm's schema says how it reads ``training.*``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from algorithms.ht_dpsco import calibration as cal
from algorithms.registry import InvalidHyperparameters
from kernel.schemas.jobs import TrainingSpec

__all__ = [
    "MAX_CONDITION_NUMBER",
    "FWHyperparameters",
    "HTHyperparameters",
    "LassoHyperparameters",
    "Preset",
    "SparseHyperparameters",
    "SparseLinRegHyperparameters",
    "SparseOptHyperparameters",
    "planned_iterations",
]

Preset = Literal["theory", "paper-experiments"]

MAX_CONDITION_NUMBER: Final[float] = 1e6
"""Largest γ/μ accepted: keeps s = ⌈c(γ/μ)²s*⌉ and T = ⌈c(γ/μ)log n⌉ finite integers."""


def _positive(default: float, description: str, *, le: float = 1e6) -> Any:
    return Field(default=default, gt=0, le=le, description=description)


class HTHyperparameters(BaseModel):
    """Shared by the family. Parameters not used by the chosen preset are ignored."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    preset: Preset = Field(
        default="theory",
        description="'theory': the theorems' parameter formulas (hidden constants 1); "
        "'paper-experiments': the paper's §6.2 settings (see the report for why they are poor)",
    )
    design_epsilon: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="the ε the parameter formulas (T, truncation scales) assume; by default the "
        "job's privacy.target_epsilon (1 when the job gives a noise_multiplier instead). It does "
        "NOT change the charge, which is calibrated from the job's privacy spec",
    )

    @property
    def formula_epsilon(self) -> float:
        """design_epsilon once the planner has filled it; 1 for direct callers that did not."""
        return self.design_epsilon if self.design_epsilon is not None else 1.0

    zeta: float = Field(default=0.05, gt=0, lt=1, description="failure probability in the formulas")
    iterations_multiplier: float = _positive(1.0, "multiplies the theory formula of T (hidden constant 1)", le=1e3)


def planned_iterations(training: TrainingSpec, formula: Callable[[], int]) -> int:
    """T: ``training.steps``, or with ``training.epochs`` = 1 the preset's formula."""
    if training.steps is not None:
        return training.steps
    if training.epochs != 1:
        raise InvalidHyperparameters(
            "training.epochs must be 1 for this single-pass algorithm (or give training.steps = T)"
        )
    return formula()


class FWHyperparameters(HTHyperparameters):
    """``ht-dp-fw`` (Alg 1): private Frank–Wolfe with the smoothed Catoni robust gradient.
    training.steps = T (one disjoint block per iteration) or training.epochs = 1 (T from the
    preset); batch_size and learning_rate are not given (refused). Regression: squared loss (or Tukey's
    biweight, Thm 3); two-class classification: logistic loss with labels ±1."""

    constraint: Literal["l1_ball", "simplex"] = Field(default="l1_ball", description="the polytope 𝒲")
    radius: float = _positive(1.0, "ℓ1 radius r of the ball / scale r of the simplex")
    sensitivity_norm: Literal["diameter", "max_vertex"] = Field(
        default="diameter",
        description="‖v‖₁ bound in Δ: the ℓ1 diameter 2r (paper-literal) or max‖v‖₁ = r (tight, all the proof needs)",
    )
    tau: float = _positive(1.0, "public bound τ on E(∂_jℓ)² (Assumption 1)")
    alpha: float = _positive(1.0, "public smoothness α of the population risk")
    beta: float = _positive(1.0, "smoothing parameter β of the robust estimator (the paper gives none)", le=100)
    kappa: float | None = Field(default=None, gt=0, le=1e12, description="robust scale κ; default from the preset")
    kappa_multiplier: float = _positive(1.0, "multiplies the formula's κ (hidden constant 1)", le=1e6)
    regression_loss: Literal["squared", "biweight"] = Field(
        default="squared", description="regression loss: (⟨w,x⟩ − y)² or the biweight ψ (Thm 3, constant step 1/√T)"
    )
    biweight_c: float = _positive(4.685, "the biweight's cut-off c", le=1e6)
    selection: Literal["gumbel", "laplace-noisy-max"] = Field(
        default="gumbel",
        description="'gumbel' (the historical name): the exponential mechanism, sampled exactly with "
        "integer arithmetic; 'laplace-noisy-max': report-noisy-max with discrete Laplace(2Δσ) noise on a "
        "power-of-two grid (a different ε-DP selection)",
    )


class LassoHyperparameters(HTHyperparameters):
    """``ht-private-lasso`` (Alg 2): Frank–Wolfe on the ℓ1 ball over ALL rows each iteration,
    data clipped entrywise at K, exponential-mechanism vertex selection. training.steps = T or
    training.epochs = 1 (T from the preset); batch_size and learning_rate are not given (refused).
    Squared loss (regression datasets) only."""

    radius: float = _positive(1.0, "ℓ1 radius r of the constraint ball")
    sensitivity_norm: Literal["diameter", "max_vertex"] = Field(
        default="diameter", description="‖v‖₁ bound in Δ: diameter 2r (paper) or r (tight, all the proof needs)"
    )
    lambda_max: float = _positive(1.0, "public λ_max(E xxᵀ) (used in the theory T)")
    fourth_moment: float | None = Field(
        default=None,
        gt=0,
        le=1e12,
        description="public fourth-moment bound M; if set, K = (M·nε)^{1/4}/T^{1/8} (an extension, "
        "not the paper's; default: unit scale)",
    )
    truncation: float | None = Field(default=None, gt=0, le=1e12, description="clip level K; default from the formula")
    truncation_multiplier: float = _positive(1.0, "multiplies the formula's K", le=1e6)


class SparseHyperparameters(HTHyperparameters):
    """Shared by the Peeling algorithms (``ht-sparse-linreg``, ``ht-sparse-opt``)."""

    s_star: int = Field(default=5, ge=1, le=100_000, description="public target sparsity s*")
    sparsity_multiplier: float = _positive(
        2.0, "s = ⌈c·(γ/μ)²·s*⌉; c = 2 is the paper's experimental choice (the proof's 72 is impractical)", le=1e3
    )
    sparsity: int | None = Field(default=None, ge=1, le=100_000, description="s, overriding the formula")
    gamma: float = _positive(1.0, "public λ_max(E xxᵀ) / RSS constant γ")
    mu: float = _positive(1.0, "public λ_min(E xxᵀ) / RSC constant μ (≤ γ)")
    eta: float | None = Field(default=None, gt=0, le=100, description="step η; default from the preset")

    @model_validator(mode="after")
    def _mu_below_gamma(self) -> SparseHyperparameters:
        # s and T grow like (γ/μ)² and γ/μ: a tiny μ overflowed them (mu = 1e-300 was a 500).
        if not self.gamma / MAX_CONDITION_NUMBER <= self.mu <= self.gamma:
            raise ValueError(
                f"mu must be in [gamma/{MAX_CONDITION_NUMBER:g}, gamma] = "
                f"[{self.gamma / MAX_CONDITION_NUMBER:g}, {self.gamma:g}], got {self.mu!r}"
            )
        return self

    def sparsity_level(self, d: int) -> int:
        s = (
            self.sparsity
            if self.sparsity is not None
            else cal.sparse_level(s_star=self.s_star, gamma=self.gamma, mu=self.mu, multiplier=self.sparsity_multiplier)
        )
        if s > d:
            raise InvalidHyperparameters(f"sparsity s = {s} exceeds the {d} features")
        return s

    def sparse_iterations(self, training: TrainingSpec, n: float) -> int:
        if self.preset == "paper-experiments":
            return planned_iterations(training, lambda: cal.sparse_paper_iterations(n=n))
        return planned_iterations(
            training,
            lambda: cal.sparse_theory_iterations(
                n=n, gamma=self.gamma, mu=self.mu, multiplier=self.iterations_multiplier
            ),
        )


class SparseLinRegHyperparameters(SparseHyperparameters):
    """``ht-sparse-linreg`` (Alg 3): IHT on entrywise-clipped data with Peeling, one disjoint
    block per iteration, projection onto the ℓ2 ball. Loss ½(⟨w,x⟩ − y)², as the paper's step
    computes it (docs/algorithms/heavy-tailed-dpsco.md#paper-conventions); regression datasets
    only. training.steps = T or training.epochs = 1 (T from the preset); batch_size and
    learning_rate are not given (refused; the step is η₀ = η/γ)."""

    radius: float = _positive(1.0, "ℓ2 radius R of the constraint ball")
    truncation: float | None = Field(default=None, gt=0, le=1e12, description="clip level K; default (nε/(sT))^{1/4}")
    truncation_multiplier: float = _positive(1.0, "multiplies the formula's K", le=1e6)


class SparseOptHyperparameters(SparseHyperparameters):
    """``ht-sparse-opt`` (Alg 5): IHT with the smoothed Catoni robust gradient and Peeling, one
    disjoint block per iteration. Two-class classification: ℓ2-regularised logistic loss;
    regression: ½(⟨w,x⟩ − y)². training.steps = T or training.epochs = 1 (T from the preset);
    batch_size and learning_rate are not given (refused; the step is η)."""

    tau: float = _positive(1.0, "public bound τ on E(∂_jℓ)² over s-sparse w (Assumption 4)")
    beta: float = _positive(1.0, "smoothing parameter β of the robust estimator", le=100)
    scale: float | None = Field(default=None, gt=0, le=1e12, description="robust scale k; default from the preset")
    scale_multiplier: float = _positive(1.0, "multiplies the formula's k", le=1e6)
    paper_c2: float = _positive(1.0, "c₂ of the paper preset's k = c₂·n·ε", le=1e6)
    sensitivity_mode: Literal["box", "tight"] = Field(
        default="box", description="λ from the algorithm box (paper-literal, 3× larger) or the proof of Thm 8 (tight)"
    )
    l2_regularisation: float = Field(
        default=1e-2, ge=0, le=1e3, description="λ₂ of the regularised loss (the paper gives none)"
    )
    regulariser_in_estimator: bool = Field(
        default=True, description="the robust estimator sees λ₂w (as in the paper); False adds it exactly"
    )
