"""Catalogue entries of the KL-condition family (Menart, Ullah, Arora, Bassily, Guzmán;
docs/algorithms/kl-family.md), sound form: ``kl-spider`` (Alg 1), ``adaptive-noisy-gd`` (Alg 3),
``noisy-gd`` (Alg 4 on its own) and ``proximal-point`` (Alg 2 with Alg 4 as the inner solver).

Four full-batch algorithms whose plans charge in ρ-zCDP with ρ = 1/(2σ²): the privacy derivation
and the budget units are in algorithms/kl_family/accounting.py, the public schedules in
algorithms/kl_family/schedules.py, the schemas in algorithms/kl_family/hyperparameters.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from algorithms.kl_family.accounting import (
    BUDGET_UNITS,
    budget_units_event,
    full_batch_passes,
    gaussian_steps_event,
    rho_of,
)
from algorithms.kl_family.hyperparameters import (
    AdaptiveNoisyGDHyperparameters,
    KLSpiderHyperparameters,
    NoisyGDHyperparameters,
    ProximalPointHyperparameters,
)
from algorithms.kl_family.schedules import adaptive_constants
from algorithms.paper_claims import stated_claim_entry
from algorithms.registry import AlgorithmDefinition, PrivacyPlan, register_algorithm
from algorithms.steps_charges import COMPOSED, SELF_SCHEDULED_BUDGET_UNITS
from algorithms.training_fields import ENGINE_OPTION_UNUSED_REASONS, SCHEDULE_FIELDS
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import PrivacyEvent
from kernel.schemas.jobs import TrainingSpec

__all__ = ["AdaptiveNoisyGD", "KLSpider", "NoisyGD", "ProximalPoint"]


_KLH = TypeVar(
    "_KLH",
    KLSpiderHyperparameters,
    AdaptiveNoisyGDHyperparameters,
    NoisyGDHyperparameters,
    ProximalPointHyperparameters,
)


class _KLAlgorithm(AlgorithmDefinition[_KLH]):
    family = "kl-condition"
    tasks: ClassVar[frozenset[str]] = frozenset({"classification", "regression"})
    """Full-batch methods analysed for one loss per feature vector: a language model's token losses are
    out of their scope (and one full pass per step over a text corpus would be prohibitive)."""
    training_fields = SCHEDULE_FIELDS | {"rows_per_unit"}
    unused_training_reasons: ClassVar[Mapping[str, str]] = {
        "batch_size": "is full-batch",
        "learning_rate": "takes its step sizes from the paper's schedule",
        "ema_decay": "releases the iterate its analysis bounds",
        **{k: v for k, v in ENGINE_OPTION_UNUSED_REASONS.items() if k != "rows_per_unit"},
    }
    full_batch = True
    # Per person: every release uses every unit's mean gradient over its row slots, clipped to L0
    # as one vector, and divides by the public number of units (algorithms/kl_family/common.py).
    clips_per_sample: ClassVar[bool] = True
    privacy_units: ClassVar[bool] = True
    paper = (
        "Menart, Ullah, Arora, Bassily, Guzmán, Differentially Private Non-Convex Optimization "
        "under the KL Condition with Optimal Rates; sound add/remove calibration per privtrain "
        "docs/algorithms/kl-family.md"
    )
    unit_based: bool = True
    # Checked in worker/optimizers/kl_*.py: every release (FullBatch.release / noisy_gradient /
    # noisy_scalar) adds N(0, s²) noise to a clipped sum, a difference or a norm of L2-sensitivity
    # Δ; every stop and noise choice reads released values only (a Gaussian zCDP filter).
    zcdp_leaves_are_gaussian = True
    paper_claim: ClassVar[tuple[str, str] | None] = None
    """(claim, why it does not hold): the paper's privacy claim, shown labelled, never charged."""
    utility_caveat: ClassVar[str | None] = None

    def plan(
        self,
        hyperparameters: _KLH,
        training: TrainingSpec,
        facts: DatasetFacts,
        *,
        training_fraction: float = 1.0,
    ) -> PrivacyPlan:
        passes = full_batch_passes(training)
        event_for: Callable[[float, int], PrivacyEvent] = (
            budget_units_event if self.unit_based else gaussian_steps_event
        )
        return PrivacyPlan(
            steps=BUDGET_UNITS if self.unit_based else passes,
            sampling_probability=1.0,
            expected_batch_size=training_fraction * facts.n_privacy_units,
            sensitivity=float(hyperparameters.L0),
            sampling="full-batch",
            event_for=event_for,
        )

    def _common_notes(self, noise_multiplier: float) -> dict[str, Any]:
        rho = rho_of(noise_multiplier)
        notes: dict[str, Any] = {
            "neighbouring_relation": "add/remove one privacy unit (a row, or a person with all their rows); "
            "averages normalised by the public n (of rows, or of persons)",
            "sampling": "full batch (q = 1, no amplification)",
            "rho_zcdp": rho if self.unit_based else None,
        }
        if self.unit_based:
            notes["steps_are_budget_units"] = (
                f"a step of this job is ρ/{BUDGET_UNITS} of its budget ρ = 1/(2σ²); steps_run is "
                "the number of units the run actually spent (rounded up)"
            )
        return notes

    def own_notes(self, hyperparameters: _KLH, plan: PrivacyPlan, *, noise_multiplier: float) -> dict[str, Any]:
        """The algorithm's own report sections, after the family's; none by default."""
        return {}

    def report_notes(
        self, hyperparameters: _KLH, plan: PrivacyPlan, *, noise_multiplier: float, delta: float
    ) -> dict[str, Any]:
        notes = self._common_notes(noise_multiplier)
        notes.update(self.own_notes(hyperparameters, plan, noise_multiplier=noise_multiplier))
        if self.paper_claim is not None:
            claim, explanation = self.paper_claim
            notes["paper_claim"] = stated_claim_entry(claim=claim, explanation=explanation)
        if self.utility_caveat is not None:
            notes["utility_caveat"] = self.utility_caveat
        return notes


@register_algorithm
class KLSpider(_KLAlgorithm[KLSpiderHyperparameters]):
    name = "kl-spider"
    steps_charge = SELF_SCHEDULED_BUDGET_UNITS
    summary = (
        "Algorithm 1 (KL Spider, κ ∈ [1, 2]): full-batch normalised noisy GD with SPIDER gradient "
        "tracking in K public rounds; clipped per-example gradients (L0) and clipped per-example "
        "gradient differences (C_k); noise calibrated exactly in ρ-zCDP under add/remove with ρ = "
        "1/(2σ²); steps are budget units. Full batch (the service records batch_size = n); "
        "training.steps caps the full passes; no learning_rate."
    )
    Hyperparameters = KLSpiderHyperparameters
    paper_claim = (
        "Thm 1: ρ-zCDP under replace-one neighbours with the paper's σ's",
        "under the paper's own replace-one Definition 2 its noise costs ≈2.125ρ "
        "(docs/algorithms/kl-family.md#why-the-papers-calibration-does-not-hold); the ledger "
        "charges the exact add/remove cost above",
    )
    utility_caveat = "the rate of Thm 1 needs the declared L0, L1, γ, κ, F0 to hold; privacy does not"


@register_algorithm
class AdaptiveNoisyGD(_KLAlgorithm[AdaptiveNoisyGDHyperparameters]):
    name = "adaptive-noisy-gd"
    steps_charge = SELF_SCHEDULED_BUDGET_UNITS
    summary = (
        "Algorithm 3 (adaptive noisy GD): full-batch GD with step 1/(2L1) whose gradient noise "
        "scales with a privately released gradient norm; a zCDP filter at ρ/2 with per-iteration "
        "cost ≤ ρ/2 (ρ = 1/(2σ²)) and a stop after a floor step. Needs no γ, κ or F0. Steps are "
        "budget units: an early stop is settled with the units spent. Full batch (the service "
        "records batch_size = n); training.steps caps the iterations; no learning_rate."
    )
    Hyperparameters = AdaptiveNoisyGDHyperparameters
    paper_claim = (
        "Thm 3: ρ-zCDP with the charge ρ_t = min{L0²dA/(n²N_t²), ρ/2} + √ρ/n",
        "the paper's ρ_t under-charges when N_t is small or negative; the "
        "ledger charges the exact cost of the noise actually drawn",
    )

    def own_notes(
        self, hyperparameters: AdaptiveNoisyGDHyperparameters, plan: PrivacyPlan, *, noise_multiplier: float
    ) -> dict[str, Any]:
        notes: dict[str, Any] = {}
        rho, n, L0 = rho_of(noise_multiplier), plan.expected_batch_size, hyperparameters.L0
        constants = adaptive_constants(n=n, d=1, rho=rho, L0=L0, beta=hyperparameters.beta)
        if constants is None:
            notes["no_op"] = "n√ρ is too small for the ρ/2 filter: the model is returned untouched"
        else:
            notes["noise"] = {
                "norm_release_std": constants.norm_noise,
                "gradient_floor_std": constants.floor_noise,
                "max_iterations": constants.max_iterations,
                "rule": "gradient std max(N_t⁺/√(d·A), floor) from the released norm N_t",
            }
        return notes


@register_algorithm
class NoisyGD(_KLAlgorithm[NoisyGDHyperparameters]):
    name = "noisy-gd"
    steps_charge = COMPOSED
    unit_based = False
    summary = (
        "Algorithm 4 (noisy GD): full-batch projected noisy GD on F(w) + L̃1‖w − w0‖² with steps "
        "1/(L̃1·s) and the weighted average of the iterates as output. Each step adds N(0, (σ·L0)²) "
        "to the sum of per-example gradients clipped to L0 (a Gaussian, 1/(2σ²)-zCDP). "
        "training.steps = noisy steps (⌈epochs⌉); full batch (the service records batch_size = n); "
        "no learning_rate."
    )
    Hyperparameters = NoisyGDHyperparameters

    def own_notes(
        self, hyperparameters: NoisyGDHyperparameters, plan: PrivacyPlan, *, noise_multiplier: float
    ) -> dict[str, Any]:
        return {"rho_zcdp": plan.steps * rho_of(noise_multiplier)}  # replaces the family's None


@register_algorithm
class ProximalPoint(_KLAlgorithm[ProximalPointHyperparameters]):
    name = "proximal-point"
    steps_charge = SELF_SCHEDULED_BUDGET_UNITS
    summary = (
        "Algorithm 2 (proximal point, κ ≥ 2): T_out public prox steps on F + L̃1‖w − w_{t−1}‖², each "
        "solved by Algorithm 4 capped at max_inner_steps noisy steps; ρ = 1/(2σ²) split evenly "
        "over all inner releases. Steps are budget units; full batch (the service records "
        "batch_size = n); training.steps caps the full passes; no learning_rate."
    )
    Hyperparameters = ProximalPointHyperparameters
    paper_claim = (
        "Thm 2: ρ-zCDP with σ² = 4L0²T_in/(n²ρ_in)",
        "that noise costs ρ/2 under replace-one and ρ/8 under add/remove; the "
        "ledger charges the exact cost of the tight calibration used here",
    )
