"""cnn2-gn described without torch: its parameters, the images it takes, its size."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry
from privtrain_common.zoo.inputs import InputFacts, image_chw
from privtrain_common.zoo.params import param


@dataclass(frozen=True, kw_only=True)
class CNN2Params:
    groups: Literal[1, 2, 4, 8, 16] = 4
    image_shape: tuple[int, int, int] | None = param(
        None, description="[C, H, W] to reshape flat (CSV) rows into images"
    )


def cnn2_output_hw(height: int, width: int) -> tuple[int, int] | None:
    """Spatial size after the CNN's two conv+pool stages, or None if the input is too small.

    Mirrors the torch module: conv(8, stride 2, pad 3) → pool(2, stride 1) → conv(4, stride 2)
    → pool(2, stride 1).
    """

    def stages(size: int) -> int:
        after_conv1 = (size + 6 - 8) // 2 + 1
        after_pool1 = after_conv1 - 1
        if after_pool1 < 4:
            return 0
        after_conv2 = (after_pool1 - 4) // 2 + 1
        return after_conv2 - 1

    out_h, out_w = stages(height), stages(width)
    if out_h < 1 or out_w < 1:
        return None
    return out_h, out_w


def _blocks(_params: CNN2Params) -> list[str]:
    """Each conv with its GroupNorm, the hidden Linear, the head."""
    return ["conv1", "conv2", "fc", "head"]


def _image(params: CNN2Params, facts: InputFacts) -> tuple[int, int, int]:
    image = image_chw(facts)
    if image is not None:
        return image
    assert params.image_shape is not None  # _check_shape refused flat rows without one
    return params.image_shape


def _size(params: CNN2Params, facts: InputFacts, n_outputs: int) -> ModelSize:
    """Mirrors the builder (``privtrain_common.zoo.cnn2.builder``) layer by layer (tests pin it against torch)."""
    channels, height, width = _image(params, facts)
    out = cnn2_output_hw(height, width)
    assert out is not None  # _check_shape refused images that are too small

    def conv1(size: int) -> int:
        return (size + 6 - 8) // 2 + 1

    def conv2(size: int) -> int:
        return (size - 1 - 4) // 2 + 1

    h1, w1 = conv1(height), conv1(width)
    h2, w2 = conv2(h1), conv2(w1)
    flat = 32 * out[0] * out[1]
    parameters = (
        (channels * 16 * 8 * 8 + 16)
        + 2 * 16  # conv1, GroupNorm(16)
        + (16 * 32 * 4 * 4 + 32)
        + 2 * 32  # conv2, GroupNorm(32)
        + (flat * 32 + 32)
        + (32 * n_outputs + n_outputs)  # FC 32, output
    )
    activations = (
        channels * height * width
        + 3 * 16 * h1 * w1
        + 16 * (h1 - 1) * (w1 - 1)  # conv, norm, tanh, pool
        + 3 * 32 * h2 * w2
        + flat  # conv, norm, tanh, pool (= flatten)
        + 2 * 32
        + n_outputs
    )
    return ModelSize(parameters=parameters, activations=activations)


def _check_shape(params: CNN2Params, facts: InputFacts) -> None:
    shape = facts.feature_shape
    if len(shape) == 3:
        if params.image_shape is not None and tuple(params.image_shape) != shape:
            raise ModelIncompatible(f"image_shape {list(params.image_shape)} differs from the dataset's {list(shape)}")
        image: tuple[int, ...] = shape
    elif params.image_shape is not None:
        image = tuple(params.image_shape)
        if math.prod(image) != facts.n_features:
            raise ModelIncompatible(
                f"image_shape {list(image)} has {math.prod(image)} values, rows have {facts.n_features} features"
            )
    else:
        raise ModelIncompatible(
            "cnn2-gn needs image data: upload an NPZ with X of shape (n, C, H, W) or set "
            "model.params.image_shape for flat rows"
        )
    if cnn2_output_hw(image[1], image[2]) is None:
        raise ModelIncompatible(f"images of {image[1]}x{image[2]} are too small for cnn2-gn")


ENTRIES = (
    ZooEntry(
        name="cnn2-gn",
        summary=(
            "The two-layer CNN of the DC-DPSGD paper's MNIST experiments (conv 16@8x8 s2, "
            "conv 32@4x4 s2, FC 32, tanh) with GroupNorm."
        ),
        params=CNN2Params,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_check_shape,
        size=_size,
        blocks=_blocks,
    ),
)
