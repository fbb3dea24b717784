"""The KL-condition family's hyperparameter models: declared PUBLIC constants (L0, L1, γ, κ, F0, …),
never estimated from the data; privacy holds whatever their values (every gradient is clipped)."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AdaptiveNoisyGDHyperparameters",
    "KLSpiderHyperparameters",
    "NoisyGDHyperparameters",
    "ProximalPointHyperparameters",
]

_MAX_CONSTANT: Final[float] = 1e6


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _lipschitz() -> Any:
    return Field(
        default=1.0,
        gt=0,
        le=_MAX_CONSTANT,
        description="L0: declared Lipschitz constant of the per-example loss; every per-example "
        "gradient is clipped to it, so privacy holds even if the declaration is wrong. Public: "
        "never estimate it from the private data.",
    )


def _beta() -> Any:
    return Field(default=0.05, gt=0, lt=1, description="β: failure probability of the utility guarantee")


class AdaptiveNoisyGDHyperparameters(_Strict):
    L0: float = _lipschitz()
    L1: float = Field(
        default=1.0,
        gt=0,
        le=_MAX_CONSTANT,
        description="L1: declared smoothness; the step is 1/(2·L1). Privacy does not use it.",
    )
    beta: float = _beta()


class KLSpiderHyperparameters(AdaptiveNoisyGDHyperparameters):
    L1: float = Field(
        default=1.0,
        gt=0,
        le=_MAX_CONSTANT,
        description="L1: declared smoothness; sets the step length and the difference clip "
        "C_k = L1·r_k. Privacy holds for any value (differences are clipped).",
    )
    gamma: float = Field(default=1.0, gt=0, le=_MAX_CONSTANT, description="γ of the KL* condition")
    kappa: float = Field(default=2.0, ge=1, le=2, description="κ of the KL* condition, in [1, 2]")
    F0: float | None = Field(
        default=None,
        gt=0,
        le=1e12,
        description="public bound on F(w0) − F*, at most (L0·γ)^κ; default (L0·γ)^κ. Never "
        "computed from the private data.",
    )
    theta: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="θ: share of ρ for the round-start gradients (the rest for the differences; "
        "θ = 1 is used automatically when no round has a difference, e.g. κ = 2)",
    )

    @model_validator(mode="after")
    def _loss_bound(self) -> KLSpiderHyperparameters:
        ceiling = (self.L0 * self.gamma) ** self.kappa
        if self.F0 is None:
            self.F0 = ceiling
        if ceiling * (1 + 1e-12) < self.F0:
            raise ValueError(f"F0 ({self.F0}) must be at most (L0·γ)^κ = {ceiling:.6g}")
        return self


class NoisyGDHyperparameters(_Strict):
    L0: float = _lipschitz()
    L1_tilde: float = Field(
        default=1.0,
        gt=0,
        le=_MAX_CONSTANT,
        description="L̃1 > 0: weak-convexity constant (for a convex loss, a regularisation "
        "strength): minimises F(w) + L̃1‖w − w0‖² with steps 1/(L̃1·s) inside the ball of radius "
        "L0/(2L̃1) around w0, returning the weighted average of the iterates",
    )


class ProximalPointHyperparameters(NoisyGDHyperparameters):
    L1_tilde: float = Field(
        default=1.0,
        gt=0,
        le=_MAX_CONSTANT,
        description="L̃1 > 0: weak-convexity constant; prox term L̃1‖w − w_{t−1}‖²",
    )
    gamma: float = Field(default=1.0, gt=0, le=_MAX_CONSTANT, description="γ of the KL* condition")
    kappa: float = Field(default=2.0, ge=2, le=8, description="κ of the KL* condition, in [2, 8]")
    F0: float = Field(default=1.0, gt=0, le=1e12, description="public bound on F(w0) − F*")
    beta: float = _beta()
    max_inner_steps: int = Field(
        default=50,
        ge=1,
        le=100_000,
        description="cap on the noisy steps of each prox subproblem (Thm 9's T_in − 1 is "
        "≈ n²ρ/d; the cap voids the utility theorem, never the privacy)",
    )
