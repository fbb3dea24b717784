"""The torch modules of wrn, resnet-gn, cnn and vit."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from privtrain_common.zoo.building import (
    ACTIVATIONS,
    boolean,
    check_positive_int,
    choice,
    declare_blocks,
    groups_for,
    int_list,
    register_model,
    with_defaults,
)
from privtrain_common.zoo.layers import (
    FirstToken,
    PatchTokens,
    PositionalEmbedding,
    Residual,
    TokenPrepend,
    TransformerBlock,
    WSConv2d,
)


def _image_input(model: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of the images the model receives: rows are channels-first, as for cnn2-gn."""
    if len(input_shape) != 3:
        raise ValueError(f"{model} needs image rows of shape (C, H, W), got {input_shape}")
    channels, height, width = input_shape
    return channels, height, width


def _classifier(channels: int, n_outputs: int) -> list[nn.Module]:
    """Global average pooling and a Linear head."""
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, n_outputs)]


def wrn_channels(depth: int, width: int) -> tuple[int, list[int]]:
    """Blocks per stage and the stem + stage channels of a WRN-depth-width."""
    return (depth - 4) // 6, [16, 16 * width, 32 * width, 64 * width]


@register_model("wrn")
def _wrn(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """WideResNet (Zagoruyko & Komodakis 2016) with GroupNorm and optional weight standardisation.

    As in De et al. 2022 (WRN-16-4 is their CIFAR-10 model): a 3x3 stem conv, three stages of
    pre-activation basic blocks (GroupNorm, ReLU, 3x3 conv, twice) with 16·width, 32·width and
    64·width channels, stride 2 at the start of stages 2 and 3, a 1x1 conv on the shortcut
    where the shape changes, then GroupNorm, ReLU, global average pooling and a Linear head.
    """
    p = with_defaults("wrn", params)
    depth = check_positive_int("wrn depth", p["depth"])
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"wrn depth must be 6k + 4 with k >= 1 (10, 16, 22, 28, ...), got {depth}")
    width = check_positive_int("wrn width", p["width"])
    blocks, channels = wrn_channels(depth, width)
    groups = groups_for("wrn", p["groups"], channels)
    conv: type[nn.Conv2d] = (
        WSConv2d if boolean("wrn weight_standardisation", p["weight_standardisation"]) else nn.Conv2d
    )
    in_channels, _, _ = _image_input("wrn", input_shape)

    layers: list[nn.Module] = [conv(in_channels, channels[0], 3, padding=1)]
    finetune_blocks: dict[str, list[int]] = {"stem": [0]}
    current = channels[0]
    for stage, out in enumerate(channels[1:]):
        for block in range(blocks):
            finetune_blocks[f"stage{stage + 1}.block{block + 1}"] = [len(layers)]
            stride = 2 if stage > 0 and block == 0 else 1
            body = nn.Sequential(
                nn.GroupNorm(groups, current),
                nn.ReLU(),
                conv(current, out, 3, stride=stride, padding=1),
                nn.GroupNorm(groups, out),
                nn.ReLU(),
                conv(out, out, 3, padding=1),
            )
            shortcut = nn.Identity() if stride == 1 and current == out else conv(current, out, 1, stride=stride)
            layers.append(Residual(body, shortcut))
            current = out
    finetune_blocks["head"] = [len(layers), len(layers) + 4]  # the final GroupNorm and the Linear
    layers += [nn.GroupNorm(groups, current), nn.ReLU(), *_classifier(current, n_outputs)]
    return declare_blocks(nn.Sequential(*layers), finetune_blocks)


@register_model("resnet-gn")
def _resnet_gn(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """ResNet-18-style network with GroupNorm for small images (He et al. 2016, CIFAR stem).

    A 3x3 stem conv, then stages of basic blocks (conv, GroupNorm, ReLU, conv, GroupNorm, plus
    the shortcut, then ReLU) with width·2^s channels; stride 2 at the start of every stage but
    the first, a 1x1 conv + GroupNorm shortcut where the shape changes; global average pooling
    and a Linear head. `blocks` [2, 2, 2, 2] with width 64 is ResNet-18.
    """
    p = with_defaults("resnet-gn", params)
    blocks = int_list("resnet-gn blocks", p["blocks"])
    width = check_positive_int("resnet-gn width", p["width"])
    channels = [width * 2**stage for stage in range(len(blocks))]
    groups = groups_for("resnet-gn", p["groups"], channels)
    in_channels, _, _ = _image_input("resnet-gn", input_shape)

    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
        nn.GroupNorm(groups, width),
        nn.ReLU(),
    ]
    finetune_blocks: dict[str, list[int]] = {"stem": [0, 1]}
    current = width
    for stage, (count, out) in enumerate(zip(blocks, channels, strict=True)):
        for block in range(count):
            finetune_blocks[f"stage{stage + 1}.block{block + 1}"] = [len(layers)]
            stride = 2 if stage > 0 and block == 0 else 1
            body = nn.Sequential(
                nn.Conv2d(current, out, 3, stride=stride, padding=1, bias=False),
                nn.GroupNorm(groups, out),
                nn.ReLU(),
                nn.Conv2d(out, out, 3, padding=1, bias=False),
                nn.GroupNorm(groups, out),
            )
            shortcut: nn.Module = nn.Identity()
            if stride != 1 or current != out:
                shortcut = nn.Sequential(
                    nn.Conv2d(current, out, 1, stride=stride, bias=False), nn.GroupNorm(groups, out)
                )
            layers += [Residual(body, shortcut), nn.ReLU()]
            current = out
    finetune_blocks["head"] = [len(layers) + 2]  # after pooling and flattening: the Linear
    layers += _classifier(current, n_outputs)
    return declare_blocks(nn.Sequential(*layers), finetune_blocks)


POOLINGS: dict[str, type[nn.Module]] = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}


@register_model("cnn")
def _cnn(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """A configurable CNN for small images: per stage a 3x3 conv, GroupNorm, activation and a 2x2
    pooling (halving height and width), then a Linear head on the flattened feature map."""
    p = with_defaults("cnn", params)
    channels = int_list("cnn channels", p["channels"])
    groups = groups_for("cnn", p["groups"], channels)
    activation = ACTIVATIONS[choice("cnn activation", p["activation"], ACTIVATIONS)]
    pooling = POOLINGS[choice("cnn pooling", p["pooling"], POOLINGS)]
    current, height, width = _image_input("cnn", input_shape)
    if height >> len(channels) < 1 or width >> len(channels) < 1:
        raise ValueError(
            f"cnn input {height}x{width} is too small for {len(channels)} pooling stages "
            f"(needs at least {2 ** len(channels)}x{2 ** len(channels)})"
        )
    layers: list[nn.Module] = []
    blocks: dict[str, list[int]] = {}
    for stage, out in enumerate(channels, start=1):
        blocks[f"stage{stage}"] = [len(layers), len(layers) + 1]  # the conv and its GroupNorm
        layers += [nn.Conv2d(current, out, 3, padding=1), nn.GroupNorm(groups, out), activation(), pooling(2)]
        current, height, width = out, height // 2, width // 2
    blocks["head"] = [len(layers) + 1]
    layers += [nn.Flatten(), nn.Linear(current * height * width, n_outputs)]
    return declare_blocks(nn.Sequential(*layers), blocks)


@register_model("vit")
def _vit(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Vision Transformer (Dosovitskiy et al. 2021): non-overlapping patches embedded by a conv
    with stride = patch size, a class token and learned positional embeddings, `depth` pre-norm
    blocks (multi-head self-attention and a GELU MLP), a final LayerNorm and a Linear head on the
    class token."""
    p = with_defaults("vit", params)
    patch = check_positive_int("vit patch_size", p["patch_size"])
    dim = check_positive_int("vit dim", p["dim"])
    depth = check_positive_int("vit depth", p["depth"])
    heads = check_positive_int("vit heads", p["heads"])
    mlp_dim = check_positive_int("vit mlp_dim", p["mlp_dim"])
    if dim % heads:
        raise ValueError(f"vit dim must be divisible by heads, got dim={dim}, heads={heads}")
    channels, height, width = _image_input("vit", input_shape)
    if height % patch or width % patch:
        raise ValueError(f"vit patch_size {patch} must divide the image size {height}x{width}")
    positions = (height // patch) * (width // patch) + 1
    model = nn.Sequential(
        PatchTokens(nn.Conv2d(channels, dim, patch, stride=patch)),
        TokenPrepend(dim),
        PositionalEmbedding(positions, dim),
        *[TransformerBlock(dim, heads, mlp_dim) for _ in range(depth)],
        nn.LayerNorm(dim),
        FirstToken(),
        nn.Linear(dim, n_outputs),
    )
    blocks = {
        "embedding": [0, 1, 2],  # patch projection, class token, positional embedding
        **{f"block{number}": [2 + number] for number in range(1, depth + 1)},
        "head": [3 + depth, 5 + depth],  # the final LayerNorm and the Linear
    }
    return declare_blocks(model, blocks)
