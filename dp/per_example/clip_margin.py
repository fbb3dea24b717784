"""Clipping that holds in floating point: every clipped per-sample vector, as computed, has norm ≤ C.

The charge assumes that one row moves a step's sum by at most the sensitivity S (C for clipping).
Computed naively in float32 the bound is only approximate: the norm's rounding (a float32 sum of
d squares, each rounded), the scale C/‖g‖ and the product scale·g each round, and adversarial
gradients realised norms up to 1.00000022·C (measured). Rather than charge C·(1 + κ) (which would
change every charge), the norm is computed as an **upper bound** and every per-sample map clips to
the **target** C·(1 − κ), κ = 8u (u = 2⁻²⁴ for float32 gradients, 2⁻⁵³ for float64): the realised
norm then provably stays ≤ C, and the charged sensitivity stays C.

**The norm is an upper bound.** A per-sample squared norm is accumulated in float64
(:func:`sum_of_squares`):

* each square of a float32 value g_j is exact in float64 (24-bit significands give 48 bits; the
  smallest float32, 2⁻¹⁴⁹, squares to 2⁻²⁹⁸, far above float64's smallest normal 2⁻¹⁰²²); a
  float64 value's square rounds once (relative u₆₄ = 2⁻⁵³);
* a sum of n non-negative float64 terms in any order and blocking is within relative
  γ_{n−1} = (n−1)u₆₄/(1 − (n−1)u₆₄) of the exact sum (Higham, *Accuracy and Stability of
  Numerical Algorithms*, 2nd ed., §4.2);
* rules that form a squared norm by cancellation (the ghost engine's Gram forms, the embedding's
  same-token Gram, the weight-standardised convolution's projection) add an explicit bound on
  their float64 rounding instead, so their value is an upper bound already (:func:`gram_allowance`
  and dp/per_example/ghost/standardised_conv.py);
* the joint squared norm over all parameters is the float64 sum of the per-tensor (per-layer)
  values; counting every square, every partial sum and every layer, at most N ≤ 2³² terms
  (:data:`MAX_NORM_TERMS`, checked). :func:`norm_upper_bound` multiplies it by (1 + 2(N + 1)u₆₄),
  which exceeds 1/(1 − γ_N − u₆₄) for N ≤ 2³², takes the square root in float64 (correctly
  rounded, and the factor's slack covers it) and raises it by (1 + 2u) before rounding it to the
  gradients' dtype, so the rounded value is above the float64 one. So the norm n̂ the maps see
  satisfies n̂ ≥ ‖g‖, g the row's per-sample gradient as the engine holds it (its float32 values;
  for the ghost engine, the exact product of its float32 (a, δ)). It exceeds the exact norm by at
  most 2⁻²⁰ + 3u relative (N = 2³²); for a million float32 parameters, by about 1.8e-7.

**Why the realised norm is ≤ C.** A map computes its scale in the gradients' dtype from n̂ and
the target τ = C(1 − 8u) (τ itself rounded: ≤ 1 u up), e.g. s = τ/n̂ (1 u); Auto-S's τ/(n̂ + γ)
and PSAC's τ/(n̂ + r/(n̂ + r)) add at most three roundings of a denominator that exceeds n̂; each
coordinate of s·g is rounded once more (1 u): six roundings at most. A row not clipped
(n̂ ≤ τ, scale exactly 1) has ‖g‖ ≤ n̂ ≤ τ < C. A clipped row's realised vector r satisfies

    ‖r‖ ≤ (1 + u)⁶ · τ · ‖g‖/n̂ ≤ C · (1 − 8u)(1 + 6.01u) < C · (1 − 1.9u).

One more term: a coordinate of s·g below the dtype's smallest normal rounds with an absolute
error up to half its smallest subnormal (2⁻¹⁵⁰ in float32), not a relative one; with fewer than
2³² coordinates these add at most 2⁻¹³⁴ to ‖r‖, which the 1.9u·C ≈ 1.1e-7·C left over covers for
every C ≥ 2⁻¹¹⁰; clipping norms are far above that (the catalogue's bounds start at 1e-6).

**What this does not cover.** The bound is on each row's clipped vector as computed; the batch's
sum of those vectors, the noise and their addition are float32 sums whose rounding depends on
every row in the batch, and the forward and backward passes may round a row's gradient
differently depending on the batch it is computed in. These effects are of the order of float32
rounding of the sum (2⁻²⁴ relative) and are not accounted for; every report says so in its
caveats, like the sampler's floating-point effects. Rows with a non-finite norm are mapped to 0.
"""

from __future__ import annotations

import math
from typing import Final

import torch

__all__ = [
    "MAX_NORM_TERMS",
    "ROUNDINGS_COVERED",
    "clip_target",
    "gram_allowance",
    "norm_upper_bound",
    "sum_of_squares",
    "unit_roundoff",
]

ROUNDINGS_COVERED: Final[int] = 8
"""κ = this many units of roundoff of the gradients' dtype: six roundings of the scale and the
product, and a margin for values below the smallest normal."""

MAX_NORM_TERMS: Final[int] = 2**32
"""The most terms (squares, partial sums, layers) one per-sample norm may add up for the proof."""

_BLOCK_VALUES: Final[int] = 1 << 22
"""float64 values made at once while summing squares (32 MiB), whatever the gradients' size."""

_U64: Final[float] = 2.0**-53


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of a floating dtype: half its machine epsilon (2⁻²⁴ for float32, 2⁻⁵³ for float64)."""
    return torch.finfo(dtype).eps / 2.0


def clip_target(bound: float, dtype: torch.dtype) -> float:
    """The norm a map clips to so that the computed, rounded result never exceeds ``bound``."""
    return bound * (1.0 - ROUNDINGS_COVERED * unit_roundoff(dtype))


def _check_terms(terms: int) -> None:
    if terms >= MAX_NORM_TERMS:
        raise ValueError(f"a per-sample norm over {terms} terms exceeds the proven range ({MAX_NORM_TERMS})")


def sum_of_squares(t: torch.Tensor, *, start_dim: int = 1) -> torch.Tensor:
    """Σ of the squares of ``t`` over the dimensions from ``start_dim``, in float64: (leading dims).

    The squares of float32 (or bfloat16/float16) values are exact in float64. Computed as the
    float64 L2 norm (a sum of float64 squares, then a square root) squared again: two more
    roundings per row, which :func:`norm_upper_bound`'s factor covers. ``vector_norm`` casts its
    input to float64 whole, so blocks of columns go at a time: the float64 copy never exceeds
    ``_BLOCK_VALUES`` values."""
    lead = t.shape[:start_dim]
    rows = math.prod(lead)
    flat = t.reshape(rows, -1)
    _check_terms(flat.shape[1])
    if flat.numel() <= _BLOCK_VALUES:  # small layers: two operations
        squares: torch.Tensor = torch.linalg.vector_norm(flat, dim=1, dtype=torch.float64).square()
        return squares.reshape(lead)
    total = torch.zeros(rows, dtype=torch.float64, device=t.device)
    columns = max(1, _BLOCK_VALUES // max(1, rows))
    for start in range(0, flat.shape[1], columns):
        total += torch.linalg.vector_norm(flat[:, start : start + columns], dim=1, dtype=torch.float64).square()
    return total.reshape(lead)


def norm_upper_bound(squares: torch.Tensor, *, terms: int, dtype: torch.dtype) -> torch.Tensor:
    """√``squares`` raised to an upper bound on the exact norm, in ``dtype``.

    ``squares``: float64 sums of at most ``terms`` non-negative terms each (every square, every
    partial sum and layer counted), each within a float64 sum's error of its exact value or above
    it. The factor (1 + 2(N + 1)u₆₄) covers that error and this function's own float64 roundings;
    the factor (1 + 2u)² with u the unit roundoff of ``dtype`` makes the nearest ``dtype`` value of
    the square root at least the float64 one ((1 + 2u)(1 − u) > 1): three operations in all."""
    _check_terms(terms)
    raise_by = (1.0 + 2.0 * (terms + 1) * _U64) * (1.0 + 2.0 * unit_roundoff(dtype)) ** 2
    bound: torch.Tensor = (squares * raise_by).sqrt_().to(dtype)
    return bound


def gram_allowance(weights: torch.Tensor, *, terms: int) -> torch.Tensor:
    """An upper bound on the float64 rounding error of a Gram-form squared norm, per row.

    A Gram form computes Σ_{t,t'} (a_t·a_t')(δ_t·δ_t') from float64 inner products (of float32
    vectors: exact products; of float64 ones: each product rounded once), sums of k or o terms:
    error ≤ γ_{k+1}‖a_t‖‖a_t'‖ and γ_{o+1}‖δ_t‖‖δ_t'‖ by Cauchy-Schwarz; then rounds each product
    (u₆₄) and sums the T² of them (γ_{T²}). With w_t = ‖a_t‖·‖δ_t‖ and W = Σ_t w_t the total error is
    at most (γ_{k+1} + γ_{o+1} + u₆₄ + γ_{T²})(1 + 2⁻²⁰)·W². ``weights``: W per row (float64, from
    float64 norms, so ≥ (1 − 2⁻⁴⁰)·W); ``terms``: k + o + T² + 3. The factor 2 below covers the
    (1 + ·) factors and W's own rounding with a wide margin."""
    _check_terms(terms)
    return 2.0 * terms * _U64 * weights.square()
