"""Every DP-critical scalar of the heavy-tailed DP-SCO family, as plain-float formulas.

Hu, Ni, Xiao, Wang, "High Dimensional Differentially Private Stochastic Optimization with
Heavy-tailed Data" (docs/algorithms/heavy-tailed-dpsco.md#sensitivities). One torch-free module so that the API (which
charges) and the worker (which draws) use the same numbers, and so that every hand-checked number is
a unit test (tests/unit/test_ht_calibration.py).

Neighbouring relation. The paper analyses replace-one neighbours; privtrain uses add/remove
(docs/privacy-model.md#neighbours). Every sensitivity below is a sum of per-row terms, each bounded by a public
constant B, divided by a public normaliser N (the expected block size m or the expected number
of training rows). Adding or removing one row adds or removes one term, so the add/remove
sensitivity is B/N — half of the replace-one value 2B/N that the paper uses. Functions named
``*_replace_one`` give the paper's value (for the hand-checked numbers); the others are the
add/remove values the service charges.

Natural logarithms throughout. Hidden O(·) constants are 1
(docs/algorithms/heavy-tailed-dpsco.md#paper-conventions).
"""

from __future__ import annotations

import math
from typing import Final

PHI_BOUND: Final[float] = 2.0 * math.sqrt(2.0) / 3.0
"""sup |φ| of the Catoni–Giulini soft truncation: every robust term is ≤ κ·PHI_BOUND."""


# ------------------------------------------------------------------------- Alg 1 (DP-FW)


def fw_theory_iterations(
    *, n: float, epsilon: float, alpha: float, tau: float, n_vertices: int, d: int, zeta: float
) -> int:
    """T = ⌈(nεα²/(τ·ln(|V|d/ζ)))^{1/3}⌉ (Thm 2)."""
    return max(1, math.ceil(float((n * epsilon * alpha**2 / (tau * math.log(n_vertices * d / zeta))) ** (1 / 3))))


def fw_theory_kappa(
    *, n: float, epsilon: float, tau: float, iterations: int, n_vertices: int, d: int, zeta: float
) -> float:
    """κ = √(nετ/(T·ln(|V|·d·T/ζ))) (Thm 2)."""
    return math.sqrt(n * epsilon * tau / (iterations * math.log(n_vertices * d * iterations / zeta)))


def fw_paper_iterations(*, n: float, epsilon: float) -> int:
    """§6.2: T = ⌊(nε)^{1/3}⌋."""
    return max(1, math.floor(float((n * epsilon) ** (1 / 3))))


def fw_paper_kappa(*, n: float, epsilon: float) -> float:
    """§6.2: κ = ⌊nε⌋ — contradicts the theory (docs/algorithms/heavy-tailed-dpsco.md#presets); preset only."""
    return float(max(1, math.floor(n * epsilon)))


def robust_mean_sensitivity(*, kappa: float, block_size: float) -> float:
    """ℓ∞ add/remove sensitivity of (1/m)Σψ_κ: one term of size ≤ κ·2√2/3 over the public m."""
    return PHI_BOUND * kappa / block_size


def fw_score_sensitivity(*, kappa: float, block_size: float, vertex_norm: float) -> float:
    """Δ of the score −⟨v, g̃⟩: ‖v‖₁-bound × ℓ∞ sensitivity of g̃ (add/remove)."""
    return vertex_norm * robust_mean_sensitivity(kappa=kappa, block_size=block_size)


def fw_score_sensitivity_replace_one(*, kappa: float, block_size: float, vertex_norm: float) -> float:
    """The paper's Δ = ‖𝒲‖₁·4√2κ/(3m) (replace-one; for the hand-checked numbers)."""
    return 2.0 * fw_score_sensitivity(kappa=kappa, block_size=block_size, vertex_norm=vertex_norm)


# ------------------------------------------------------------------------- Alg 2 (private LASSO)


def lasso_theory_iterations(*, n: float, epsilon: float, delta: float, lambda_max: float, d: int, zeta: float) -> int:
    """T = ⌈(√(nε)·λ_max/(√ln(1/δ)·ln(dn/ζ)))^{4/5}⌉ (Thm 5; T ≤ n inside the log)."""
    base = math.sqrt(n * epsilon) * lambda_max / (math.sqrt(math.log(1 / delta)) * math.log(d * n / zeta))
    return max(1, math.ceil(float(base**0.8)))


def lasso_paper_iterations(*, n: float, epsilon: float) -> int:
    """§6.2: T = ⌊(nε)^{2/5}⌋ (the paper gives no rounding: floored)."""
    return max(1, math.floor(float((n * epsilon) ** 0.4)))


def lasso_truncation(*, n: float, epsilon: float, iterations: int, fourth_moment: float | None = None) -> float:
    """K = (nε)^{1/4}/T^{1/8}; with ``fourth_moment`` M the scale-aware (M·nε)^{1/4}/T^{1/8}
    (the service's extension, not the paper's: docs/algorithms/heavy-tailed-dpsco.md#paper-conventions)."""
    scale = 1.0 if fourth_moment is None else fourth_moment
    return float((scale * n * epsilon) ** 0.25 / iterations**0.125)


def lasso_gradient_sensitivity(*, truncation: float, radius: float, n: float) -> float:
    """ℓ∞ add/remove sensitivity of g̃ = (2/n)Σx̃(⟨x̃,w⟩ − ỹ) for ‖w‖₁ ≤ r: one row adds
    |2x̃_j(⟨x̃,w⟩ − ỹ)| ≤ 2K(Kr + K) = 2K²(1 + r), over the public n."""
    return 2.0 * truncation**2 * (1.0 + radius) / n


def lasso_score_sensitivity(*, truncation: float, radius: float, n: float, vertex_norm: float) -> float:
    return vertex_norm * lasso_gradient_sensitivity(truncation=truncation, radius=radius, n=n)


def lasso_score_sensitivity_replace_one(*, truncation: float, radius: float, n: float, vertex_norm: float) -> float:
    """The paper's Δ = ‖𝒲‖₁·4(1+r)K²/n, i.e. 8‖𝒲‖₁K²/n for r = 1."""
    return 2.0 * lasso_score_sensitivity(truncation=truncation, radius=radius, n=n, vertex_norm=vertex_norm)


def lasso_paper_step_epsilon(*, epsilon: float, iterations: int, delta: float) -> float:
    """The paper's per-iteration ε₀ = ε/(2√(2T·ln(1/δ))) (advanced composition, Alg 2 step 2).
    The service charges the tighter RDP composition instead; this is for the report only."""
    return epsilon / (2.0 * math.sqrt(2.0 * iterations * math.log(1.0 / delta)))


# ------------------------------------------------------------------------- Peeling (Alg 4)


def peeling_scale_paper(*, sensitivity: float, sparsity: int, epsilon: float, delta: float) -> float:
    """b = 2λ√(3s·ln(1/δ))/ε (Cai–Wang–Zhang Lemma 3.3). ε is OUTSIDE the root."""
    return 2.0 * sensitivity * math.sqrt(3.0 * sparsity * math.log(1.0 / delta)) / epsilon


PEELING_MAX_DELTA: Final[float] = 0.05
"""Peeling's (ε, δ) claim is checked only for δ ≤ min(0.05, 1/n) (docs/algorithms/heavy-tailed-dpsco.md#peeling)."""

PEELING_MIN_ROWS: Final[int] = 20
"""With the service's δ < 1/n rule, n ≥ 20 makes δ ≤ min(0.05, 1/n) hold for every job."""


# ------------------------------------------------------------------------- Alg 3 (sparse lin. reg.)


def sparse_theory_iterations(*, n: float, gamma: float, mu: float, multiplier: float = 1.0) -> int:
    """T = ⌈(γ/μ)·ln n⌉ (Thm 7/8 with the hidden constant set to 1)."""
    return max(1, math.ceil(multiplier * (gamma / mu) * math.log(n)))


def sparse_paper_iterations(*, n: float) -> int:
    """§6.2: T = ⌊ln n⌋."""
    return max(1, math.floor(math.log(n)))


def sparse_level(*, s_star: int, gamma: float, mu: float, multiplier: float) -> int:
    """s = ⌈c·(γ/μ)²·s*⌉ (theory O((γ/μ)²s*); c = 2 as in the paper's Alg 5 experiments)."""
    return max(1, math.ceil(multiplier * (gamma / mu) ** 2 * s_star))


def linreg_truncation(*, n: float, epsilon: float, sparsity: int, iterations: int) -> float:
    """K = (nε/(sT))^{1/4} (Thm 7 and §6.2)."""
    return float((n * epsilon / (sparsity * iterations)) ** 0.25)


def linreg_sensitivity(*, truncation: float, step: float, sparsity: int, radius: float, block_size: float) -> float:
    """ℓ∞ add/remove sensitivity of w^{t+.5} = w − (η₀/m)Σx̃(⟨x̃,w⟩ − ỹ) for s-sparse ‖w‖₂ ≤ R:
    |⟨x̃,w⟩| ≤ √s·R·K, so one row adds ≤ K(√s·R·K + K) = K²(√s·R + 1), times η₀ over the public m."""
    return truncation**2 * step * (math.sqrt(sparsity) * radius + 1.0) / block_size


def linreg_sensitivity_replace_one(
    *, truncation: float, step: float, sparsity: int, radius: float, block_size: float
) -> float:
    """The paper's λ = 2K²η₀(√s·R + 1)/m."""
    return 2.0 * linreg_sensitivity(
        truncation=truncation, step=step, sparsity=sparsity, radius=radius, block_size=block_size
    )


# ------------------------------------------------------------------------- Alg 5 (sparse opt.)


def sparse_opt_theory_scale(
    *, n: float, epsilon: float, tau: float, sparsity: int, iterations: int, zeta: float
) -> float:
    """k = √(nετ/(sT))·(ln(Ts/ζ))^{−1/4} (proof of Thm 8)."""
    log_factor = float(math.log(iterations * sparsity / zeta) ** -0.25)
    return math.sqrt(n * epsilon * tau / (sparsity * iterations)) * log_factor


def sparse_opt_paper_scale(*, n: float, epsilon: float, c2: float = 1.0) -> float:
    """§6.2: k = c₂·n·ε — irreconcilable with the theory (docs/algorithms/heavy-tailed-dpsco.md#presets)."""
    return c2 * n * epsilon


SPARSE_OPT_BOX_FACTOR: Final[float] = 3.0
"""The Alg 5 box writes 4√2kη/m where the proof shows 4√2kη/(3m): 'box' is 3× 'tight'."""


def sparse_opt_sensitivity(*, scale: float, step: float, block_size: float, box: bool) -> float:
    """ℓ∞ add/remove sensitivity of w^{t+.5} = w − η·(1/m)Σψ_k: η·k·(2√2/3)/m (tight), 3× that (box)."""
    tight = step * robust_mean_sensitivity(kappa=scale, block_size=block_size)
    return SPARSE_OPT_BOX_FACTOR * tight if box else tight


def sparse_opt_sensitivity_replace_one(*, scale: float, step: float, block_size: float, box: bool) -> float:
    """The paper's λ: 4√2kη/m (box) or 4√2kη/(3m) (tight)."""
    return 2.0 * sparse_opt_sensitivity(scale=scale, step=step, block_size=block_size, box=box)
