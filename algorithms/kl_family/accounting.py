"""The KL-condition family's accounting, sound form (Menart, Ullah, Arora, Bassily, Guzmán;
docs/algorithms/kl-family.md).

Four full-batch algorithms: ``kl-spider`` (Alg 1), ``adaptive-noisy-gd`` (Alg 3), ``noisy-gd``
(Alg 4 on its own) and ``proximal-point`` (Alg 2 with Alg 4 as the inner solver). Every gradient
is the CLIPPED full-batch average G(w) = (1/n)·Σ_i clip_L0(∇f(w; x_i)); Spider's differences are
D(w', w) = (1/n)·Σ_i clip_C(clip_L0(∇f(w'; x_i)) − clip_L0(∇f(w; x_i))). The clips make privacy
independent of whether L0, L1, γ, κ, F0 are true properties of the loss: only utility needs them.
These constants are PUBLIC declarations of the user (schema bounds below); nothing is ever
estimated from the data.

Sensitivities under add/remove (docs/privacy-model.md#neighbours wins over the paper's replace-one Definition 2).
n is the PUBLIC normaliser: the registered row count times (1 − hold-out fraction), never the
realised row count. Adding or removing one row adds or removes ONE term of the sum. On a dataset
with a privacy unit column a term is one person's mean gradient over their row slots and n counts
persons: the same sensitivities hold per person.

* G: the sum Σ clip_L0(g_i) changes by one vector of norm ≤ L0, so Δ(G) = L0/n
  (replace-one: 2L0/n, the paper's value — halved).
* D(·,·;C): one term of norm ≤ C, so Δ(D) = C/n (replace-one 2C/n — halved).
* ‖G‖: |‖a‖ − ‖a'‖| ≤ ‖a − a'‖, so Δ(‖G‖) = L0/n (replace-one 2L0/n — halved).

A Gaussian release with L2-sensitivity Δ and noise N(0, s² I) is Δ²/(2s²)-zCDP (Bun–Steinke
Prop 1.6); releases compose additively, also when s is chosen from earlier releases (zCDP
filter, Whitehouse et al. 2023 / Feldman–Zrnic 2021 at every Rényi order). Every noise level
below is derived from an explicit allocation as s = Δ/√(2·allocation) — the paper's σ formulas
are never hard-coded (docs/algorithms/kl-family.md#sensitivities). Because Δ halves, every s
halves relative to the replace-one values (e.g. Spider's round-start noise at θ = 1/2 is
L0√K/(n√ρ), which is the paper's own σ̂ — the paper's accounting is exact under add/remove, not
under its replace-one Definition 2), and Spider's floor constant
C_floor = 8(√(2/θ) + 1/(2√(2(1−θ)))) (20 at θ = 1/2, 8√2 at θ = 1) instead of 40.

The one scalar σ ("noise_multiplier") the API calibrates:

* ``noisy-gd``: σ is the noise multiplier of each step — the noise std on the clipped SUM is σ·L0
  (std σ·L0/n on the average). Each step is a Gaussian with Δ = L0/n, i.e. 1/(2σ²)-zCDP;
  event_for(σ, k) = ZCDPEvent(ρ = 1/(2σ²), count = k) (k steps).
* ``kl-spider``, ``adaptive-noisy-gd``, ``proximal-point``: the paper derives the whole noise
  schedule (K, T_k, T_out, the noise of each release, the stopping floor) from the job's total
  ρ, so σ IS that scale: ρ = 1/(2σ²), the cost of one Gaussian release with noise multiplier σ.
  Since the number of releases depends on ρ (hence on σ), a "step" of these jobs is a BUDGET
  UNIT: the job's ρ is split into U = :data:`BUDGET_UNITS` units of ρ/U, plan.steps = U and
  event_for(σ, k) = ZCDPEvent(ρ = 1/(2σ²U), count = k). The worker tracks the exact spend
  (rational shares for Spider and proximal-point, the exact Δ²/(2s²) of the noise actually drawn
  for adaptive-noisy-gd) and reports ⌈U·spent/ρ⌉ units, so event_for(σ, k) always bounds the cost
  of what ran. Every stop — a round's gradient test, the adaptive filter, a floor step, the pass
  cap, a cancel — is a function of already-released noisy values and public constants, so the
  number of units consumed is itself public (post-processing) and settling with it is sound; the
  admission reserves all U units (the worst case). It is the argument of a cancel after TOUCH:
  within the job the releases form a zCDP filter (costs chosen from past releases, total ≤ ρ),
  and the ledger, which reserved the worst case up front, frees only what the released
  transcript shows was not spent. Noise std's are inflated by
  :data:`NOISE_SAFETY` (1 + 1e-9) over the allocation, so floating-point rounding can never push
  a release's true cost above what is counted.

Per algorithm (add/remove, ρ the job's budget, Δ = L0/n):

* kl-spider: K round starts, each allocated θρ/K: s_0 = Δ·√(K/(2θρ)). Round k has at most
  M_k = T_k − 1 differences, each allocated (1−θ)ρ/(K·M_k) with Δ_k = C_k/n, C_k = Φ̂_k^{1/κ}/(4γ):
  s_k = Δ_k·√(K·M_k/(2(1−θ)ρ)). Worst case Σ = θρ + (1−θ)ρ = ρ. θ = 1 when no round has a
  difference (e.g. κ = 2). If the paper's bracket for K is ≤ 0 the run returns w0 and spends 0.
* adaptive-noisy-gd: per iteration one scalar norm release N_t = ‖G‖ + N(0, ŝ²), ŝ = L0/(√n ρ^{1/4})
  (the paper's level; exact cost c_N = Δ²/(2ŝ²) = √ρ/(2n)), then G + N(0, s_t² I) with
  s_t = max(N_t⁺/√(dA), s_min), A = log(n√ρ/β), s_min = Δ/√(2(ρ/2 − c_N)) (cost ≤ ρ/2 − c_N).
  An iteration starts only while spent ≤ ρ/2 and costs ≤ ρ/2, so the total is ≤ ρ; the run stops
  after a floor step (s_t = s_min). s_t is a function of the released N_t only. Needs n√ρ > 1;
  otherwise it returns w0 and spends 0. Iterations ≤ 1 + n√ρ.
* noisy-gd / proximal-point inner steps: G + N(0, s² I). Proximal-point splits ρ evenly over
  T_out·S_in releases (the tight calibration): s = Δ·√(T_out·S_in/(2ρ)), S_in the capped
  number of inner steps; total exactly ρ.

Full batch: q = 1, no amplification anywhere. ``training.batch_size`` and
``training.learning_rate`` are not read, so a spec that gives them is refused (422); the service
records ``batch_size`` = the dataset's registered n itself. ``training.steps`` (or ⌈epochs⌉) is
the number of noisy gradient steps for ``noisy-gd`` and a public cap on full passes over the data
for the other three (a Spider difference counts as two passes); step sizes are the paper's
(normalised steps of length Φ̂^{1/κ}/(4γL1); 1/(2L1); 1/(L̃1·s)).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Final, Literal

from kernel.privacy import PrivacyEvent, ZCDPEvent
from kernel.schemas.jobs import TrainingSpec

__all__ = [
    "BUDGET_UNITS",
    "NEIGHBOUR_FACTOR",
    "NOISE_SAFETY",
    "Neighbour",
    "budget_units_event",
    "full_batch_passes",
    "gaussian_steps_event",
    "rho_of",
    "units_for",
]

Neighbour = Literal["add-remove", "replace-one"]
BUDGET_UNITS: Final[int] = 1000
"""U: a unit-based job's ρ is settled in multiples of ρ/U (at most one unit is over-charged)."""
NOISE_SAFETY: Final[float] = 1.0 + 1e-9
"""Every noise std is drawn this much above its allocation, so that float rounding can only
make a release cheaper than counted."""
NEIGHBOUR_FACTOR: Final[dict[str, float]] = {"add-remove": 1.0, "replace-one": 2.0}
"""Sensitivities under each neighbouring relation, relative to add/remove."""


def rho_of(noise_multiplier: float) -> float:
    """ρ of a unit-based job: the zCDP cost of one Gaussian release with multiplier σ."""
    return 1.0 / (2.0 * noise_multiplier * noise_multiplier)


def units_for(spent_share: float | Fraction) -> int:
    """Units charged for a spent share of ρ: ⌈U·share⌉ (never more than U: the allocation
    arithmetic is exact or has the NOISE_SAFETY margin, so a share above 1 is rounding only)."""
    if spent_share <= 0:
        return 0
    if isinstance(spent_share, Fraction):
        units = math.ceil(spent_share * BUDGET_UNITS)
    else:
        units = math.ceil(float(spent_share) * BUDGET_UNITS * (1.0 + 1e-12))
    return min(BUDGET_UNITS, units)


def full_batch_passes(training: TrainingSpec) -> int:
    """``training.steps`` or ⌈epochs⌉ (public): noisy-gd's steps, the others' cap on full passes."""
    if training.steps is not None:
        return training.steps
    assert training.epochs is not None
    return max(1, math.ceil(training.epochs))


def budget_units_event(noise_multiplier: float, units: int) -> PrivacyEvent:
    """``units`` budget units of a unit-based job: ρ/U each, ρ = 1/(2σ²)."""
    return ZCDPEvent(rho=rho_of(noise_multiplier) / BUDGET_UNITS, count=units)


def gaussian_steps_event(noise_multiplier: float, steps: int) -> PrivacyEvent:
    """``steps`` Gaussian releases with multiplier σ (noisy-gd): 1/(2σ²)-zCDP each."""
    return ZCDPEvent(rho=rho_of(noise_multiplier), count=steps)
