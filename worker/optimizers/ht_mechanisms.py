"""The DP selection and release mechanisms of the heavy-tailed family, and the block split.

Every random draw comes from the job's ``torch.Generator`` through a :class:`NoiseSource`, so
tests can count draws (spec U7e) or inject a stream. Noise is drawn in float64 on the
generator's device, and always drawn, whatever the scale, so the stream never depends on the
configuration. (Floating-point samplers have known side channels, Mironov 2012; documented, not
mitigated here, spec §5.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

__all__ = [
    "GeneratorNoise",
    "NoiseSource",
    "Polytope",
    "assign_blocks",
    "exponential_mechanism",
    "peeling",
    "project_l2_ball",
]


class NoiseSource(Protocol):
    def gumbel(self, n: int) -> torch.Tensor: ...
    def laplace(self, shape: tuple[int, ...], scale: float) -> torch.Tensor: ...


@dataclass
class GeneratorNoise:
    """Gumbel(0, 1) and Laplace(0, b) from the job's generator (inverse-CDF on uniforms)."""

    generator: torch.Generator

    @property
    def device(self) -> torch.device:
        return self.generator.device

    def _uniform_open(self, shape: tuple[int, ...]) -> torch.Tensor:
        u = torch.rand(shape, generator=self.generator, dtype=torch.float64, device=self.device)
        tiny = torch.finfo(torch.float64).tiny
        return u.clamp_(min=tiny, max=1.0 - 2.0**-53)

    def gumbel(self, n: int) -> torch.Tensor:
        return -torch.log(-torch.log(self._uniform_open((n,))))

    def laplace(self, shape: tuple[int, ...], scale: float) -> torch.Tensor:
        if not (scale >= 0 and scale < float("inf")):
            raise ValueError(f"Laplace scale must be finite and >= 0, got {scale}")
        u = self._uniform_open(shape) - 0.5
        return -scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())


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


def exponential_mechanism(scores: torch.Tensor, *, epsilon: float, sensitivity: float, noise: NoiseSource,
                          selection: Literal["gumbel", "laplace-noisy-max"] = "gumbel") -> int:
    """argmax of ε·u/(2Δ) + Gumbel: exactly P(v) ∝ exp(ε·u_v/(2Δ)) without normalising exp
    (no overflow). 'laplace-noisy-max': argmax u + Lap(2Δ/ε), also ε-DP, a different law."""
    if not (epsilon > 0 and sensitivity > 0):
        raise ValueError("epsilon and sensitivity must be positive")
    scores = scores.to(torch.float64)
    if selection == "gumbel":
        return int(torch.argmax(scores * (epsilon / (2.0 * sensitivity)) + noise.gumbel(scores.numel())))
    return int(torch.argmax(scores + noise.laplace((scores.numel(),), 2.0 * sensitivity / epsilon)))


def peeling(v: torch.Tensor, *, sparsity: int, scale: float, noise: NoiseSource) -> torch.Tensor:
    """Alg 4: s rounds of report-noisy-max of |v_j| + Lap(b) over the unchosen j, with FRESH
    noise each round, then v_S + Lap(b) with a fresh, independent vector (s·d + d draws)."""
    d = v.numel()
    if not 1 <= sparsity <= d:
        raise ValueError(f"sparsity must be in [1, {d}], got {sparsity}")
    v = v.to(torch.float64)
    selection_noise = noise.laplace((sparsity, d), scale)
    release_noise = noise.laplace((d,), scale)
    magnitude = torch.nan_to_num(v.abs(), nan=0.0)
    chosen = torch.zeros(d, dtype=torch.bool, device=v.device)
    for round_noise in selection_noise:
        noisy = torch.where(chosen, torch.full_like(magnitude, -torch.inf), magnitude + round_noise)
        chosen[int(torch.argmax(noisy))] = True
    return torch.where(chosen, v + release_noise, torch.zeros_like(v))


def project_l2_ball(w: torch.Tensor, radius: float) -> torch.Tensor:
    """w / max(1, ‖w‖₂/R): keeps the support, so s-sparsity is preserved."""
    return w / torch.clamp(torch.linalg.vector_norm(w) / radius, min=1.0)


def assign_blocks(n_rows: int, blocks: int, generator: torch.Generator) -> torch.Tensor:
    """Each row independently and uniformly to one of ``blocks`` blocks (privacy.md §2): adding
    a row changes one block only, and the other rows keep their blocks."""
    return torch.randint(0, blocks, (n_rows,), generator=generator, device=generator.device)
