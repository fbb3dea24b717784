"""The model zoo: every architecture a job may name, registered by name.

No user code is ever executed: a job names a model and gives plain JSON parameters, and the
worker (and anyone loading a downloaded artifact) rebuilds the exact module from that name and
those parameters. Every model is built only from layers the per-sample gradient engines support
(`dp.per_example.per_sample.SUPPORTED_MODULES`, and the zoo's own layers below, which the
worker registers with both engines in `dp.per_example.ghost.zoo`); there is no BatchNorm,
whose batch statistics would mix samples and break per-sample clipping.

Initialisation is PyTorch's default, made reproducible by the `generator` argument of
`build_model` (see there).

Every model also declares its fine-tuning blocks (`FINETUNE_BLOCKS`): the units
`training.finetune: last_k_blocks` counts from the end, each named and mapped to the children of
the model that it spans. Together they hold every parameter exactly once. The torch-free catalogue
(`kernel.model_catalogue`) lists the same names from the params alone, so `finetune_k` is checked at
submission; tests pin the two against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

__all__ = [
    "ACTIVATIONS",
    "FINETUNE_BLOCKS",
    "MODEL_REGISTRY",
    "ZOO_CONTAINERS",
    "ZOO_LAYERS",
    "FirstToken",
    "ModelBuilder",
    "PatchTokens",
    "PositionalEmbedding",
    "Residual",
    "SelfAttention",
    "TextTransformer",
    "TokenPrepend",
    "TransformerBlock",
    "WSConv2d",
    "build_model",
    "declare_blocks",
    "register_model",
]


class ModelBuilder(Protocol):
    """Builds one architecture from validated JSON parameters and the dataset's public shape."""

    def __call__(self, params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module: ...


MODEL_REGISTRY: dict[str, ModelBuilder] = {}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Register a builder under the name jobs and artifacts use; names are unique forever."""

    def decorator(builder: ModelBuilder) -> ModelBuilder:
        if name in MODEL_REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        MODEL_REGISTRY[name] = builder
        return builder

    return decorator


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}

FINETUNE_BLOCKS = "finetune_blocks"
"""The attribute a built model declares its fine-tuning blocks in: block name → child names."""


def declare_blocks(model: nn.Sequential, blocks: Mapping[str, Sequence[int]]) -> nn.Sequential:
    """Set the model's fine-tuning blocks, given as block name → indices of the children it spans.

    A plain attribute, not a module or buffer: it is not part of the state dict or the model file."""
    setattr(model, FINETUNE_BLOCKS, {name: tuple(str(index) for index in indices) for name, indices in blocks.items()})
    return model


def build_model(
    name: str,
    params: Mapping[str, object],
    *,
    input_shape: tuple[int, ...],
    n_outputs: int,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Build the registered model `name` on the CPU.

    `generator` is a plain `torch.Generator`, deliberately NOT the job's SecureRandom: init is
    data-independent and must not share (or consume) the noise stream, so the runner seeds its own
    generator from os.urandom. It makes initialisation reproducible without changing PyTorch's default init
    distributions: one 63-bit seed is drawn from it and the layers are constructed under
    `torch.random.fork_rng` with the CPU default generator seeded by that seed, so the caller's
    global RNG state is left exactly as it was. (fork_rng touches process-global state, so do not
    build models concurrently from several threads.) With `generator=None` the global CPU RNG is
    used as PyTorch normally does. Initialisation is data-independent, so it needs no secret seed.
    """
    builder = MODEL_REGISTRY.get(name)
    if builder is None:
        known = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(f"unknown model {name!r}; known models: {known}")
    shape = _check_input_shape(input_shape)
    outputs = _check_positive_int("n_outputs", n_outputs)
    if not isinstance(params, Mapping):
        raise ValueError(f"model params must be a mapping, got {type(params).__name__}")
    if generator is None:
        return builder(params, input_shape=shape, n_outputs=outputs)
    if not isinstance(generator, torch.Generator):
        raise TypeError("build_model takes its own torch.Generator, never the job's noise stream")
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device).item())
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return builder(params, input_shape=shape, n_outputs=outputs)


# ----------------------------------------------------------------------------- validation helpers


def _check_positive_int(what: str, value: object) -> int:
    # bool is an int subclass; JSON `true` must not become a layer width.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def _check_input_shape(input_shape: object) -> tuple[int, ...]:
    if not isinstance(input_shape, (tuple, list)) or len(input_shape) == 0:
        raise ValueError(f"input_shape must be a non-empty tuple of ints, got {input_shape!r}")
    return tuple(_check_positive_int("input_shape entries", v) for v in input_shape)


def _with_defaults(model: str, params: Mapping[str, object], defaults: Mapping[str, object]) -> dict[str, object]:
    """Reject unknown keys (a typo must not silently fall back to a default) and fill defaults."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "none"
        raise ValueError(f"unknown parameter(s) {unknown} for model {model!r}; allowed: {allowed}")
    return {**defaults, **params}


def _n_features(input_shape: tuple[int, ...]) -> int:
    return math.prod(input_shape)


# ----------------------------------------------------------------------------- the models


@register_model("logistic-regression")
def _logistic_regression(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Multinomial logistic regression: logits for cross-entropy over n_outputs classes."""
    _with_defaults("logistic-regression", params, {})
    return declare_blocks(nn.Sequential(nn.Flatten(), nn.Linear(_n_features(input_shape), n_outputs)), {"head": [1]})


@register_model("linear-regression")
def _linear_regression(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Least squares: output (batch, 1); the mse loss squeezes it, the model does not."""
    _with_defaults("linear-regression", params, {})
    if n_outputs != 1:
        raise ValueError(f"linear-regression has exactly one output, got n_outputs={n_outputs}")
    return declare_blocks(nn.Sequential(nn.Flatten(), nn.Linear(_n_features(input_shape), 1)), {"head": [1]})


@register_model("mlp")
def _mlp(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Fully connected network: Linear/activation stacks, then a Linear to n_outputs."""
    p = _with_defaults("mlp", params, {"hidden_sizes": [128], "activation": "tanh"})
    hidden = p["hidden_sizes"]
    if not isinstance(hidden, (list, tuple)) or len(hidden) == 0:
        raise ValueError(
            f"mlp hidden_sizes must be a non-empty list of positive ints, got {hidden!r} "
            "(use logistic-regression for a model without hidden layers)"
        )
    sizes = [_check_positive_int("mlp hidden_sizes entries", h) for h in hidden]
    activation = p["activation"]
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"mlp activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    blocks: dict[str, list[int]] = {}
    width = _n_features(input_shape)
    for number, size in enumerate(sizes, start=1):
        blocks[f"hidden{number}"] = [len(layers)]
        layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
        width = size
    blocks["head"] = [len(layers)]
    layers.append(nn.Linear(width, n_outputs))
    return declare_blocks(nn.Sequential(*layers), blocks)


def _cnn2_spatial(size: int) -> int:
    """Side length after the cnn2-gn feature stack; < 1 means the input is too small.

    conv(k8, s2, p3) -> maxpool(2, s1) -> conv(k4, s2) -> maxpool(2, s1). The API keeps a
    torch-free copy of this formula; tests/unit/worker pin it against real PyTorch layers.
    """
    h1 = (size + 6 - 8) // 2 + 1
    h1p = h1 - 1
    h2 = (h1p - 4) // 2 + 1
    return h2 - 1


@register_model("cnn2-gn")
def _cnn2_gn(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """The two-layer CNN of the DC-DPSGD paper's MNIST experiments, with GroupNorm.

    GroupNorm replaces BatchNorm because it normalises each sample on its own, so per-sample
    gradients stay per-sample. Flat rows (d,) are reshaped to `image_shape`.
    """
    p = _with_defaults("cnn2-gn", params, {"groups": 4, "image_shape": None})
    groups = _check_positive_int("cnn2-gn groups", p["groups"])
    if 16 % groups or 32 % groups:
        raise ValueError(f"cnn2-gn groups must divide both 16 and 32, got {groups}")

    image_shape = p["image_shape"]
    if image_shape is not None:
        if not isinstance(image_shape, (list, tuple)) or len(image_shape) != 3:
            raise ValueError(f"cnn2-gn image_shape must be [C, H, W] or null, got {image_shape!r}")
        image = tuple(_check_positive_int("cnn2-gn image_shape entries", v) for v in image_shape)
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
    h_out, w_out = _cnn2_spatial(height), _cnn2_spatial(width)
    if h_out < 1 or w_out < 1:
        raise ValueError(f"cnn2-gn input {height}x{width} is too small (needs at least 14x14)")
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


# ----------------------------------------------------------------------------- image-model layers
#
# The layers below are the zoo's own building blocks. Each one either only calls its children
# (a container) or owns parameters with an exact per-sample gradient rule in the worker's ghost
# engine; none mixes the rows of a batch. Their parameter names are part of the model file
# format: never rename them.


def _standardise(weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero mean, unit variance per output channel (over the fan-in), as in weight standardisation."""
    dims = tuple(range(1, weight.dim()))
    mean = weight.mean(dim=dims, keepdim=True)
    var = weight.var(dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class WSConv2d(nn.Conv2d):
    """Conv2d whose effective weight is the standardised raw weight (Qiao et al. 2019; De et al. 2022).

    Standardisation is a function of the parameter only, never of the data, so rows stay
    independent; the ghost engine maps the per-sample gradient of the effective weight back to
    the raw weight through the standardisation's Jacobian.
    """

    eps: float = 1e-5

    def effective_weight(self) -> torch.Tensor:
        return _standardise(self.weight, self.eps)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._conv_forward(input, self.effective_weight(), self.bias)
        return out


class Residual(nn.Module):
    """body(x) + shortcut(x): the skip connection of residual blocks (a container)."""

    def __init__(self, body: nn.Module, shortcut: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x) + self.shortcut(x)
        return out


class PatchTokens(nn.Module):
    """(B, C, H, W) -> (B, T, d): the patch embedding's feature map as a sequence of tokens."""

    def __init__(self, projection: nn.Conv2d) -> None:
        super().__init__()
        self.projection = projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens: torch.Tensor = self.projection(x).flatten(2).transpose(1, 2)
        return tokens


class TokenPrepend(nn.Module):
    """Prepends one learned token (the class token) to every sequence: (B, T, d) -> (B, T+1, d)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.normal_(self.token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)


class PositionalEmbedding(nn.Module):
    """Adds a learned embedding per position: (B, T, d) -> (B, T, d)."""

    def __init__(self, positions: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.zeros(1, positions, dim))
        nn.init.normal_(self.embedding, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.embedding


class SelfAttention(nn.Module):
    """Multi-head self-attention from four Linear layers (q, k, v, out) applied per position.

    Written out instead of nn.MultiheadAttention so that every parameter belongs to a Linear,
    which both per-sample gradient engines handle exactly. Attention mixes positions, never rows.
    """

    def __init__(self, dim: int, heads: int, *, causal: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.causal = causal
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        batch, positions, dim = t.shape
        return t.reshape(batch, positions, self.heads, dim // self.heads).transpose(1, 2)

    def _allowed(self, key_mask: torch.Tensor | None, positions: int, device: torch.device) -> torch.Tensor | None:
        """Which keys each query may look at, broadcastable to (B, heads, T, T); None: all of them."""
        allowed: torch.Tensor | None = None
        if key_mask is not None:
            allowed = key_mask[:, None, None, :]  # (B, 1, 1, T): padding is never looked at
        if self.causal:
            earlier = torch.ones(positions, positions, dtype=torch.bool, device=device).tril()
            allowed = earlier if allowed is None else allowed & earlier
        return allowed

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`key_mask` (B, T), True where a position is a real token: the others are never attended to."""
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        allowed = self._allowed(key_mask, x.shape[1], x.device)
        if allowed is not None:
            # The dtype's lowest finite value, not -inf: a query with no allowed key (an all-padding
            # row) then averages uniformly instead of producing NaN.
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        mixed = torch.matmul(scores.softmax(dim=-1), v)  # (B, heads, T, d_head)
        out: torch.Tensor = self.out(mixed.transpose(1, 2).flatten(2))
        return out


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, *, causal: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads, causal=causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), key_mask)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class FirstToken(nn.Module):
    """(B, T, d) -> (B, d): the class token's final representation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


class TextTransformer(nn.Module):
    """Token ids (B, T) -> token embedding + learned positions -> pre-norm blocks -> LayerNorm -> head.

    The padding mask is read off the input (`tokens == pad_id`), so every block is told which
    positions are padding and attention never looks at them. `pooling` says what the head sees:
    "mean" (the mean over the non-padding positions: (B, n_classes)), "first" (the first
    position: (B, n_classes)) or "none" (every position: (B, T, n_outputs), a language model's
    next-token logits). A container: its parameters all belong to its children (an Embedding,
    a PositionalEmbedding, the blocks' Linear and LayerNorm layers, the final LayerNorm and the
    Linear head), which both per-sample engines handle exactly, and it never mixes rows.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        pad_id: int,
        positions: int,
        dim: int,
        heads: int,
        mlp_dim: int,
        layers: int,
        n_outputs: int,
        pooling: str,
        causal: bool,
    ) -> None:
        super().__init__()
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id {pad_id} is not a token id of a vocabulary of {vocab_size}")
        if pooling not in TEXT_POOLINGS:
            raise ValueError(f"pooling must be one of {sorted(TEXT_POOLINGS)}, got {pooling!r}")
        self.pad_id = pad_id
        self.pooling = pooling
        self.embedding = nn.Embedding(vocab_size, dim)
        self.positions = PositionalEmbedding(positions, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_dim, causal=causal) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_outputs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        real = tokens != self.pad_id  # (B, T)
        x = self.positions(self.embedding(tokens))
        for block in self.blocks:
            x = block(x, real)
        x = self.norm(x)
        out: torch.Tensor
        if self.pooling == "mean":
            weights = real.unsqueeze(-1).to(x.dtype)
            out = self.head((x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0))
        elif self.pooling == "first":
            out = self.head(x[:, 0])
        else:
            out = self.head(x)
        return out


TEXT_POOLINGS: frozenset[str] = frozenset({"mean", "first", "none"})


# Custom module types in the zoo, for the worker's per-sample engines to register: containers
# and parameter-free modules (rows independent) and layers with parameters (each needs a rule).
ZOO_CONTAINERS: tuple[type[nn.Module], ...] = (
    Residual,
    PatchTokens,
    SelfAttention,
    TransformerBlock,
    FirstToken,
    TextTransformer,
)
ZOO_LAYERS: tuple[type[nn.Module], ...] = (WSConv2d, TokenPrepend, PositionalEmbedding)


# ----------------------------------------------------------------------------- image-model helpers


def _image_input(model: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of the images the model receives: rows are channels-first, as for cnn2-gn."""
    if len(input_shape) != 3:
        raise ValueError(f"{model} needs image rows of shape (C, H, W), got {input_shape}")
    channels, height, width = input_shape
    return channels, height, width


def _int_list(what: str, value: object, *, min_length: int = 1) -> list[int]:
    if not isinstance(value, (list, tuple)) or len(value) < min_length:
        raise ValueError(f"{what} must be a list of at least {min_length} positive integers, got {value!r}")
    return [_check_positive_int(f"{what} entries", v) for v in value]


def _groups_for(model: str, groups: object, channels: list[int]) -> int:
    count = _check_positive_int(f"{model} groups", groups)
    bad = [c for c in channels if c % count]
    if bad:
        raise ValueError(f"{model} groups must divide every channel count, {count} does not divide {bad}")
    return count


def _choice(what: str, value: object, allowed: Mapping[str, object]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{what} must be one of {sorted(allowed)}, got {value!r}")
    return value


def _bool(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false, got {value!r}")
    return value


def _classifier(channels: int, n_outputs: int) -> list[nn.Module]:
    """Global average pooling and a Linear head."""
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, n_outputs)]


# ----------------------------------------------------------------------------- image models


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
    p = _with_defaults("wrn", params, {"depth": 16, "width": 4, "groups": 16, "weight_standardisation": True})
    depth = _check_positive_int("wrn depth", p["depth"])
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"wrn depth must be 6k + 4 with k >= 1 (10, 16, 22, 28, ...), got {depth}")
    width = _check_positive_int("wrn width", p["width"])
    blocks, channels = wrn_channels(depth, width)
    groups = _groups_for("wrn", p["groups"], channels)
    conv: type[nn.Conv2d] = WSConv2d if _bool("wrn weight_standardisation", p["weight_standardisation"]) else nn.Conv2d
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
    p = _with_defaults("resnet-gn", params, {"blocks": [2, 2, 2, 2], "width": 64, "groups": 32})
    blocks = _int_list("resnet-gn blocks", p["blocks"])
    width = _check_positive_int("resnet-gn width", p["width"])
    channels = [width * 2**stage for stage in range(len(blocks))]
    groups = _groups_for("resnet-gn", p["groups"], channels)
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
    p = _with_defaults("cnn", params, {"channels": [32, 64, 128], "groups": 8, "activation": "relu", "pooling": "max"})
    channels = _int_list("cnn channels", p["channels"])
    groups = _groups_for("cnn", p["groups"], channels)
    activation = ACTIVATIONS[_choice("cnn activation", p["activation"], ACTIVATIONS)]
    pooling = POOLINGS[_choice("cnn pooling", p["pooling"], POOLINGS)]
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
    p = _with_defaults("vit", params, {"patch_size": 4, "dim": 192, "depth": 6, "heads": 3, "mlp_dim": 384})
    patch = _check_positive_int("vit patch_size", p["patch_size"])
    dim = _check_positive_int("vit dim", p["dim"])
    depth = _check_positive_int("vit depth", p["depth"])
    heads = _check_positive_int("vit heads", p["heads"])
    mlp_dim = _check_positive_int("vit mlp_dim", p["mlp_dim"])
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


# ----------------------------------------------------------------------------- text models
#
# Both take int64 token ids (B, T), right-padded with `pad_id`, T = input_shape[0] (the dataset's
# max_length). `vocab_size` and `pad_id` are the dataset's tokenizer's: the service fills them in
# from the dataset when a job leaves them out.

_TEXT_DEFAULTS: dict[str, object] = {
    "layers": 2,
    "dim": 128,
    "heads": 4,
    "mlp_dim": 256,
    "vocab_size": None,
    "pad_id": None,
}


def _text_transformer(
    model: str,
    params: Mapping[str, object],
    *,
    input_shape: tuple[int, ...],
    n_outputs: int,
    pooling: str | None,
) -> nn.Module:
    defaults = {**_TEXT_DEFAULTS, **({"pooling": "mean"} if pooling is None else {})}
    p = _with_defaults(model, params, defaults)
    if len(input_shape) != 1:
        raise ValueError(f"{model} needs rows of token ids of shape (max_length,), got {input_shape}")
    if p["vocab_size"] is None or p["pad_id"] is None:
        raise ValueError(f"{model} needs vocab_size and pad_id (the dataset's tokenizer's)")
    vocab_size = _check_positive_int(f"{model} vocab_size", p["vocab_size"])
    pad_id = p["pad_id"]
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
        raise ValueError(f"{model} pad_id must be a token id in [0, vocab_size), got {pad_id!r}")
    dim = _check_positive_int(f"{model} dim", p["dim"])
    heads = _check_positive_int(f"{model} heads", p["heads"])
    if dim % heads:
        raise ValueError(f"{model} dim must be divisible by heads, got dim={dim}, heads={heads}")
    layers = _check_positive_int(f"{model} layers", p["layers"])
    chosen = pooling if pooling is not None else _choice(f"{model} pooling", p["pooling"], {"mean": 0, "first": 0})
    if pooling == "none" and n_outputs != vocab_size:
        raise ValueError(f"{model} has one output per token id: n_outputs must be vocab_size {vocab_size}")
    model_module = TextTransformer(
        vocab_size=vocab_size,
        pad_id=pad_id,
        positions=input_shape[0],
        dim=dim,
        heads=heads,
        mlp_dim=_check_positive_int(f"{model} mlp_dim", p["mlp_dim"]),
        layers=layers,
        n_outputs=n_outputs,
        pooling=chosen,
        causal=pooling == "none",
    )
    blocks = {
        "embedding": ["embedding", "positions"],
        **{f"block{number}": [f"blocks.{number - 1}"] for number in range(1, layers + 1)},
        "head": ["norm", "head"],
    }
    setattr(model_module, FINETUNE_BLOCKS, {name: tuple(members) for name, members in blocks.items()})
    return model_module


@register_model("transformer-classifier")
def _transformer_classifier(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Text classifier: token embedding and learned positions, `layers` pre-norm blocks with
    padding-masked multi-head self-attention and a GELU MLP, a final LayerNorm, then `pooling`
    ("mean" over the non-padding tokens, or the "first" token) and a Linear head: (B, n_outputs)."""
    return _text_transformer(
        "transformer-classifier", params, input_shape=input_shape, n_outputs=n_outputs, pooling=None
    )


@register_model("transformer-lm")
def _transformer_lm(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Decoder-only language model: the same blocks with a causal and padding mask (position t sees
    the real tokens at positions <= t), a final LayerNorm and a Linear to the vocabulary, giving
    next-token logits (B, T, vocab_size).

    The output Linear is NOT tied to the token embedding: a weight shared between an Embedding and
    a Linear has per-sample gradients that are the sum of two layers' terms, which the ghost
    clipping engine cannot compute exactly (it refuses tied parameters), so the two are separate
    parameters (vocab_size × dim more of them)."""
    return _text_transformer("transformer-lm", params, input_shape=input_shape, n_outputs=n_outputs, pooling="none")
