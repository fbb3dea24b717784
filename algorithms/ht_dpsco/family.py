"""What the heavy-tailed high-dimensional DP-SCO family's entries share (Hu, Ni, Xiao, Wang):
the privacy argument, the plan's helpers and the base classes of the entries
(algorithms/ht_dpsco/definition.py; docs/algorithms/heavy-tailed-dpsco.md). Torch-free.

Privacy (add/remove neighbours, docs/privacy-model.md#neighbours; the formulas live in
algorithms/ht_dpsco/calibration.py):

* Blocks (Alg 1, 3, 5). Every training row is assigned to one of T blocks by its own uniform draw
  from the job's generator, so adding a row changes exactly one block and leaves the others'
  assignment unchanged. Block t is used only in iteration t and normalised by the PUBLIC expected
  block size m = n_train/T. Conditioned on the added row's block t, iterations ≠ t see identical
  data (later ones are post-processing), so the run costs what iteration t costs; the output is a
  mixture over t of such runs and exp((α−1)·D_α) is jointly convex, so the RDP of the whole run at
  every order is at most that of ONE iteration (parallel composition). ``event_for(σ, k)`` is
  therefore one iteration's event for any k ≥ 1 (and nothing for k = 0).
* Alg 1 / Alg 2: exponential mechanism over the polytope's vertices with logits
  −⟨v, g̃⟩/(2Δσ), Δ the add/remove sensitivity of the score. It is (1/σ)-bounded-range, charged as
  ``ExponentialMechanismEvent(ε = 1/σ)`` (RDP min(ε, αε²/8)). σ = 1/ε_step: the inverse of the
  per-iteration ε. The optional Laplace report-noisy-max selection (score + Lap(2Δσ)) is pure
  (1/σ)-DP: ``PureDPEvent``. Alg 2 uses all rows in every iteration: T such events.
* Peeling (Alg 3, 5): s rounds of Laplace(b) report-noisy-max on |v_j| (each (2λ/b)-DP for an
  ℓ∞-sensitivity λ) and Laplace(b) on the s released values (each a Laplace mechanism with
  sensitivity λ). σ = b/λ; one Peeling is ``ComposedEvent(PureDPEvent(2/σ) × s, LaplaceEvent(σ) × s)``
  — the exact composition of its 2s pieces in RDP (the ledger's currency), which the calibration
  solves for the target (ε, δ). The paper's b = 2λ√(3s·ln(1/δ))/ε is shown in the report only.

Training spec mapping (documented in each schema): ``training.steps`` = T, the number of
iterations (blocks); ``training.epochs`` must be 1 and then T comes from the preset's formula.
``batch_size`` and ``learning_rate`` are not read (the block size is n_train/T; step sizes are
the hyperparameters below, with the paper's defaults), so a spec that gives them is refused;
``ht-private-lasso`` is full batch and the service records ``batch_size`` = n for it.
Public constants (τ, α, γ, μ, M, s*, radii, scales) are user inputs, never estimated from data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final, Generic, Protocol, TypeVar

from algorithms.ht_dpsco import calibration as cal
from algorithms.ht_dpsco.hyperparameters import HTHyperparameters, SparseHyperparameters
from algorithms.registry import AlgorithmDefinition, InvalidHyperparameters, PrivacyPlan
from algorithms.training_fields import ENGINE_OPTION_UNUSED_REASONS, SCHEDULE_FIELDS
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import ComposedEvent, LaplaceEvent, PrivacyEvent, PureDPEvent
from kernel.schemas.jobs import TrainingSpec

__all__ = [
    "HTAlgorithm",
    "PeelingAlgorithm",
    "block_size",
    "check_peeling_rows",
    "design_delta",
    "em_notes",
    "loss_family",
    "once",
    "peeling_event",
]

PAPER: Final[str] = (
    "Hu, Ni, Xiao, Wang, High Dimensional Differentially Private Stochastic Optimization with "
    "Heavy-tailed Data (PODS 2022); privtrain docs/algorithms/heavy-tailed-dpsco.md"
)
TRAINING_MAPPING: Final[str] = (
    "training.steps = T (number of iterations / disjoint blocks); training.epochs must be 1 and "
    "then T is the preset's formula; training.batch_size and training.learning_rate are not given "
    "(block size n_train/T, or n for ht-private-lasso; step sizes are hyperparameters)"
)
PAPER_PRESET_LABEL: Final[str] = "the paper's §6.2 experimental settings (preset 'paper-experiments')"


def block_size(training_rows: float, iterations: int) -> float:
    block = training_rows / iterations
    if block < 1.0:
        raise InvalidHyperparameters(
            f"T = {iterations} iterations leave fewer than one expected row per block ({training_rows:g} training rows)"
        )
    return block


def loss_family(facts: DatasetFacts, *, allow_classification: bool) -> str:
    """The loss family the task implies: 'regression' or 'logistic' (two classes only)."""
    if facts.task == "regression":
        return "regression"
    if not allow_classification:
        raise InvalidHyperparameters("this algorithm handles the squared loss only: use a regression dataset")
    if facts.n_classes != 2:
        raise InvalidHyperparameters("the logistic loss of this family needs exactly two classes")
    return "logistic"


def once(steps: int) -> int:
    """Parallel composition: any k ≥ 1 disjoint-block iterations cost one iteration."""
    return 1 if steps >= 1 else 0


def peeling_event(noise_multiplier: float, *, sparsity: int, uses: int) -> PrivacyEvent:
    """``uses`` Peelings with Laplace scale b = σ·λ: s selections, each (2/σ)-DP, and s
    released coordinates, each a Laplace mechanism with b/λ = σ."""
    return ComposedEvent(
        events=(
            PureDPEvent(epsilon=2.0 / noise_multiplier, count=sparsity * uses),
            LaplaceEvent(noise_multiplier=noise_multiplier, count=sparsity * uses),
        )
    )


def design_delta(training_rows: float) -> float:
    """The paper's δ = n^{-1.1}, used only inside parameter formulas (never for the charge)."""
    return float(training_rows**-1.1)


_HTH = TypeVar("_HTH", bound=HTHyperparameters)
_Resolved = TypeVar("_Resolved")


class HTAlgorithm(AlgorithmDefinition[_HTH], Generic[_HTH, _Resolved]):
    """The family's shared contract: ``resolve`` derives every public constant of a run."""

    family = "heavy-tailed-dpsco"
    paper = PAPER
    tasks: ClassVar[frozenset[str]] = frozenset({"classification", "regression"})
    """Linear models on feature vectors only (linear and logistic regression): no language models."""
    models: ClassVar[frozenset[str] | None] = frozenset({"linear-regression", "logistic-regression"})
    """The family's updates are closed forms for one weight vector ⟨w, x⟩ (worker: ``linear_layer``)."""
    training_fields = SCHEDULE_FIELDS
    unused_training_reasons: ClassVar[Mapping[str, str]] = {
        "batch_size": "is single-pass over disjoint blocks of n_train/T rows",
        "learning_rate": "takes its step sizes from its hyperparameters",
        "ema_decay": "releases the iterate its analysis bounds",
        **ENGINE_OPTION_UNUSED_REASONS,
    }

    def resolve(
        self, hyperparameters: _HTH, *, training: TrainingSpec, training_rows: float, facts: DatasetFacts
    ) -> _Resolved:
        """Every public constant of the run (T, scales, sensitivities), derived once for the
        catalogue's plan and again, from the same public facts, by the worker's trainer."""
        raise NotImplementedError

    def plan(
        self,
        hyperparameters: _HTH,
        training: TrainingSpec,
        facts: DatasetFacts,
        *,
        training_fraction: float = 1.0,
    ) -> PrivacyPlan:
        training_rows = training_fraction * facts.n_rows  # expected: (1 − f)·n
        resolved = self.resolve(hyperparameters, training=training, training_rows=training_rows, facts=facts)
        return self.plan_resolved(hyperparameters, resolved)

    def plan_resolved(self, hyperparameters: _HTH, resolved: _Resolved) -> PrivacyPlan:
        """The plan of a run whose public constants `resolve` derived."""
        raise NotImplementedError

    def adopt_privacy_target(self, hyperparameters: _HTH, *, target_epsilon: float | None) -> _HTH:
        """design_epsilon defaults to the job's target ε (public), so the formulas match the charge."""
        if hyperparameters.design_epsilon is not None:
            return hyperparameters
        return hyperparameters.model_copy(update={"design_epsilon": min(target_epsilon or 1.0, 100.0)})

    def report_notes(
        self, hyperparameters: _HTH, plan: PrivacyPlan, *, noise_multiplier: float, delta: float
    ) -> dict[str, Any]:
        notes: dict[str, Any] = {
            "neighbouring": "add/remove one row; sensitivities are half the paper's replace-one values",
            "training_spec_mapping": TRAINING_MAPPING,
            "sensitivity_norm": "ℓ∞ (of the gradient estimate / half-step), not ℓ2",
            "public_constants": "all moment bounds, scales and radii are user-declared public "
            "inputs; none is estimated from the data",
        }
        if hyperparameters.preset == "paper-experiments":
            notes["paper_experiments_preset"] = {"label": PAPER_PRESET_LABEL, "why_poor": self.paper_preset_caveat}
        return notes

    paper_preset_caveat: ClassVar[str] = ""


def em_notes(noise_multiplier: float, score_sensitivity: float, selection: str) -> dict[str, Any]:
    return {
        "mechanism": f"exponential mechanism over the polytope's vertices ({selection})",
        "noise_multiplier_meaning": "σ = 1/ε_step: logits are −⟨v, g̃⟩/(2Δσ)",
        "epsilon_per_iteration": 1.0 / noise_multiplier,
        "score_sensitivity": score_sensitivity,
    }


def check_peeling_rows(facts: DatasetFacts) -> None:
    if facts.n_rows < cal.PEELING_MIN_ROWS:
        raise InvalidHyperparameters(
            f"Peeling needs δ ≤ min(0.05, 1/n) for its (ε, δ) lemma; with δ < 1/n this requires n ≥ "
            f"{cal.PEELING_MIN_ROWS} rows, the dataset has {facts.n_rows}"
        )


class PeelingResolved(Protocol):
    """The public constants a Peeling plan reads."""

    @property
    def iterations(self) -> int: ...
    @property
    def block_size(self) -> float: ...
    @property
    def sensitivity(self) -> float: ...
    @property
    def sparsity(self) -> int: ...


_SparseH = TypeVar("_SparseH", bound=SparseHyperparameters)
_PeelingR = TypeVar("_PeelingR", bound=PeelingResolved)


class PeelingAlgorithm(HTAlgorithm[_SparseH, _PeelingR]):
    """Alg 3 and Alg 5: one Peeling per disjoint block, so one Peeling's cost."""

    def plan_resolved(self, hyperparameters: _SparseH, resolved: _PeelingR) -> PrivacyPlan:

        def event_for(noise_multiplier: float, steps: int) -> PrivacyEvent:
            return peeling_event(noise_multiplier, sparsity=resolved.sparsity, uses=once(steps))

        return PrivacyPlan(
            steps=resolved.iterations,
            sampling_probability=1.0 / resolved.iterations,
            expected_batch_size=resolved.block_size,
            sensitivity=resolved.sensitivity,
            sampling="disjoint-blocks",
            event_for=event_for,
            sensitivity_norm="linf",
        )

    def report_notes(
        self, hyperparameters: _SparseH, plan: PrivacyPlan, *, noise_multiplier: float, delta: float
    ) -> dict[str, Any]:
        # s does not depend on the data size; d is not needed once validated at planning
        sparsity = hyperparameters.sparsity_level(10**9)
        notes = super().report_notes(hyperparameters, plan, noise_multiplier=noise_multiplier, delta=delta)
        paper_b = cal.peeling_scale_paper(
            sensitivity=plan.sensitivity, sparsity=sparsity, epsilon=hyperparameters.formula_epsilon, delta=delta
        )
        notes.update(
            {
                "mechanism": "Peeling: s rounds of Laplace report-noisy-max on |v_j| (fresh noise each "
                "round) and Laplace noise on the s selected values; exact RDP composition of the 2s pieces",
                "noise_multiplier_meaning": "σ = b/λ: the Laplace scale per unit of ℓ∞ sensitivity",
                "laplace_scale": noise_multiplier * plan.sensitivity,
                "sparsity": sparsity,
                "composition": "parallel over disjoint per-row-random blocks: one Peeling's cost",
                "block_size": plan.expected_batch_size,
                "paper_calibration": {
                    "label": "the paper's b = 2λ√(3s·ln(1/δ))/ε at design_epsilon (Cai–Wang–Zhang Lemma 3.3); "
                    "not used — the charge is the RDP composition above",
                    "laplace_scale": paper_b,
                },
            }
        )
        if hyperparameters.formula_epsilon > 1.0:
            notes["warning"] = "Peeling's (ε, δ) lemma is verified only for ε ≤ 1"
        return notes
