"""The torch module of cnn2-gn."""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import nn

from privtrain_common.zoo.building import check_positive_int, declare_blocks, register_model, with_defaults
from privtrain_common.zoo.cnn2.definition import cnn2_output_hw


@register_model("cnn2-gn")
def _cnn2_gn(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """The two-layer CNN of the DC-DPSGD paper's MNIST experiments, with GroupNorm.

    GroupNorm replaces BatchNorm because it normalises each sample on its own, so per-sample
    gradients stay per-sample. Flat rows (d,) are reshaped to `image_shape`.
    """
    p = with_defaults("cnn2-gn", params)
    groups = check_positive_int("cnn2-gn groups", p["groups"])
    if 16 % groups or 32 % groups:
        raise ValueError(f"cnn2-gn groups must divide both 16 and 32, got {groups}")

    image_shape = p["image_shape"]
    if image_shape is not None:
        if not isinstance(image_shape, (list, tuple)) or len(image_shape) != 3:
            raise ValueError(f"cnn2-gn image_shape must be [C, H, W] or null, got {image_shape!r}")
        image = tuple(check_positive_int("cnn2-gn image_shape entries", v) for v in image_shape)
    else:
        image = None

    layers: list[nn.Module] = []
    if len(input_shape) == 1:
        if image is None:
            raise ValueError(f"cnn2-gn needs image_shape [C, H, W] for flat rows of {input_shape[0]} features")
        if math.prod(image) != input_shape[0]:
            raise ValueError(
                f"cnn2-gn image_shape {list(image)} has {math.prod(image)} values but rows have "
                f"{input_shape[0]} features"
            )
        layers.append(nn.Unflatten(1, image))
    elif len(input_shape) == 3:
        if image is not None and image != input_shape:
            raise ValueError(f"cnn2-gn image_shape {list(image)} contradicts the input shape {list(input_shape)}")
        image = input_shape
    else:
        raise ValueError(f"cnn2-gn needs rows of shape (d,) or (C, H, W), got {input_shape}")

    channels, height, width = image
    spatial = cnn2_output_hw(height, width)  # the catalogue's formula: one copy for both sides
    if spatial is None:
        raise ValueError(f"cnn2-gn input {height}x{width} is too small (needs at least 14x14)")
    h_out, w_out = spatial
    first = len(layers)  # after the optional Unflatten
    layers += [
        nn.Conv2d(channels, 16, kernel_size=8, stride=2, padding=3),
        nn.GroupNorm(groups, 16),
        nn.Tanh(),
        nn.MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, kernel_size=4, stride=2),
        nn.GroupNorm(groups, 32),
        nn.Tanh(),
        nn.MaxPool2d(2, stride=1),
        nn.Flatten(),
        nn.Linear(32 * h_out * w_out, 32),
        nn.Tanh(),
        nn.Linear(32, n_outputs),
    ]
    blocks = {"conv1": [first, first + 1], "conv2": [first + 4, first + 5], "fc": [first + 9], "head": [first + 11]}
    return declare_blocks(nn.Sequential(*layers), blocks)
