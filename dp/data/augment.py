"""Augmented views of an image batch: random crop with zero padding and a random horizontal flip.

Each image of a (b, C, H, W) batch gets K views, returned as (b, K, C, H, W): the image padded
with ``padding`` zeros on every side, cropped back to H × W at a random offset, and mirrored left
to right with probability 1/2. Crop and flip are one gather on the batch's device (no loop over
images), so a view holds exactly the input's values, or 0 where the crop reaches the padding.

The draws come from a sub-stream keyed by the job's secret (``SecureRandom.derive_key``) and
counted by the step: they depend on nothing but the job's key, the step and the batch's shape,
never on the images; a resumed job draws the same views again without any new checkpoint state;
and the job's main stream (Poisson sampling, noise) is left exactly as it would be without views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dp.randomness.secure_random import SecureRandom, keyed_uniform

__all__ = ["ViewDraws", "augmented_views", "default_padding", "draw_views"]

AUGMENTATION_KEY_PURPOSE = b"augmentation-multiplicity"
"""Names the keyed sub-stream of the views, so it never overlaps another keyed use of the job key."""


def default_padding(height: int, width: int) -> int:
    """Zero padding per side: an eighth of the shorter side (4 for 32 × 32 images), at least 1."""
    return max(1, min(height, width) // 8)


@dataclass(frozen=True)
class ViewDraws:
    """The random choices of K views of b images: crop offsets into the padded image, and flips."""

    top: torch.Tensor
    """(b, K) int64 in [0, 2·padding]."""
    left: torch.Tensor
    """(b, K) int64 in [0, 2·padding]."""
    flip: torch.Tensor
    """(b, K) bool: mirror the view left to right."""


def draw_views(
    *, images: int, views: int, padding: int, generator: SecureRandom, step: int, device: torch.device
) -> ViewDraws:
    """Offsets and flips for ``views`` views of each of ``images`` images at training step ``step``."""
    if views < 1 or padding < 0 or step < 0:
        raise ValueError(f"need views >= 1, padding >= 0 and step >= 0, got {views}, {padding}, {step}")
    key = generator.derive_key(AUGMENTATION_KEY_PURPOSE)
    u = keyed_uniform(key, counter=(step, 0), shape=(images, views, 3), dtype=torch.float64, device=device)
    choices = 2 * padding + 1  # floor(u·m) for u in [0, 1) is uniform on 0..m−1 up to 2^-53 rounding
    offsets = (u[..., :2] * choices).floor().to(torch.int64).clamp_(0, choices - 1)
    return ViewDraws(top=offsets[..., 0], left=offsets[..., 1], flip=u[..., 2] < 0.5)


def augmented_views(images: torch.Tensor, draws: ViewDraws, *, padding: int) -> torch.Tensor:
    """(b, C, H, W) images -> (b, K, C, H, W) crops of the zero-padded images, flipped where drawn."""
    if images.dim() != 4:
        raise ValueError("augmented views need image batches of shape (b, C, H, W)")
    batch, _channels, height, width = images.shape
    if draws.top.shape[0] != batch:
        raise ValueError("the draws are for another number of images")
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding)).permute(0, 2, 3, 1)  # (b, H+2p, W+2p, C)
    top, left, flip = draws.top.to(device), draws.left.to(device), draws.flip.to(device)
    rows = top.unsqueeze(-1) + torch.arange(height, device=device)  # (b, K, H)
    columns = torch.arange(width, device=device)
    columns = torch.where(flip.unsqueeze(-1), width - 1 - columns, columns)  # mirrored read order
    columns = left.unsqueeze(-1) + columns  # (b, K, W)
    image_index = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    views = padded[image_index, rows.unsqueeze(-1), columns.unsqueeze(-2)]  # (b, K, H, W, C)
    return views.permute(0, 1, 4, 2, 3).contiguous()
