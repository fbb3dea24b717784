"""The model zoo: every architecture a job may name, registered by name.

No user code is ever executed: a job names a model and gives plain JSON parameters, and the
worker (and anyone loading a downloaded artifact) rebuilds the exact module from that name and
those parameters. Every model is built only from layers the per-sample gradient engine supports
(`worker.optimizers.per_sample.SUPPORTED_MODULES`); there is no BatchNorm, whose batch statistics
would mix samples and break per-sample clipping.

Initialisation is PyTorch's default, made reproducible by the `generator` argument of
`build_model` (see there).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from torch import nn

__all__ = [
    "ACTIVATIONS",
    "MODEL_REGISTRY",
    "ModelBuilder",
    "build_model",
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
    return nn.Sequential(nn.Flatten(), nn.Linear(_n_features(input_shape), n_outputs))


@register_model("linear-regression")
def _linear_regression(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Least squares: output (batch, 1); the mse loss squeezes it, the model does not."""
    _with_defaults("linear-regression", params, {})
    if n_outputs != 1:
        raise ValueError(f"linear-regression has exactly one output, got n_outputs={n_outputs}")
    return nn.Sequential(nn.Flatten(), nn.Linear(_n_features(input_shape), 1))


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
    width = _n_features(input_shape)
    for size in sizes:
        layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
        width = size
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)


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
    return nn.Sequential(*layers)
