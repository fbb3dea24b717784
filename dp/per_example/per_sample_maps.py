"""Per-sample maps beyond Abadi clipping: Auto-S (≡ NSGD) and DP-PSAC (Xia et al. form).

Each map is a `PerSampleMap` (dp.per_example.per_sample): it turns the flat L2 norms ||g_i||
of a chunk's per-sample gradients into scale factors, g_i ↦ scale(||g_i||)·g_i, and declares S =
`norm_bound`, a bound on ||scale(||g||)·g|| = scale(||g||)·||g|| for EVERY g. The sum of mapped
gradients then has add/remove L2 sensitivity S, and the DP-SGD loop adds N(0, σ²S² I) to it.

Maps are registered by name in `PER_SAMPLE_MAPS` (decorator, no if/elif factory) so a trainer or
a test can build one from a name and keyword parameters with `build_per_sample_map`.

Floating point: the bounds below are exact-arithmetic statements about the formulas. In floating
point every map scales to C·(1 − κ) instead of C (`clip_target`), and the norms are accumulated in
float64 into an upper bound: dp/per_example/clip_margin.py proves that the computed mapped vector
then has norm ≤ C = `norm_bound` (the denominators here exceed the norm, so the proof for Abadi
clipping covers them, with their extra roundings). Rows whose norm is not finite are mapped to
zero by `clipped_grad_sum` before these scales are used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dp.per_example.clip_margin import clip_target
from dp.per_example.per_sample import AbadiClip, PerSampleMap
from kernel.registry import Registry

__all__ = [
    "PER_SAMPLE_MAPS",
    "AutoSClip",
    "PSACClip",
    "build_per_sample_map",
]

PerSampleMapFactory = Callable[..., PerSampleMap]
PER_SAMPLE_MAPS: Registry[PerSampleMapFactory] = Registry("per-sample map")
PER_SAMPLE_MAPS.add("abadi", AbadiClip)


def build_per_sample_map(name: str, **params: Any) -> PerSampleMap:
    """The map registered as `name`, e.g. ``build_per_sample_map("auto-s", clipping_norm=1.0, gamma=0.01)``."""
    return PER_SAMPLE_MAPS.get(name)(**params)


def _positive_finite(label: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{label} must be positive and finite, got {value!r}")


@PER_SAMPLE_MAPS.register("auto-s")
@dataclass(frozen=True)
class AutoSClip:
    """Automatic clipping, Auto-S (Bu et al., NeurIPS 2023) ≡ NSGD (Yang et al. 2022).

        ḡ = C·g / (||g|| + γ),   γ > 0 (Auto-S default 0.01; NSGD calls it r).

    Bound S = C. Proof: ||ḡ|| = C·||g||/(||g|| + γ), and for γ > 0 and ||g|| ≥ 0 the fraction
    ||g||/(||g|| + γ) lies in [0, 1), so ||ḡ|| < C (= 0 exactly when g = 0). The scale
    C/(||g|| + γ) is at most C/γ, finite, so a zero gradient maps to exactly zero.

    γ → 0 gives normalisation C·g/||g|| (Auto-V); Bu et al.'s form without C (bound 1) is the same
    up to rescaling the learning rate and noise by C.
    """

    clipping_norm: float
    gamma: float = 0.01

    def __post_init__(self) -> None:
        _positive_finite("clipping_norm", self.clipping_norm)
        _positive_finite("gamma", self.gamma)
        _positive_finite("clipping_norm / gamma", self.clipping_norm / self.gamma)

    @property
    def norm_bound(self) -> float:
        return float(self.clipping_norm)

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return clip_target(self.clipping_norm, norms.dtype) / (norms + self.gamma)


@PER_SAMPLE_MAPS.register("psac")
@dataclass(frozen=True)
class PSACClip:
    """Per-sample adaptive clipping in the form of Xia et al. (AAAI 2023), DP-PSAC:

        ḡ = C·g / (||g|| + r/(||g|| + r)),   r > 0 (authors' code 0.01).

    Bound S = C. Proof: write u = ||g|| ≥ 0. Since r > 0, r/(u + r) > 0, so the denominator
    u + r/(u + r) > u ≥ 0 and

        ||ḡ|| = C·u / (u + r/(u + r)) < C·u/u = C   for u > 0,   and ||ḡ|| = 0 for u = 0.

    Hence ||ḡ|| < C for every g. The scale C/(u + r/(u + r)) is finite: the denominator is
    minimised at u = √r − r with value 2√r − r ∈ (0, 1) when r < 1, and at u = 0 with value 1
    when r ≥ 1, so the scale is at most C/(2√r − r) (r < 1), resp. C (r ≥ 1). A zero gradient
    maps to exactly zero (scale C at u = 0).

    The weight C/(u + r/(u + r)) is non-monotone in u: ≈ C for tiny gradients (they are NOT
    normalised up, unlike Auto-S), largest near u = √r − r, ≈ C/u for large ones.

    This is the Xia et al. form named in docs/algorithms/dp-sgd.md, not Opacus' PSACDPOptimizer variant
    (ḡ = g·min(1, C_i/||g||), C_i = C(||g|| + r)/(||g||² + r||g|| + r)).
    """

    clipping_norm: float
    r: float = 0.01

    def __post_init__(self) -> None:
        _positive_finite("clipping_norm", self.clipping_norm)
        _positive_finite("r", self.r)

    @property
    def norm_bound(self) -> float:
        return float(self.clipping_norm)

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return clip_target(self.clipping_norm, norms.dtype) / (norms + self.r / (norms + self.r))
