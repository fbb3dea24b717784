"""The Gaussian mechanism on a sum of per-sample-mapped gradients."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dp.randomness.secure_random import SecureRandom

__all__ = ["gaussian_noise_like", "privatise_sum"]


def _flat_noise(
    tensors: Mapping[str, torch.Tensor], *, std: float, generator: SecureRandom
) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
    """One flat N(0, std²) vector for all ``tensors`` and its views shaped like each of them, in
    the mapping's order; None when they do not share one device and dtype."""
    first = next(iter(tensors.values()), None)
    if first is None or any(t.device != first.device or t.dtype != first.dtype for t in tensors.values()):
        return None
    flat = generator.normal(sum(t.numel() for t in tensors.values()), std=std, dtype=first.dtype, device=first.device)
    views = torch.split(flat, [t.numel() for t in tensors.values()])
    return flat, {name: view.view(t.shape) for (name, t), view in zip(tensors.items(), views, strict=True)}


def _noise_per_tensor(
    tensors: Mapping[str, torch.Tensor], *, std: float, generator: SecureRandom
) -> dict[str, torch.Tensor]:
    """One draw per tensor, on its own device and in its own dtype (tensors that differ in either)."""
    return {name: generator.normal(t.shape, std=std, dtype=t.dtype, device=t.device) for name, t in tensors.items()}


def gaussian_noise_like(
    tensors: Mapping[str, torch.Tensor], *, std: float, generator: SecureRandom
) -> dict[str, torch.Tensor]:
    """One independent N(0, std²) draw per element of every tensor, in the mapping's order.

    Drawn from the job's `SecureRandom` (OS-seeded, ≥ 128 secret bits, docs/privacy-model.md §5; secure
    mode per the service setting) on each tensor's device, which must be the stream's device
    type. Drawn even when std == 0, so the stream does not depend on the configuration. Tensors
    sharing one device and dtype (a model's gradients) get one flat draw, split into views: on a
    GPU a handful of kernels per step instead of a handful per parameter tensor.
    """
    if not (std >= 0 and std < float("inf")):
        raise ValueError(f"noise std must be finite and >= 0, got {std}")
    flat = _flat_noise(tensors, std=std, generator=generator)
    return flat[1] if flat is not None else _noise_per_tensor(tensors, std=std, generator=generator)


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
    flat = _flat_noise(grad_sum, std=noise_std, generator=generator)
    if flat is None:
        noise = _noise_per_tensor(grad_sum, std=noise_std, generator=generator)
        return {name: (g + noise[name]).div_(normaliser) for name, g in grad_sum.items()}
    buffer, views = flat  # (noise + Σ)/normaliser over the flat buffer: three kernels, not 2 per tensor
    buffer.add_(torch.cat([g.reshape(-1) for g in grad_sum.values()])).div_(normaliser)
    return views
