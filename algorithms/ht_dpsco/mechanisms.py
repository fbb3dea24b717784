"""The DP selection and release mechanisms of the heavy-tailed family, and the block split.

Every privacy-protecting draw comes from the job's :class:`SecureRandom` through a
:class:`NoiseSource`, so tests can count draws or inject a stream. The production source,
:class:`ExactNoise`, samples with integer arithmetic (``dp.randomness.discrete_samplers``):
the exponential mechanism exactly, report-noisy-max and the Laplace releases on a power-of-two
grid with discrete Laplace noise. Textbook floating-point samplers leak (Mironov 2012: the set of
doubles a Laplace release can take depends on the true value); these do not, and each keeps the
ε the ledger charges (the grid's rounding is paid for by slightly more noise, proved in that
module). Selections run on the CPU over d candidates; the chosen index or the released values are
returned on the caller's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch

from dp.randomness import discrete_samplers
from dp.randomness.secure_random import SecureRandom

__all__ = [
    "ExactNoise",
    "NoiseSource",
    "Polytope",
    "assign_blocks",
    "exponential_mechanism",
    "peeling",
    "project_l2_ball",
]


class NoiseSource(Protocol):
    """The three mechanisms of the family, each ε-DP exactly as charged."""

    def select_exponential(self, scores: torch.Tensor, *, epsilon: float, sensitivity: float) -> int: ...
    def report_noisy_max(self, scores: torch.Tensor, *, scale: float, sensitivity: float) -> int: ...
    def laplace_release(self, values: torch.Tensor, *, scale: float, sensitivity: float) -> torch.Tensor: ...


def _cpu_float64(values: torch.Tensor) -> np.ndarray:
    return values.detach().to(device="cpu", dtype=torch.float64).numpy()


@dataclass
class ExactNoise:
    """The mechanisms sampled exactly from the job's SecureRandom (its CPU NumPy stream)."""

    generator: SecureRandom

    def __post_init__(self) -> None:
        if not isinstance(self.generator, SecureRandom):
            raise TypeError("ExactNoise draws from a SecureRandom, not a torch.Generator")

    def select_exponential(self, scores: torch.Tensor, *, epsilon: float, sensitivity: float) -> int:
        """P(i) ∝ exp(ε·u_i/(2Δ)), sampled exactly: ε-DP and ε-bounded-range."""
        return discrete_samplers.exponential_mechanism(
            self.generator.numpy, _cpu_float64(scores), epsilon=epsilon, sensitivity=sensitivity
        )

    def report_noisy_max(self, scores: torch.Tensor, *, scale: float, sensitivity: float) -> int:
        """argmax u_i + discrete Laplace(scale), ties at random: (2Δ/scale)-DP; −inf never wins."""
        return discrete_samplers.report_noisy_max(
            self.generator.numpy, _cpu_float64(scores), scale=scale, sensitivity=sensitivity
        )

    def laplace_release(self, values: torch.Tensor, *, scale: float, sensitivity: float) -> torch.Tensor:
        """Each value + Laplace-like noise on a grid: each coordinate is (Δ/scale)-DP.

        The sampler's rounding slack is per coordinate, so giving it the L1 sensitivity Δ·k of the
        k values keeps each coordinate's guarantee at Δ/scale (the charge: k Laplace mechanisms).
        """
        flat = _cpu_float64(values).reshape(-1)
        if flat.size == 0:
            return values.to(torch.float64).clone()
        released = discrete_samplers.snapped_laplace(
            self.generator.numpy, flat, scale=scale, l1_sensitivity=sensitivity * flat.size
        )
        return torch.from_numpy(released).reshape(values.shape).to(values.device)


@dataclass(frozen=True)
class Polytope:
    """conv(V) for the ℓ1 ball {±r·e_j} or the scaled simplex {r·e_j} in ℝ^d."""

    kind: Literal["l1_ball", "simplex"]
    radius: float
    dim: int

    @property
    def n_vertices(self) -> int:
        return 2 * self.dim if self.kind == "l1_ball" else self.dim

    def start(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A data-independent start in 𝒲: 0 for the ball, the barycentre for the simplex."""
        if self.kind == "l1_ball":
            return torch.zeros(self.dim, dtype=dtype, device=device)
        return torch.full((self.dim,), self.radius / self.dim, dtype=dtype, device=device)

    def scores(self, gradient: torch.Tensor) -> torch.Tensor:
        """−⟨v, g̃⟩ for every vertex: (−r·g̃, +r·g̃) for ±e_j, or −r·g̃ for the simplex."""
        negative = -self.radius * gradient
        if self.kind == "l1_ball":
            return torch.cat([negative, -negative])
        return negative

    def vertex(self, index: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        v = torch.zeros(self.dim, dtype=dtype, device=device)
        sign = 1.0 if index < self.dim else -1.0
        v[index % self.dim] = sign * self.radius
        return v


def exponential_mechanism(
    scores: torch.Tensor,
    *,
    epsilon: float,
    sensitivity: float,
    noise: NoiseSource,
    selection: Literal["gumbel", "laplace-noisy-max"] = "gumbel",
) -> int:
    """'gumbel' (the catalogue's name for it): the exponential mechanism P(v) ∝ exp(ε·u_v/(2Δ)),
    sampled exactly. 'laplace-noisy-max': argmax u + Lap(2Δ/ε) on a grid, also ε-DP, a different
    law."""
    if not (epsilon > 0 and sensitivity > 0):
        raise ValueError("epsilon and sensitivity must be positive")
    scores = scores.to(torch.float64)
    if selection == "gumbel":
        return noise.select_exponential(scores, epsilon=epsilon, sensitivity=sensitivity)
    return noise.report_noisy_max(scores, scale=2.0 * sensitivity / epsilon, sensitivity=sensitivity)


def peeling(v: torch.Tensor, *, sparsity: int, scale: float, sensitivity: float, noise: NoiseSource) -> torch.Tensor:
    """Alg 4: s rounds of report-noisy-max of |v_j| + Lap(b) over the unchosen j, with FRESH
    noise each round (each (2λ/b)-DP for ℓ∞ sensitivity λ), then v_S + Lap(b) with fresh,
    independent noise (s Laplace mechanisms, each λ/b). Chosen coordinates are masked with −inf,
    which is public (it depends only on earlier released choices)."""
    d = v.numel()
    if not 1 <= sparsity <= d:
        raise ValueError(f"sparsity must be in [1, {d}], got {sparsity}")
    v = v.to(torch.float64)
    magnitude = torch.nan_to_num(v.abs(), nan=0.0, posinf=torch.finfo(torch.float64).max)
    chosen = torch.zeros(d, dtype=torch.bool, device=v.device)
    for _ in range(sparsity):
        candidates = torch.where(chosen, torch.full_like(magnitude, -torch.inf), magnitude)
        chosen[noise.report_noisy_max(candidates, scale=scale, sensitivity=sensitivity)] = True
    released = noise.laplace_release(v[chosen], scale=scale, sensitivity=sensitivity)
    out = torch.zeros_like(v)
    out[chosen] = released
    return out


def project_l2_ball(w: torch.Tensor, radius: float) -> torch.Tensor:
    """w / max(1, ‖w‖₂/R): keeps the support, so s-sparsity is preserved."""
    return w / torch.clamp(torch.linalg.vector_norm(w) / radius, min=1.0)


def assign_blocks(n_rows: int, blocks: int, generator: SecureRandom) -> torch.Tensor:
    """Each row independently and uniformly to one of ``blocks`` blocks
    (docs/algorithms/heavy-tailed-dpsco.md#disjoint-blocks): adding
    a row changes one block only, and the other rows keep their blocks. Exact integers from the
    job's SecureRandom (NumPy stream), on its device."""
    return generator.randint(blocks, (n_rows,))
