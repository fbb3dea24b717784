"""wrn, resnet-gn, cnn and vit described without torch: their parameters, the images they take, their sizes.

They take images (C, H, W) (see ``privtrain_common.zoo.inputs.image_chw``). Each size function
mirrors its builder (``privtrain_common.zoo.images.builder``) layer by layer: parameters exactly,
activations as the input plus every layer's output, residual sums and attention's score matrices
(tests/unit/test_model_catalogue_zoo.py pins both against torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry
from privtrain_common.zoo.inputs import InputFacts, image_chw
from privtrain_common.zoo.params import list_param, param


@dataclass(frozen=True, kw_only=True)
class WRNParams:
    depth: int = param(16, ge=10, le=100, description="6k + 4: 16 is WRN-16 (two blocks per stage)")
    width: int = param(4, ge=1, le=20, description="channel multiplier: stages have 16, 32, 64 × width")
    groups: Literal[1, 2, 4, 8, 16] = param(16, description="GroupNorm groups")
    weight_standardisation: bool = param(
        True, description="standardise every conv's weight per output channel (De et al. 2022)"
    )

    def __post_init__(self) -> None:
        if (self.depth - 4) % 6:
            raise ValueError(f"depth must be 6k + 4 (10, 16, 22, 28, ...), got {self.depth}")


@dataclass(frozen=True, kw_only=True)
class ResNetGNParams:
    blocks: list[int] = list_param(
        (2, 2, 2, 2), min_length=1, max_length=6, description="basic blocks per stage; [2, 2, 2, 2] is ResNet-18"
    )
    width: int = param(64, ge=1, le=512, description="channels of the first stage, doubled per stage")
    groups: int = param(32, ge=1, le=512, description="GroupNorm groups; must divide width")

    def __post_init__(self) -> None:
        if any(count < 1 or count > 16 for count in self.blocks):
            raise ValueError("blocks entries must be between 1 and 16")
        if self.width % self.groups:
            raise ValueError(f"groups ({self.groups}) must divide width ({self.width})")


@dataclass(frozen=True, kw_only=True)
class CNNParams:
    channels: list[int] = list_param(
        (32, 64, 128),
        min_length=1,
        max_length=8,
        description="output channels of each stage (3x3 conv, GroupNorm, activation, 2x2 pooling)",
    )
    groups: int = param(8, ge=1, le=1024, description="GroupNorm groups; must divide every channel count")
    activation: Literal["tanh", "relu"] = "relu"
    pooling: Literal["max", "avg"] = "max"

    def __post_init__(self) -> None:
        if any(c < 1 or c > 1024 for c in self.channels):
            raise ValueError("channels entries must be between 1 and 1024")
        bad = [c for c in self.channels if c % self.groups]
        if bad:
            raise ValueError(f"groups ({self.groups}) must divide every channel count, not {bad}")


@dataclass(frozen=True, kw_only=True)
class ViTParams:
    patch_size: int = param(4, ge=1, le=64, description="side of the square patches; must divide H and W")
    dim: int = param(192, ge=1, le=4096, description="token width")
    depth: int = param(6, ge=1, le=48, description="transformer blocks")
    heads: int = param(3, ge=1, le=64, description="attention heads; must divide dim")
    mlp_dim: int = param(384, ge=1, le=16384, description="hidden width of each block's MLP")

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide dim ({self.dim})")


def _conv_out(size: int, *, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _needs_images(model: str) -> ModelIncompatible:
    return ModelIncompatible(
        f"{model} needs image data: upload an image dataset (an NPZ with uint8 X of shape (n, H, W, C) "
        "or a ZIP of images), or an NPZ with float X of shape (n, C, H, W)"
    )


def _image_or_refuse(model: str, facts: InputFacts) -> tuple[int, int, int]:
    image = image_chw(facts)
    if image is None:
        raise _needs_images(model)
    return image


def _stage_blocks(blocks_per_stage: list[int]) -> list[str]:
    """``stage{s}.block{b}`` for every residual block, stage by stage."""
    return [
        f"stage{stage}.block{block}"
        for stage, count in enumerate(blocks_per_stage, start=1)
        for block in range(1, count + 1)
    ]


def _wrn_blocks(params: WRNParams) -> list[str]:
    """The stem conv, each residual block, then the final GroupNorm with the Linear head."""
    return ["stem", *_stage_blocks([(params.depth - 4) // 6] * 3), "head"]


def _resnet_blocks(params: ResNetGNParams) -> list[str]:
    """The stem (conv and GroupNorm), each basic block, then the Linear head."""
    return ["stem", *_stage_blocks(params.blocks), "head"]


def _configurable_cnn_blocks(params: CNNParams) -> list[str]:
    """Each stage's conv with its GroupNorm, then the Linear head."""
    return [*(f"stage{stage}" for stage in range(1, len(params.channels) + 1)), "head"]


def _vit_blocks(params: ViTParams) -> list[str]:
    """The embedding (patch projection, class token, positions), each transformer block, then the
    final LayerNorm with the Linear head."""
    return ["embedding", *(f"block{number}" for number in range(1, params.depth + 1)), "head"]


def _wrn_shape(params: WRNParams, facts: InputFacts) -> None:
    _image_or_refuse("wrn", facts)


def _wrn_size(params: WRNParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    in_channels, height, width = _image_or_refuse("wrn", facts)
    blocks = (params.depth - 4) // 6
    current = 16
    parameters = in_channels * current * 9 + current
    activations = in_channels * height * width + current * height * width
    for stage, out in enumerate((16 * params.width, 32 * params.width, 64 * params.width)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            h2, w2 = (
                _conv_out(height, kernel=3, stride=stride, padding=1),
                _conv_out(width, kernel=3, stride=stride, padding=1),
            )
            parameters += 2 * current + (current * out * 9 + out) + 2 * out + (out * out * 9 + out)
            activations += 2 * current * height * width + 4 * out * h2 * w2 + out * h2 * w2  # + residual sum
            if stride != 1 or current != out:
                parameters += current * out + out
                activations += out * h2 * w2
            current, height, width = out, h2, w2
    parameters += 2 * current + current * n_outputs + n_outputs
    activations += 2 * current * height * width + current + n_outputs
    return ModelSize(parameters=parameters, activations=activations)


def _resnet_shape(params: ResNetGNParams, facts: InputFacts) -> None:
    _image_or_refuse("resnet-gn", facts)


def _resnet_size(params: ResNetGNParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    in_channels, height, width = _image_or_refuse("resnet-gn", facts)
    current = params.width
    parameters = in_channels * current * 9 + 2 * current
    activations = in_channels * height * width + 3 * current * height * width
    for stage, count in enumerate(params.blocks):
        out = params.width * 2**stage
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            h2, w2 = (
                _conv_out(height, kernel=3, stride=stride, padding=1),
                _conv_out(width, kernel=3, stride=stride, padding=1),
            )
            parameters += current * out * 9 + 2 * out + out * out * 9 + 2 * out
            activations += 5 * out * h2 * w2 + 2 * out * h2 * w2  # body; residual sum and ReLU
            if stride != 1 or current != out:
                parameters += current * out + 2 * out
                activations += 2 * out * h2 * w2
            current, height, width = out, h2, w2
    parameters += current * n_outputs + n_outputs
    activations += current + n_outputs
    return ModelSize(parameters=parameters, activations=activations)


def _cnn_stages_fit(params: CNNParams, height: int, width: int) -> bool:
    return (height >> len(params.channels)) >= 1 and (width >> len(params.channels)) >= 1


def _configurable_cnn_shape(params: CNNParams, facts: InputFacts) -> None:
    _, height, width = _image_or_refuse("cnn", facts)
    if not _cnn_stages_fit(params, height, width):
        side = 2 ** len(params.channels)
        raise ModelIncompatible(
            f"images of {height}x{width} are too small for cnn with {len(params.channels)} pooling stages "
            f"(needs at least {side}x{side}; use fewer channels entries)"
        )


def _configurable_cnn_size(params: CNNParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    current, height, width = _image_or_refuse("cnn", facts)
    parameters, activations = 0, current * height * width
    for out in params.channels:
        parameters += current * out * 9 + out + 2 * out
        activations += 3 * out * height * width  # conv, GroupNorm, activation
        current, height, width = out, height // 2, width // 2
        activations += current * height * width  # pooling
    parameters += current * height * width * n_outputs + n_outputs
    return ModelSize(parameters=parameters, activations=activations + n_outputs)


def _vit_shape(params: ViTParams, facts: InputFacts) -> None:
    _, height, width = _image_or_refuse("vit", facts)
    if height % params.patch_size or width % params.patch_size:
        raise ModelIncompatible(f"vit patch_size {params.patch_size} must divide the image size {height}x{width}")


def _vit_size(params: ViTParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    channels, height, width = _image_or_refuse("vit", facts)
    d, m, p = params.dim, params.mlp_dim, params.patch_size
    tokens = (height // p) * (width // p) + 1  # patches and the class token
    block_parameters = 2 * d + 4 * (d * d + d) + 2 * d + (d * m + m) + (m * d + d)
    # LayerNorm, q, k, v, out, attention output, sum, LayerNorm, MLP out, sum: 10 (T, d) tensors;
    # the MLP's hidden layer and GELU; the scores and their softmax per head.
    block_activations = 10 * tokens * d + 2 * tokens * m + 2 * params.heads * tokens * tokens
    parameters = (
        channels * d * p * p
        + d  # patch embedding
        + d  # class token
        + tokens * d  # positional embedding
        + params.depth * block_parameters
        + 2 * d  # final LayerNorm
        + d * n_outputs
        + n_outputs
    )
    activations = (
        channels * height * width
        + (tokens - 1) * d  # patch embedding
        + 2 * tokens * d  # class token prepended, positions added
        + params.depth * block_activations
        + tokens * d
        + d
        + n_outputs  # final LayerNorm, class token, head
    )
    return ModelSize(parameters=parameters, activations=activations)


ENTRIES = (
    ZooEntry(
        name="wrn",
        summary=(
            "WideResNet-depth-width (De et al. 2022's WRN-16-4 by default) with GroupNorm, pre-activation "
            "residual blocks and optional weight standardisation, for images."
        ),
        params=WRNParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_wrn_shape,
        size=_wrn_size,
        blocks=_wrn_blocks,
    ),
    ZooEntry(
        name="resnet-gn",
        summary="ResNet-18-style network (basic blocks per stage, configurable) with GroupNorm, for images.",
        params=ResNetGNParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_resnet_shape,
        size=_resnet_size,
        blocks=_resnet_blocks,
    ),
    ZooEntry(
        name="cnn",
        summary="A configurable CNN for small images: per stage a 3x3 conv, GroupNorm, activation and 2x2 pooling.",
        params=CNNParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_configurable_cnn_shape,
        size=_configurable_cnn_size,
        blocks=_configurable_cnn_blocks,
    ),
    ZooEntry(
        name="vit",
        summary=(
            "Vision Transformer: patch embedding, class token, positional embedding and pre-norm "
            "multi-head self-attention blocks, all with exact ghost clipping."
        ),
        params=ViTParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_vit_shape,
        size=_vit_size,
        blocks=_vit_blocks,
        lora=True,
    ),
)
