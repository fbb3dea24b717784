"""Poisson subsampling: the batch scheme the accountant's subsampled Gaussian assumes."""

from __future__ import annotations

import torch

from dp.randomness.secure_random import SecureRandom

__all__ = ["poisson_sample"]


def poisson_sample(n: int, *, sampling_probability: float, generator: SecureRandom) -> torch.Tensor:
    """Indices of the rows included this step, each row independently with probability q.

    The batch size is random (Binomial(n, q)) and may be 0; callers must still take the step
    (docs/privacy-model.md#neighbours). Uniforms are drawn in float64 (53-bit) on the stream's device, so the realised
    inclusion probability exceeds q by less than 2^-53 (float32 would allow 2^-24). Returns
    int64 indices in increasing order on the stream's device.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 < sampling_probability <= 1.0:
        raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability}")
    uniforms = generator.uniform(n, dtype=torch.float64)
    return torch.nonzero(uniforms < sampling_probability, as_tuple=False).squeeze(1)
