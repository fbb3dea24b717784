"""DC-DPSGD (Sha et al., "Clip Body and Tail Separately"), with a SOUND calibration only.

Two per-sample clip norms: each step, every sample of the Poisson batch gets a "projected trace"
λ_i = ||V_tᵀ g_i[J]||² / ||g_i[J]||² (V_t an orthonormal basis of the span of k fresh,
data-independent sub-Weibull(θ) vectors; J the projection scope), optionally λ̃_i = λ_i + N(0, σ_tr²).
"Tail" samples are clipped to c1, "body" samples to c2 ≤ c1 (norm of the FULL per-sample
gradient), the clipped gradients are summed, ONE Gaussian vector N(0, σ²Δ² I) is added and the
sum is divided by the public expected batch size B = q·m. docs/algorithms/dc-dpsgd.md#what-it-does.

Privacy (add/remove: docs/privacy-model.md#neighbours;
docs/algorithms/dc-dpsgd.md#privacy-calibration-as-we-charge-it). Fix the public,
data-independent randomness of a step (V_t, the trace noise of each record, the tie-breaking
order; all i.i.d. per record, so the copies for the records of D and of D' = D ∪ {z} can be
coupled record by record). λ̃_i then depends on record i and that randomness only (per-sample
normalisation, never a batch-level normaliser), and the released sum s = Σ_{i∈S} clip_{c(i)}(g_i)
has add/remove L2 sensitivity

* ``dc-dpsgd`` (RANK rule, the paper's: the m = ⌊p·|S|⌋ largest λ̃ are tail). Adding z either
  (a) keeps m and z enters the top m: z adds ≤ c1 and the old m-th sample drops from c1 to c2,
  changing by ≤ c1 − c2, total ≤ 2·c1 − c2; (b) keeps m, z body: ≤ c2; (c) m grows by one and
  z is tail: ≤ c1; (d) m grows, z body, one body sample promoted: ≤ c2 + (c1 − c2) = c1.
  Hence Δ = 2·c1 − c2, and it is attained (docs/algorithms/dc-dpsgd.md#rank-rule-sensitivity).
* ``dc-dpsgd-threshold`` (tail iff λ̃_i > τ_t with τ_t public): c(i) depends on record i only,
  so adding z adds one term of norm ≤ c1: Δ = c1.

The output distribution is a mixture over the public randomness of Gaussians whose means differ
by ≤ Δ, so by joint convexity of the hockey-stick divergence each step is dominated by the
Poisson-subsampled Gaussian mechanism with noise multiplier σ (the noise std on the sum is σ·Δ),
exactly DP-SGD's event, at the FULL ε (no ε_tr/ε_dp split; the trace noise σ_tr has no privacy
role). These bounds are already add/remove bounds: no halving of a replace-one value is involved.

Private threshold tracking (``dc-dpsgd-threshold`` with ``tracking``; Andrew et al. 2021;
docs/algorithms/dc-dpsgd.md#threshold-tracking). Each step ALSO releases the noisy tail count
b̃_t = (Σ_{i∈S} 1[λ̃_i > τ_t] + N(0, σ_b²))/B and sets τ_{t+1} = τ_t·exp(η_τ·(b̃_t − p)). The
count has add/remove sensitivity 1 and is a sum over the same Poisson sample as the gradient, so
the joint release per step is ONE subsampled Gaussian of the stacked vector (s/c1, count·σ/σ_b)
with noise σ per coordinate and sensitivity sqrt(1 + σ²/σ_b²), i.e. a subsampled Gaussian with
noise multiplier σ_eff = (σ⁻² + σ_b⁻²)^(-1/2). The user specifies ``threshold_noise_ratio`` r and
the worker draws σ_b = r·σ, so σ_eff = σ / sqrt(1 + 1/r²); the event built for σ charges σ_eff,
and calibration solves for σ through that builder. τ_t is a function of released values and
public constants.

The paper's own ε_tr + ε_dp calibration (Thm 5.1) is NOT a valid guarantee
(docs/algorithms/dc-dpsgd.md#why-the-papers-calibration-does-not-hold) and is never charged:
:func:`paper_claimed_epsilon` computes it only so that a report can show it under the label
:data:`PAPER_CLAIM_LABEL`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from algorithms.paper_claims import PAPER_CLAIM_LABEL, claim_entry, poisson_gaussian_rdp_epsilon
from algorithms.registry import (
    PoissonGaussianAlgorithm,
    PrivacyPlan,
    register_algorithm,
    subsampled_gaussian_steps,
)
from algorithms.steps_charges import COMPOSED
from algorithms.training_fields import PER_UNIT_TRAINING_FIELDS
from kernel.privacy import PrivacyEvent

__all__ = [
    "PAPER_CLAIM_LABEL",
    "DCCommonHyperparameters",
    "DCDPSGDHyperparameters",
    "DCDPSGDRank",
    "DCDPSGDThreshold",
    "DCDPSGDThresholdHyperparameters",
    "PaperClaim",
    "effective_noise_multiplier",
    "paper_claimed_epsilon",
    "rank_sensitivity",
]

DEFAULT_TAIL_TO_BODY_RATIO: Final[float] = 10.0
"""c1 = 10·c2 when c1 is not given (the paper's experiments)."""

ParameterName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class DCCommonHyperparameters(BaseModel):
    """Hyperparameters shared by both selection rules (none of them changes the event except
    through c1, c2 and, for tracking, the threshold noise ratio)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    c2: float = Field(default=0.1, gt=0, le=1e4, description="body clip norm (small)")
    c1: float | None = Field(
        default=None,
        gt=0,
        le=1e5,
        description="tail clip norm (large, >= c2); default 10·c2, filled in on validation",
    )
    k: int = Field(default=200, ge=1, le=10_000, description="subspace dimension (must be < d_J)")
    theta: float = Field(
        default=2.0,
        gt=0,
        le=8,
        description="sub-Weibull index of the projection entries (-ln U)^θ; 1 = the authors' code",
    )
    sigma_tr: float = Field(
        default=0.0,
        ge=0,
        le=1e6,
        description="std of the noise added to each trace; NO privacy role (selection only)",
    )
    scope: Literal["all"] | Annotated[list[ParameterName], Field(min_length=1, max_length=1024)] = Field(
        default="all",
        description="'all' trainable parameters, or a list of parameter names to project",
    )
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD momentum (sgd only)")
    weight_decay: float = Field(default=0.0, ge=0, le=1)

    @model_validator(mode="after")
    def _resolve(self) -> DCCommonHyperparameters:
        if self.c1 is None:
            # Normalised specs are stored with the concrete value, so re-validation is idempotent.
            self.c1 = DEFAULT_TAIL_TO_BODY_RATIO * self.c2
        if self.c1 < self.c2:
            raise ValueError(f"c1 (tail clip, {self.c1}) must be >= c2 (body clip, {self.c2})")
        if isinstance(self.scope, list) and len(set(self.scope)) != len(self.scope):
            raise ValueError("scope lists a parameter name twice")
        if self.optimizer == "adam" and self.momentum != 0.0:
            raise ValueError("momentum applies to optimizer 'sgd' only")
        return self

    @property
    def tail_clip(self) -> float:
        assert self.c1 is not None
        return self.c1


class DCDPSGDHyperparameters(DCCommonHyperparameters):
    """``dc-dpsgd``: the paper's rank rule — the ⌊p·|S|⌋ largest noisy traces are tail."""

    p: float = Field(default=0.1, gt=0, lt=1, description="tail ratio: fraction of the batch clipped to c1")


class DCDPSGDThresholdHyperparameters(DCCommonHyperparameters):
    """``dc-dpsgd-threshold``: tail iff λ̃_i > τ_t; τ fixed or privately tracked toward p."""

    tau: float | None = Field(
        default=None,
        gt=0,
        le=1e3,
        description="(initial) trace threshold τ_0; default k/d_J (the mean trace), set by the worker",
    )
    tracking: bool = Field(default=False, description="privately track τ so that a fraction p of the batch is tail")
    p: float = Field(default=0.1, gt=0, lt=1, description="target tail fraction (tracking only)")
    eta_tau: float = Field(default=0.2, gt=0, le=10, description="geometric step of τ (tracking only)")
    threshold_noise_ratio: float = Field(
        default=10.0,
        gt=0,
        le=1e4,
        description="r: the tail count gets N(0, (r·σ)²); charged via σ_eff = σ/sqrt(1 + 1/r²) (tracking only)",
    )


def rank_sensitivity(c1: float, c2: float) -> float:
    """Add/remove L2 sensitivity of the clipped sum under the rank rule: 2·c1 − c2 (module doc)."""
    return 2.0 * c1 - c2


def effective_noise_multiplier(noise_multiplier: float, threshold_noise_ratio: float) -> float:
    """σ_eff = (σ⁻² + σ_b⁻²)^(-1/2) with σ_b = r·σ, i.e. σ / sqrt(1 + 1/r²)."""
    return noise_multiplier / math.sqrt(1.0 + 1.0 / (threshold_noise_ratio * threshold_noise_ratio))


def _event_builder(q: float, threshold_noise_ratio: float | None) -> Callable[[float, int], PrivacyEvent]:
    """Steps of the subsampled Gaussian; with tracking, at σ_eff(σ, r) for the joint release."""
    gaussian_steps = subsampled_gaussian_steps(q)
    if threshold_noise_ratio is None:
        return gaussian_steps
    ratio = threshold_noise_ratio

    def joint(noise_multiplier: float, steps: int) -> PrivacyEvent:
        # σ is the gradient's multiplier (the job's stored σ); the count's noise is σ_b = r·σ.
        return gaussian_steps(effective_noise_multiplier(noise_multiplier, ratio), steps)

    return joint


@register_algorithm
class DCDPSGDRank(PoissonGaussianAlgorithm[DCDPSGDHyperparameters]):
    name = "dc-dpsgd"
    steps_charge = COMPOSED
    family = "dc-dpsgd"
    clips_per_sample: ClassVar[bool] = True
    privacy_units: ClassVar[bool] = True  # a sampled unit's mean gradient is one "sample" of the rules
    training_fields: ClassVar[frozenset[str]] = PER_UNIT_TRAINING_FIELDS
    paper = (
        "Sha et al., Clip Body and Tail Separately: High Probability Guarantees for DPSGD with "
        "Heavy Tails (arXiv); sound calibration per privtrain docs/algorithms/dc-dpsgd.md"
    )
    summary = (
        "Per-sample projected traces on a fresh random sub-Weibull subspace; the top p of the "
        "batch is clipped to c1, the rest to c2; one Gaussian N(0, σ²(2c1 − c2)²) on the sum "
        "(rank-coupling sensitivity), divided by the expected batch size. Charged as DP-SGD at "
        "the full ε; the paper's ε split is not a valid guarantee and is never charged."
    )
    Hyperparameters = DCDPSGDHyperparameters

    def sensitivity(self, hyperparameters: DCDPSGDHyperparameters) -> float:
        return rank_sensitivity(hyperparameters.tail_clip, hyperparameters.c2)

    def paper_claimed_epsilon(
        self,
        hyperparameters: DCDPSGDHyperparameters,
        plan: PrivacyPlan,
        *,
        noise_multiplier: float,
        delta: float,
    ) -> PaperClaim:
        """The paper's Thm 5.1 number for this job — for a report label only, never charged."""
        return paper_claimed_epsilon(
            sampling_probability=plan.sampling_probability,
            steps=plan.steps,
            delta=delta,
            noise_multiplier=noise_multiplier,
            sigma_tr=hyperparameters.sigma_tr,
        )

    def report_notes(
        self,
        hyperparameters: DCDPSGDHyperparameters,
        plan: PrivacyPlan,
        *,
        noise_multiplier: float,
        delta: float,
    ) -> dict[str, Any]:
        claim = self.paper_claimed_epsilon(hyperparameters, plan, noise_multiplier=noise_multiplier, delta=delta)
        return {
            "paper_claim": claim.as_report_entry(),
            "sensitivity_rule": "rank rule: adding a row can also move another row from tail to "
            "body, so the add/remove sensitivity of the clipped sum is 2·c1 − c2",
        }


@register_algorithm
class DCDPSGDThreshold(PoissonGaussianAlgorithm[DCDPSGDThresholdHyperparameters]):
    name = "dc-dpsgd-threshold"
    steps_charge = COMPOSED
    family = "dc-dpsgd"
    clips_per_sample: ClassVar[bool] = True
    privacy_units: ClassVar[bool] = True  # a sampled unit's mean gradient is one "sample" of the rule
    training_fields: ClassVar[frozenset[str]] = PER_UNIT_TRAINING_FIELDS
    paper = DCDPSGDRank.paper
    summary = (
        "DC-DPSGD with a per-sample rule: tail iff the projected trace exceeds a public threshold "
        "τ (clip c1), else body (clip c2); one Gaussian N(0, σ²c1²) on the sum. Optional private "
        "tracking of τ toward a tail fraction p releases a noisy tail count N(0, (rσ)²) each step, "
        "charged jointly as a subsampled Gaussian with σ_eff = σ/sqrt(1 + 1/r²)."
    )
    Hyperparameters = DCDPSGDThresholdHyperparameters

    def sensitivity(self, hyperparameters: DCDPSGDThresholdHyperparameters) -> float:
        return hyperparameters.tail_clip

    def event_builder(
        self, hyperparameters: DCDPSGDThresholdHyperparameters, q: float
    ) -> Callable[[float, int], PrivacyEvent]:
        ratio = hyperparameters.threshold_noise_ratio if hyperparameters.tracking else None
        return _event_builder(q, ratio)

    def report_notes(
        self,
        hyperparameters: DCDPSGDThresholdHyperparameters,
        plan: PrivacyPlan,
        *,
        noise_multiplier: float,
        delta: float,
    ) -> dict[str, Any]:
        notes: dict[str, Any] = {
            "sensitivity_rule": "per-sample threshold rule: the clip of a row depends on that row "
            "and public randomness only, so the add/remove sensitivity is c1",
        }
        if hyperparameters.tracking:
            ratio = hyperparameters.threshold_noise_ratio
            notes["threshold_tracking"] = {
                "released_per_step": "the noisy count of tail rows, N(0, (r·σ)²) noise",
                "count_noise_multiplier": ratio * noise_multiplier,
                "effective_noise_multiplier": noise_multiplier / math.sqrt(1 + 1 / ratio**2),
                "accounting": "gradient and count released jointly: one subsampled Gaussian "
                "with σ_eff = σ/sqrt(1 + 1/r²) per step (the event's noise multiplier)",
            }
        return notes


# ----------------------------------------------------------------------------- paper's claim


@dataclass(frozen=True)
class PaperClaim:
    """What the paper's Theorem 5.1 accounting would assert for a run — NOT a guarantee.

    The paper accounts the trace noise and the gradient noise as two separate subsampled
    Gaussians (traces with sensitivity 1 and noise σ_tr; gradients with its noise multiplier
    σ_dp) composed by adding epsilons, each at δ (the authors' code: total 2δ). Its gradient
    sensitivity and rank coupling are wrong
    (docs/algorithms/dc-dpsgd.md#why-the-papers-calibration-does-not-hold), so this number must only
    ever be shown with :data:`PAPER_CLAIM_LABEL`. With σ_tr = 0 the paper claims nothing (∞).
    """

    epsilon: float
    delta: float
    epsilon_trace: float
    epsilon_gradient: float
    label: str = PAPER_CLAIM_LABEL

    def as_report_entry(self) -> dict[str, Any]:
        return claim_entry(
            epsilon=self.epsilon,
            delta=self.delta,
            details={"epsilon_trace": self.epsilon_trace, "epsilon_gradient": self.epsilon_gradient},
            explanation=(
                "The paper composes a 'trace' ε and a 'gradient' ε with the wrong gradient "
                "sensitivity and no rank coupling "
                "(docs/algorithms/dc-dpsgd.md#why-the-papers-calibration-does-not-hold); the ledger ε above "
                "is the only valid guarantee."
            ),
        )


def paper_claimed_epsilon(
    *,
    sampling_probability: float,
    steps: int,
    delta: float,
    noise_multiplier: float,
    sigma_tr: float,
) -> PaperClaim:
    """ε_tr + ε_dp as the paper (Thm 5.1) and the authors' code (RDP, δ per half) compute it.

    ε_dp: T subsampled Gaussians with noise multiplier σ (the job's gradient multiplier);
    ε_tr: T subsampled Gaussians with noise σ_tr on sensitivity-1 traces. RDP accountant with
    the RDP→DP conversion at δ for each half, so the claimed pair is (ε_tr + ε_dp, 2δ).
    """
    eps_dp = poisson_gaussian_rdp_epsilon(
        sampling_probability=sampling_probability, noise_multiplier=noise_multiplier, steps=steps, delta=delta
    )
    eps_tr = poisson_gaussian_rdp_epsilon(
        sampling_probability=sampling_probability, noise_multiplier=sigma_tr, steps=steps, delta=delta
    )
    return PaperClaim(
        epsilon=eps_tr + eps_dp,
        delta=2.0 * delta,
        epsilon_trace=eps_tr,
        epsilon_gradient=eps_dp,
    )
