"""The smoothed Catoni–Giulini robust mean of Alg 1 and Alg 5, in float64.

Privacy rests on one fact (docs/algorithms/heavy-tailed-dpsco.md#sensitivities): every
per-sample term ψ_κ(g) lies in [−κ·2√2/3, κ·2√2/3]. The closed form of Φ̄(a, b) = E φ(a + bZ)
cancels catastrophically for large |a| or b, so it is evaluated:

* always in float64;
* by the closed form where max(|a|, b) ≤ 100 (error ≤ 4·10⁻⁹);
* by 200-node Gauss–Legendre quadrature in x-space beyond that (the density is then flat or far
  from [−√2, √2], where fixed nodes are accurate);
* as φ(a) where b < 10⁻⁸ (no smoothing; avoids 0·∞), exactly 0 at a = 0;
* for non-finite inputs: NaN contributes 0, ±∞ takes the asymptotic value;

and the result is CLIPPED to ±2√2/3, so the sensitivity bound holds whatever the rounding.
The multiplicative smoothing noise is integrated out, never sampled.

The bound the catalogue's sensitivity assumes (``term_bound``, the catalogue's sup |φ|) is passed
in by the trainer, and every term is clipped to ±κ·term_bound with it: the privacy argument then
rests on the number the charge was computed from, not on a copy of it here.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import torch

__all__ = [
    "CLOSED_FORM_LIMIT",
    "PHI_SUP",
    "phi",
    "robust_mean_sum",
    "robust_terms",
    "smoothed_truncation",
    "smoothed_truncation_unclipped",
]

SQRT2: Final[float] = math.sqrt(2.0)
PHI_SUP: Final[float] = 2.0 * math.sqrt(2.0) / 3.0
"""sup |φ| = φ(√2): part of φ's definition (eq. (2)); the privacy clip uses the caller's bound."""
INV_SQRT_2PI: Final[float] = 1.0 / math.sqrt(2.0 * math.pi)
CLOSED_FORM_LIMIT: Final[float] = 100.0
TINY_SMOOTHING: Final[float] = 1e-8
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(200)


def phi(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = x − x³/6 on [−√2, √2], ±2√2/3 outside (eq. (2))."""
    inner = x - x.pow(3) / 6.0
    return torch.where(x.abs() <= SQRT2, inner, torch.sign(x) * PHI_SUP)


def _closed_form(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a(1 − b²/2) − a³/6 + Ĉ(a, b) with Ĉ = c1 + … + c5."""
    v_minus = (SQRT2 - a) / b
    v_plus = (SQRT2 + a) / b
    f_minus = torch.special.ndtr(-v_minus)
    f_plus = torch.special.ndtr(-v_plus)
    e_minus = torch.exp(-0.5 * v_minus * v_minus)
    e_plus = torch.exp(-0.5 * v_plus * v_plus)
    c1 = PHI_SUP * (f_minus - f_plus)
    c2 = -(a - a.pow(3) / 6.0) * (f_minus + f_plus)
    c3 = b * INV_SQRT_2PI * (1.0 - a * a / 2.0) * (e_plus - e_minus)
    c4 = a * b * b / 2.0 * (f_plus + f_minus + (v_plus * e_plus + v_minus * e_minus) * INV_SQRT_2PI)
    c5 = b.pow(3) / 6.0 * INV_SQRT_2PI * ((2.0 + v_minus * v_minus) * e_minus - (2.0 + v_plus * v_plus) * e_plus)
    value: torch.Tensor = a * (1.0 - b * b / 2.0) - a.pow(3) / 6.0 + (c1 + c2 + c3 + c4 + c5)
    return value


def _quadrature(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(2√2/3)(P(X > √2) − P(X < −√2)) + ∫_{−√2}^{√2}(x − x³/6)·N(x; a, b²) dx, X ~ N(a, b²)."""
    nodes = torch.as_tensor(_NODES * SQRT2, dtype=torch.float64, device=a.device)
    weights = torch.as_tensor(_WEIGHTS * SQRT2, dtype=torch.float64, device=a.device)
    tails: torch.Tensor = PHI_SUP * (torch.special.ndtr((a - SQRT2) / b) - torch.special.ndtr((-SQRT2 - a) / b))
    z = (nodes[None, :] - a[:, None]) / b[:, None]
    density = torch.exp(-0.5 * z * z) * INV_SQRT_2PI / b[:, None]
    body = ((nodes - nodes.pow(3) / 6.0)[None, :] * density * weights[None, :]).sum(dim=1)
    return tails + body


def smoothed_truncation_unclipped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Φ̄(a, b) = E φ(a + bZ) for finite a and b ≥ 0, before the safety clip (for tests)."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64, device=a.device)
    a, b = torch.broadcast_tensors(a, b)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    out = torch.empty_like(a)
    sharp = b < TINY_SMOOTHING
    out[sharp] = phi(a[sharp])
    large = ~sharp & (torch.maximum(a.abs(), b) > CLOSED_FORM_LIMIT)
    regular = ~sharp & ~large
    out[regular] = _closed_form(a[regular], b[regular])
    if bool(large.any()):
        out[large] = _quadrature(a[large], b[large])
    return out


def smoothed_truncation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Φ̄(a, b) made safe: NaN → 0, clipped to ±2√2/3 (finite inputs; see robust_terms for ±∞)."""
    value = smoothed_truncation_unclipped(torch.nan_to_num(torch.as_tensor(a, dtype=torch.float64), nan=0.0), b)
    return torch.nan_to_num(value, nan=0.0).clamp_(-PHI_SUP, PHI_SUP)


def robust_terms(g: torch.Tensor, *, kappa: float, beta: float, term_bound: float) -> torch.Tensor:
    """ψ_{κ,β}(g) = κ·Φ̄(g/κ, |g|/(κ√β)) elementwise, each clipped to ±κ·term_bound
    (term_bound is the catalogue's sup |φ| = 2√2/3, so the clip only guards rounding).

    NaN entries contribute 0; ±∞ (or a ratio g/κ that overflows) takes the asymptotic value
    sign(g)·(2√2/3)·(2Φ(√β) − 1)·κ.
    """
    if not (kappa > 0 and math.isfinite(kappa) and beta > 0 and math.isfinite(beta)):
        raise ValueError("kappa and beta must be finite and positive")
    if not (term_bound > 0 and math.isfinite(term_bound)):
        raise ValueError("term_bound must be finite and positive")
    g = g.to(torch.float64)
    a = torch.nan_to_num(g, nan=0.0) / kappa
    finite = torch.isfinite(a)
    safe_a = torch.where(finite, a, torch.zeros_like(a))
    value = smoothed_truncation(safe_a, safe_a.abs() / math.sqrt(beta))
    limit = PHI_SUP * (2.0 * 0.5 * math.erfc(-math.sqrt(beta) / SQRT2) - 1.0)
    value = torch.where(finite, value, torch.sign(a) * limit)
    return (kappa * value).clamp_(-term_bound * kappa, term_bound * kappa)


def robust_mean_sum(
    g: torch.Tensor, *, kappa: float, beta: float, term_bound: float, chunk_rows: int = 4096
) -> torch.Tensor:
    """Σ_i ψ(G[i, :]) over the rows of G, in row chunks (the caller divides by the PUBLIC m);
    every term within ±κ·term_bound."""
    total = torch.zeros(g.shape[1], dtype=torch.float64, device=g.device)
    for start in range(0, g.shape[0], chunk_rows):
        total += robust_terms(g[start : start + chunk_rows], kappa=kappa, beta=beta, term_bound=term_bound).sum(dim=0)
    return total
