"""Tiny ViT and ConvNeXt configs (8×8 RGB images), built offline from the config alone."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from privtrain_common.zoo.architectures import build_model

CHANNELS, SIDE, CLASSES = 3, 8, 3
IMAGE_SHAPE = (CHANNELS, SIDE, SIDE)

_CONFIGS: dict[str, dict[str, Any]] = {
    "vit": {
        "model_type": "vit",
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 12,
        "num_channels": CHANNELS,
        "image_size": SIDE,
        "patch_size": 4,
    },
    "convnext": {
        "model_type": "convnext",
        "hidden_sizes": [4, 8],
        "depths": [1, 1],
        "num_channels": CHANNELS,
        "image_size": SIDE,
        "patch_size": 2,
    },
}
IMAGE_TYPES = list(_CONFIGS)


def image_config(model_type: str) -> dict[str, Any]:
    """A fresh copy of the tiny config (lists copied too)."""
    return {key: list(value) if isinstance(value, list) else value for key, value in _CONFIGS[model_type].items()}


def image_model(
    model_type: str, *, config: dict[str, Any] | None = None, seed: int = 7, dtype: torch.dtype = torch.float64
) -> nn.Module:
    """The `hf` image classifier of the tiny config (or ``config``), CLASSES outputs."""
    model = build_model(
        "hf",
        {"task": "image-classification", "config": config or image_config(model_type)},
        input_shape=IMAGE_SHAPE,
        n_outputs=CLASSES,
        generator=torch.Generator().manual_seed(seed),
    )
    return model.to(dtype)


def images(n: int, *, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn((n, *IMAGE_SHAPE), generator=torch.Generator().manual_seed(seed), dtype=dtype)
