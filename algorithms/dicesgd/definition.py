"""DiceSGD (Zhang, Bu, Wu, Hong, ICLR 2024): DP-SGD plus a hidden error-feedback vector, charged
with the SOUND accounting of docs/algorithms/dicesgd.md#sound-sensitivity only.

Mechanism (docs/algorithms/dicesgd.md#what-it-does; every quantity on Algorithm 2's AVERAGED scale, B the PUBLIC
expected batch size q·m, never the realised one). Per step t, on a Poisson batch S_t:

    c̄ = (1/B) Σ_{i∈S_t} φ(g_i)          φ = clip at C1 (dicesgd, dicesgd-adam) or g/(||g||+γ) (auto)
    ḡ = (1/B) Σ_{i∈S_t} g_i             (unclipped; never released)
    v = c̄ + ψ(e_t)                       ψ = clip at C2, or e/(||e||+γ) (auto); ||ψ(·)|| ≤ C2 always
    release  ṽ = v + N(0, σ1² I),        σ1 = σ·Δ — then an SGD or Adam step on ṽ (post-processing)
    e_{t+1} = e_t + ḡ − v                (the NOISELESS v: noise never enters e)

Privacy (docs/privacy-model.md#neighbours: add/remove neighbours D' = D ∪ {z}; re-derived):

1. Couple the two runs: the rows of D get the same inclusion bits in both, z gets b_t ~ Bern(q).
   Condition on ALL bits. The output distribution of either run is the mixture over the same bit
   distribution, and the hockey-stick / Rényi divergences are jointly quasi-convex in a shared
   mixing measure, so a bound valid for every fixed bit pattern bounds the mixture. This throws
   away subsampling amplification on purpose: after z's first inclusion, e ≠ e' at EVERY later step
   with probability 1 (the persistent difference that breaks the paper's Theorem 3.7), so
   amplification is not available.
2. For fixed bits, e_t is a deterministic function of the released ṽ_0..ṽ_{t−1} (which fix the
   iterates x_0..x_t) and of the data, in both runs. Step t is then a Gaussian mechanism on v_t,
   chosen adaptively, with
       ||v_t − v'_t|| ≤ ||c̄_t − c̄'_t|| + ||ψ(e_t) − ψ(e'_t)|| ≤ b_t·C1/B + 2·C2 ≤ C1/B + 2·C2.
   First term: the rows of D give identical per-sample terms at the same x_t, and z adds ONE term of
   norm ≤ C1 divided by the public B — one added row, so no factor 2 (replace-one would give 2C1/B).
   Second term: ψ(e_t) and ψ(e'_t) both lie in the ball of radius C2 whatever e_t, e'_t are, so
   their difference is at most the ball's diameter 2·C2; z's unclipped gradients can drive e'_t to
   point opposite to e_t, so this is attained and cannot be lowered without a gradient bound.
3. Δ = C1/B + 2·C2 is therefore ALREADY the add/remove value: the halving of the privacy model
   (#neighbours) applies to a sum of clipped per-row terms (replace = remove + add), i.e. to the
   c̄ term, which already is C1/B; the 2·C2 term is the diameter of the ball ψ maps into, the
   same under every neighbouring relation, and must not be halved.
4. T adaptive Gaussian mechanisms with noise std σ1 and sensitivity Δ compose; σ := σ1/Δ is the
   job's single scalar "noise_multiplier", and the charged event is
   ``GaussianEvent(noise_multiplier=σ, count=T)`` (its first k steps: count=k). This is exact
   μ-GDP with μ = √T/σ (Dong-Roth-Su); the ledger prices it by its RDP curve.

The worker adds the noise on the SUM scale: N(0, (σ·Δ_sum)² I) with Δ_sum = B·Δ = C1 + 2·B·C2,
then divides by B, which is noise std σ·Δ = σ1 on the average. ``PrivacyPlan.sensitivity`` is
Δ_sum, so the report's ``noise_std_on_sum`` (σ·sensitivity) is the noise really drawn.

dicesgd-auto: ||g/(||g||+γ)|| < 1 and ||e/(||e||+γ)|| < 1 for γ > 0, so Δ = 1/B + 2 (C1 = C2 = 1).
dicesgd-adam: Adam's moments are post-processing of ṽ; the event is dicesgd's.

The paper's Theorem 3.7 (and the code's calibration) is NOT a valid guarantee
(docs/algorithms/dicesgd.md#why-the-papers-calibration-does-not-hold: a canary attack reaches
TPR 0.30 at FPR 1e-3 where (2, 1e-5)-DP allows 0.0074). It is never charged; :func:`paper_claim`
computes it only for the report, under :data:`PAPER_CLAIM_LABEL`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from algorithms.baselines.definition import MAX_SMOOTHING, MIN_SMOOTHING
from algorithms.paper_claims import PAPER_CLAIM_LABEL, claim_entry, poisson_gaussian_rdp_epsilon
from algorithms.registry import (
    AlgorithmDefinition,
    PrivacyPlan,
    poisson_schedule,
    register_algorithm,
)
from algorithms.steps_charges import COMPOSED
from algorithms.training_fields import PER_UNIT_TRAINING_FIELDS, batch_size_of
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import GaussianEvent, PrivacyEvent
from kernel.schemas.jobs import TrainingSpec

__all__ = [
    "PAPER_CLAIM_LABEL",
    "DiceSGD",
    "DiceSGDAdam",
    "DiceSGDAdamHyperparameters",
    "DiceSGDAuto",
    "DiceSGDAutoHyperparameters",
    "DiceSGDHyperparameters",
    "PaperClaim",
    "Thresholds",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "paper_claim",
    "paper_closed_form_epsilon",
    "paper_closed_form_sigma",
    "sound_average_sensitivity",
    "sound_sigma1",
]


# ----------------------------------------------------------------------------- hyperparameters


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_C2_DESCRIPTION = (
    "C2: clip threshold of the error-feedback vector on Algorithm 2's AVERAGED scale (the scale "
    "of the clipped mean, whose norm is <= C1). The authors' code uses a sum-scale ratio r; its "
    "equivalent here is C2 = r·C1/B. Removing the clipping bias needs C2 >= C1; the charged "
    "sensitivity is C1/B + 2·C2, so C2 dominates the noise. 0 gives DPSGD-GC's trajectory."
)


class DiceSGDHyperparameters(_Strict):
    c1: float = Field(default=1.0, gt=0, le=1e4, description="C1: per-sample L2 clip threshold")
    c2: float = Field(default=1.0, ge=0, le=1e4, description=_C2_DESCRIPTION)
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD momentum on the released ṽ")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 penalty added to ṽ")


class DiceSGDAdamHyperparameters(_Strict):
    c1: float = Field(default=1.0, gt=0, le=1e4, description="C1: per-sample L2 clip threshold")
    c2: float = Field(default=1.0, ge=0, le=1e4, description=_C2_DESCRIPTION)
    beta1: float = Field(default=0.9, ge=0, lt=1, description="Adam's first-moment decay")
    beta2: float = Field(default=0.999, ge=0, lt=1, description="Adam's second-moment decay")
    eps: float = Field(default=1e-8, gt=0, le=1, description="Adam's denominator constant")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 penalty added to ṽ (Adam, not AdamW)")


class DiceSGDAutoHyperparameters(_Strict):
    gamma: float = Field(
        default=0.01,
        ge=MIN_SMOOTHING,
        le=MAX_SMOOTHING,
        description="γ > 0 in g/(||g|| + γ) and e/(||e|| + γ) (AUTO-S's stability constant; "
        "needed because e starts at 0)",
    )
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD momentum on the released ṽ")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 penalty added to ṽ")


@dataclass(frozen=True)
class Thresholds:
    """Bounds on ||φ(g)|| (C1) and ||ψ(e)|| (C2) on the averaged scale."""

    c1: float
    c2: float


def sound_average_sensitivity(*, c1: float, c2: float, expected_batch_size: float) -> float:
    """Δ = C1/B + 2·C2: add/remove L2 sensitivity of v on the averaged scale (module doc)."""
    if not (c1 > 0 and c2 >= 0 and expected_batch_size > 0):
        raise ValueError("need c1 > 0, c2 >= 0 and a positive expected batch size")
    return c1 / expected_batch_size + 2.0 * c2


# ----------------------------------------------------------------------------- catalogue entries


_DiceH = TypeVar("_DiceH", DiceSGDHyperparameters, DiceSGDAdamHyperparameters, DiceSGDAutoHyperparameters)


class _DiceSGDFamily(AlgorithmDefinition[_DiceH]):
    """The shared plan: Poisson batches, one Gaussian of sensitivity Δ per step, NO amplification."""

    family = "dicesgd"
    clips_per_sample: ClassVar[bool] = True
    privacy_units: ClassVar[bool] = True  # a sampled unit's mean gradient is clipped and fed back as one
    training_fields: ClassVar[frozenset[str]] = PER_UNIT_TRAINING_FIELDS
    paper = (
        "Zhang, Bu, Wu, Hong 2024, Differentially Private SGD Without Clipping Bias: An "
        "Error-Feedback Approach (ICLR); sound accounting per privtrain docs/algorithms/dicesgd.md"
    )

    def thresholds(self, hyperparameters: _DiceH) -> Thresholds:
        raise NotImplementedError

    def plan(
        self,
        hyperparameters: _DiceH,
        training: TrainingSpec,
        facts: DatasetFacts,
        *,
        training_fraction: float = 1.0,
    ) -> PrivacyPlan:
        q, steps = poisson_schedule(training, facts, training_fraction=training_fraction)
        batch = float(batch_size_of(training))  # = q·m, public
        bounds = self.thresholds(hyperparameters)
        delta_avg = sound_average_sensitivity(c1=bounds.c1, c2=bounds.c2, expected_batch_size=batch)

        def event_for(noise_multiplier: float, k: int) -> PrivacyEvent:
            # One plain Gaussian per step: subsampling gives nothing for the persistent e-term.
            return GaussianEvent(noise_multiplier=noise_multiplier, count=k)

        return PrivacyPlan(
            steps=steps,
            sampling_probability=q,
            expected_batch_size=batch,
            sensitivity=batch * delta_avg,  # Δ_sum = C1 + 2·B·C2: the sum-scale noise is σ·Δ_sum
            sampling="poisson",
            event_for=event_for,
        )

    def report_notes(
        self,
        hyperparameters: _DiceH,
        plan: PrivacyPlan,
        *,
        noise_multiplier: float,
        delta: float,
    ) -> dict[str, Any]:
        bounds = self.thresholds(hyperparameters)
        batch = plan.expected_batch_size
        delta_avg = plan.sensitivity / batch
        claim = paper_claim(
            bounds,
            expected_batch_size=batch,
            sampling_probability=plan.sampling_probability,
            steps=plan.steps,
            sigma1=noise_multiplier * delta_avg,
            delta=delta,
        )
        return {
            "sound_accounting": {
                "mechanism": "per step one Gaussian mechanism on the averaged update direction, "
                "composed over the steps; NO subsampling amplification (the hidden error-feedback "
                "difference persists after a row's first inclusion)",
                "sensitivity_on_average": delta_avg,
                "sensitivity_formula": "C1/B + 2·C2 with B the public expected batch size "
                "(add/remove: one added row moves the clipped mean by <= C1/B; the clipped "
                "error-feedback term lies in a ball of radius C2, diameter 2·C2)",
                "thresholds": {"c1": bounds.c1, "c2": bounds.c2},
                "noise_std_on_average": noise_multiplier * delta_avg,
                "epsilon_gdp_exact": gdp_epsilon(mu=math.sqrt(plan.steps) / noise_multiplier, delta=delta),
                "epsilon_gdp_label": "exact (ε, δ) of the charged Gaussian composition "
                "(μ-GDP, Dong-Roth-Su); the ledger's RDP number above is what is charged",
            },
            "paper_claim": claim.as_report_entry(),
            "hidden_state": "the error-feedback vector is private worker state: never logged, reported or exported",
        }


@register_algorithm
class DiceSGD(_DiceSGDFamily[DiceSGDHyperparameters]):
    name = "dicesgd"
    steps_charge = COMPOSED
    summary = (
        "DP-SGD with per-sample clipping at C1 plus a hidden error-feedback vector e that "
        "accumulates what clipping removed; clip(e, C2) is added back before the Gaussian noise, "
        "which removes DPSGD-GC's constant clipping bias. Charged soundly: per step a Gaussian "
        "with sensitivity C1/B + 2·C2 and no subsampling amplification (far more noise than "
        "DP-SGD at equal ε); the paper's ε is shown only as an invalid claim."
    )
    Hyperparameters = DiceSGDHyperparameters

    def thresholds(self, hyperparameters: DiceSGDHyperparameters) -> Thresholds:
        return Thresholds(c1=hyperparameters.c1, c2=hyperparameters.c2)


@register_algorithm
class DiceSGDAdam(_DiceSGDFamily[DiceSGDAdamHyperparameters]):
    name = "dicesgd-adam"
    steps_charge = COMPOSED
    summary = (
        "DiceSGD's released direction fed to Adam (paper Algorithm 3, with its typos corrected: "
        "bias correction with t+1); the error feedback stays noiseless. Same sound charge as "
        "dicesgd."
    )
    Hyperparameters = DiceSGDAdamHyperparameters

    def thresholds(self, hyperparameters: DiceSGDAdamHyperparameters) -> Thresholds:
        return Thresholds(c1=hyperparameters.c1, c2=hyperparameters.c2)


@register_algorithm
class DiceSGDAuto(_DiceSGDFamily[DiceSGDAutoHyperparameters]):
    name = "dicesgd-auto"
    steps_charge = COMPOSED
    summary = (
        "Automatic DiceSGD (paper Algorithm 4, literal, unit thresholds): per-sample g/(||g||+γ) "
        "and e/(||e||+γ) instead of clipping. Charged soundly with C1 = C2 = 1: sensitivity "
        "1/B + 2 per step, no subsampling amplification."
    )
    Hyperparameters = DiceSGDAutoHyperparameters

    def thresholds(self, hyperparameters: DiceSGDAutoHyperparameters) -> Thresholds:
        return Thresholds(c1=1.0, c2=1.0)


# ----------------------------------------------------------------------------- Gaussian DP


def _log_phi(x: float) -> float:
    """log Φ(x), stable far into the lower tail (leading asymptotic term below −37)."""
    if x > -37.0:
        return math.log(0.5 * math.erfc(-x / math.sqrt(2.0)))
    return -0.5 * x * x - math.log(-x) - 0.5 * math.log(2.0 * math.pi)


def gdp_delta(*, epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth, Su 2022, Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    first = math.exp(_log_phi(-epsilon / mu + mu / 2.0))
    second = math.exp(epsilon + _log_phi(-epsilon / mu - mu / 2.0))
    return max(0.0, first - second)


def gdp_mu(*, epsilon: float, delta: float) -> float:
    """μ*(ε, δ): the largest μ whose μ-GDP is (ε, δ)-DP (δ is increasing in μ; bisection)."""
    low, high = 1e-9, 100.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if gdp_delta(epsilon=epsilon, mu=middle) > delta:
            high = middle
        else:
            low = middle
    return low


def gdp_epsilon(*, mu: float, delta: float) -> float | None:
    """Smallest ε with δ(ε; μ) ≤ δ (rounded up by the bisection); None beyond ε = 500."""
    if gdp_delta(epsilon=500.0, mu=mu) > delta:
        return None
    low, high = 0.0, 500.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if gdp_delta(epsilon=middle, mu=mu) > delta:
            low = middle
        else:
            high = middle
    return high


def sound_sigma1(
    *, epsilon: float, delta: float, steps: int, c1: float, c2: float, expected_batch_size: float
) -> float:
    """σ1 = √T·Δ/μ*(ε, δ), the noise std on the average for an exact (ε, δ): the sound calibration
    of docs/algorithms/dicesgd.md#sound-sensitivity."""
    sensitivity = sound_average_sensitivity(c1=c1, c2=c2, expected_batch_size=expected_batch_size)
    return math.sqrt(steps) * sensitivity / gdp_mu(epsilon=epsilon, delta=delta)


# ----------------------------------------------------------------------------- paper's claim


def paper_closed_form_sigma(*, n: float, steps: int, epsilon: float, delta: float, g_tilde: float) -> float:
    """(P-a) Theorem 3.7 as printed: σ1 = sqrt(32·T·G̃·ln(1/δ)) / (N·ε). NOT a guarantee."""
    return math.sqrt(32.0 * steps * g_tilde * math.log(1.0 / delta)) / (n * epsilon)


def paper_closed_form_epsilon(*, n: float, steps: int, sigma1: float, delta: float, g_tilde: float) -> float:
    """The ε that (P-a) attaches to a given σ1 (its inverse). NOT a guarantee."""
    return math.sqrt(32.0 * steps * g_tilde * math.log(1.0 / delta)) / (n * sigma1)


@dataclass(frozen=True)
class PaperClaim:
    """Theorem 3.7's number for a run — shown only under :data:`PAPER_CLAIM_LABEL`."""

    epsilon: float
    epsilon_closed_form: float
    delta: float
    g_tilde: float
    effective_noise_multiplier: float
    label: str = PAPER_CLAIM_LABEL

    def as_report_entry(self) -> dict[str, Any]:
        return claim_entry(
            epsilon=self.epsilon,
            delta=self.delta,
            details={"epsilon_closed_form": self.epsilon_closed_form, "g_tilde": self.g_tilde},
            explanation=(
                "Theorem 3.7 applies subsampling amplification to the hidden error-feedback term, "
                "whose difference persists after a row's first inclusion; a canary attack breaks "
                "it (docs/algorithms/dicesgd.md#why-the-papers-calibration-does-not-hold). "
                "'epsilon' is the theorem's model (amplified "
                "Gaussian, per-sample sensitivity sqrt(2·G̃), G̃ = C1² + 2·(B·C2)², the smallest "
                "C its hypothesis C2 <= C/B allows) run through an RDP accountant; "
                "'epsilon_closed_form' its printed formula. Only the ledger ε is a guarantee."
            ),
        )


def paper_claim(
    bounds: Thresholds,
    *,
    expected_batch_size: float,
    sampling_probability: float,
    steps: int,
    sigma1: float,
    delta: float,
) -> PaperClaim:
    """What the paper would claim for a run with noise std σ1 on the average
    (docs/algorithms/dicesgd.md#why-the-papers-calibration-does-not-hold).

    G̃ = C1² + 2·C² with C = B·C2 (the hypothesis C1 <= C2 <= C/B at its smallest C, no gradient
    bound). (P-c): a Poisson-subsampled Gaussian with multiplier σ1·B/sqrt(2·G̃), RDP → (ε, δ);
    (P-a): the printed closed form.
    """
    batch = expected_batch_size
    g_tilde = bounds.c1**2 + 2.0 * (batch * bounds.c2) ** 2
    z_eff = sigma1 * batch / math.sqrt(2.0 * g_tilde)
    epsilon = poisson_gaussian_rdp_epsilon(
        sampling_probability=sampling_probability, noise_multiplier=z_eff, steps=steps, delta=delta
    )
    closed = paper_closed_form_epsilon(
        n=batch / sampling_probability, steps=steps, sigma1=sigma1, delta=delta, g_tilde=g_tilde
    )
    return PaperClaim(
        epsilon=epsilon,
        epsilon_closed_form=closed,
        delta=delta,
        g_tilde=g_tilde,
        effective_noise_multiplier=z_eff,
    )
