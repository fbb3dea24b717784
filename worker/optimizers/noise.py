"""The Gaussian mechanism on a sum of per-sample-mapped gradients."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from worker.optimizers.secure_random import SecureRandom

__all__ = ["gaussian_noise_like", "privatise_sum"]


def gaussian_noise_like(
    tensors: Mapping[str, torch.Tensor], *, std: float, generator: SecureRandom
) -> dict[str, torch.Tensor]:
    """One independent N(0, std²) draw per element of every tensor, in the mapping's order.

    Drawn from the job's `SecureRandom` (OS-seeded, ≥ 128 secret bits, docs/privacy-model.md §5; secure
    mode per the service setting) on each tensor's device, which must be the stream's device
    type. Drawn even when std == 0, so the stream does not depend on the configuration.
    """
    if not (std >= 0 and std < float("inf")):
        raise ValueError(f"noise std must be finite and >= 0, got {std}")
    return {name: generator.normal(t.shape, std=std, dtype=t.dtype, device=t.device) for name, t in tensors.items()}


def privatise_sum(
    grad_sum: Mapping[str, torch.Tensor],
    *,
    noise_std: float,
    normaliser: float,
    generator: SecureRandom,
) -> dict[str, torch.Tensor]:
    """(Σ mapped g_i + N(0, noise_std² I)) / normaliser — the only release of a step.

    `noise_std` is σ·S for a map with norm bound S (the add/remove sensitivity of the sum);
    `normaliser` must be a public constant (q·n), never the realised batch size (docs/privacy-model.md#neighbours).
    Exactly one Gaussian vector is drawn per call: no per-sample noise.
    """
    if not (normaliser > 0 and normaliser < float("inf")):
        raise ValueError(f"normaliser must be positive and finite, got {normaliser}")
    noise = gaussian_noise_like(grad_sum, std=noise_std, generator=generator)
    return {name: (g + noise[name]).div_(normaliser) for name, g in grad_sum.items()}
