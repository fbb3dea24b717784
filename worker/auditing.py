"""One-run privacy audit of a DP-SGD-style step with gradient canaries.

Usage and results: docs/evaluation-and-auditing.md#auditing-the-noise-empirically.

Why: a printed ε is only as good as the code that adds the noise. This harness runs the REAL
aggregators of the worker (projection, split, clipping) and the real noise function on a dataset
built by the auditor, and turns what the step released into an empirical ε lower bound with
:func:`kernel.privacy.audit.one_run_epsilon_lower_bound` (Steinke, Nasr, Jagielski 2023). A
configuration whose lower bound exceeds the ε it claims is broken; ours must never be.

The white-box design (the adversary chooses every row and sees the released noisy sum):

- ``canaries`` rows, each included independently with probability 1/2. Canary j's gradient is
  a large multiple of ``(a·u, e_j)``: a small dense non-negative part u on the projected
  ``marker`` tensor (so every canary has a large projected trace λ and lands in the DC tail) and
  a Dirac on its own slot j of the ``probe`` embedding. After clipping to c its probe
  coordinate carries c/√(1 + a²).
- ``fillers`` rows with a zero gradient (λ = 0): under the RANK rule they make the batch large
  enough that ⌊p·|S|⌋ exceeds the number of included canaries, so every included canary is
  clipped at c1. They are the rest of the dataset, identical in both worlds.
- One step with q = 1 (the whole dataset is the batch). Score j = the released probe
  coordinate j. The auditor guesses "in" for the ``guess_fraction/2`` highest scores and "out"
  for as many lowest, abstaining in between; the fraction is fixed before the run.

``code_compat_noise_std`` is the published code's gradient-noise formula (table N1): it exists
only here, to show that the audit catches it. It is not reachable from the catalogue or the API.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from algorithms.dc_dpsgd.aggregators import tail_count
from dp.loop.batch_loop import BatchAggregator
from dp.per_example.per_sample import supported_module
from dp.randomness.noise import privatise_sum
from dp.randomness.secure_random import SecureRandom
from kernel.privacy.audit import one_run_epsilon_lower_bound

__all__ = [
    "AuditResult",
    "CanaryDesign",
    "CanaryProbe",
    "NoiseRule",
    "audit_one_step",
    "canary_batch",
    "code_compat_noise_rule",
    "code_compat_noise_std",
    "count_correct_guesses",
    "sound_noise_rule",
]


@supported_module
class CanaryProbe(nn.Module):
    """A linear ``marker`` part (projected) plus a one-slot-per-canary ``probe`` embedding.

    Input row: marker features, then the row's slot id as a float (canary j → j, fillers → the
    last slot). The embedding keeps the input narrow however many canaries there are; rows are
    treated independently, so the per-sample engine may take it.
    """

    def __init__(self, marker_size: int, canaries: int) -> None:
        super().__init__()
        self.marker_size = marker_size
        self.marker = nn.Linear(marker_size, 1, bias=False)
        self.probe = nn.Embedding(canaries + 1, 1)
        nn.init.zeros_(self.marker.weight)
        nn.init.zeros_(self.probe.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slots = x[:, self.marker_size].long()
        scores: torch.Tensor = self.marker(x[:, : self.marker_size]) + self.probe(slots)
        return scores


@dataclass(frozen=True)
class CanaryDesign:
    canaries: int
    fillers: int
    marker_size: int = 400
    marker_weight: float = 0.05
    """a: the dense marker part's norm relative to the canary's Dirac (small keeps c on e_j)."""
    target: float = -1e3
    """MSE target of a canary row; at w = 0 its gradient is −2·target·x, far above any clip."""

    @property
    def probe_share(self) -> float:
        """Fraction of a clipped canary's norm on its own probe coordinate: 1/√(1 + a²)."""
        return 1.0 / math.sqrt(1.0 + self.marker_weight**2)


def canary_batch(design: CanaryDesign, generator: SecureRandom) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X, y, included): the included canaries' rows, then the fillers' rows (all-zero features,
    target 0, the spare slot: a zero gradient)."""
    included = generator.uniform(design.canaries, dtype=torch.float64).cpu() < 0.5
    chosen = torch.nonzero(included).squeeze(1)
    X = torch.zeros(chosen.numel() + design.fillers, design.marker_size + 1)
    X[: chosen.numel(), : design.marker_size] = design.marker_weight / math.sqrt(design.marker_size)
    X[: chosen.numel(), design.marker_size] = chosen.float()
    X[chosen.numel() :, design.marker_size] = float(design.canaries)
    y = torch.zeros(X.shape[0])
    y[: chosen.numel()] = design.target
    return X, y, included


NoiseRule = Callable[[int], float]
"""Batch size |S| ↦ the std of the one Gaussian vector added to the released sum."""


def sound_noise_rule(aggregator: BatchAggregator, noise_multiplier: float) -> NoiseRule:
    """What the service does: σ·Δ with Δ the aggregator's add/remove sensitivity."""
    return lambda batch_size: noise_multiplier * aggregator.sensitivity


def code_compat_noise_std(*, noise_multiplier: float, c1: float, c2: float, tail: int, batch: int) -> float:
    """UNSAFE — the published code's noise on the sum (table N1, row "code"):
    σ·√((m/B)²c1² + (1 − m/B)²c2²) with m the tail count and B the realised batch size."""
    share = tail / batch if batch else 0.0
    return noise_multiplier * math.sqrt((share * c1) ** 2 + ((1.0 - share) * c2) ** 2)


def code_compat_noise_rule(*, noise_multiplier: float, c1: float, c2: float, p: float) -> NoiseRule:
    """UNSAFE — the code's formula for the RANK rule's realised tail count ⌊p·|S|⌋."""
    return lambda batch_size: code_compat_noise_std(
        noise_multiplier=noise_multiplier,
        c1=c1,
        c2=c2,
        tail=tail_count(batch_size, p),
        batch=batch_size,
    )


def count_correct_guesses(scores: torch.Tensor, included: torch.Tensor, *, guesses: int) -> int:
    """Guess "in" for the guesses/2 highest scores, "out" for the guesses/2 lowest."""
    if guesses % 2 or not 0 <= guesses <= scores.numel():
        raise ValueError(f"guesses must be even and at most {scores.numel()}, got {guesses}")
    order = torch.argsort(scores, descending=True, stable=True)
    half = guesses // 2
    guessed_in, guessed_out = order[:half], order[scores.numel() - half :]
    return int(included[guessed_in].sum()) + int((~included[guessed_out]).sum())


@dataclass(frozen=True)
class AuditResult:
    canaries: int
    guesses: int
    correct: int
    epsilon_lower_bound: float


def audit_one_step(
    *,
    design: CanaryDesign,
    aggregator: BatchAggregator,
    noise: NoiseRule,
    delta: float,
    guess_fraction: float = 0.8,
    confidence: float = 0.95,
    max_physical_batch_size: int = 4096,
    generator: SecureRandom,
) -> AuditResult:
    """Run one released step on a canary batch and return the audit's ε lower bound at δ."""
    X, y, included = canary_batch(design, generator)
    model = CanaryProbe(design.marker_size, design.canaries)
    total = aggregator.clipped_sum(
        model,
        X,
        y,
        step=0,
        loss="mse",
        max_physical_batch_size=max_physical_batch_size,
        generator=generator,
    )
    released = privatise_sum(total, noise_std=noise(X.shape[0]), normaliser=1.0, generator=generator)
    scores = released["probe.weight"].reshape(-1)[: design.canaries].double()
    guesses = 2 * int(guess_fraction * design.canaries / 2)
    correct = count_correct_guesses(scores, included, guesses=guesses)
    bound = one_run_epsilon_lower_bound(
        canaries=design.canaries,
        guesses=guesses,
        correct=correct,
        delta=delta,
        confidence=confidence,
    )
    return AuditResult(canaries=design.canaries, guesses=guesses, correct=correct, epsilon_lower_bound=bound)
