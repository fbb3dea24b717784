"""What every torch builder of the zoo shares: the builder registry, fine-tuning blocks, and the
checks of plain JSON parameters (a builder validates what it is given, whoever calls it).

A builder registers under a name of the zoo's table (``privtrain_common.zoo.catalogue``) and
takes its defaults from that entry's parameter declaration, so the two cannot drift.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from torch import nn

from privtrain_common.zoo.catalogue import CATALOGUE, default_params


class ModelBuilder(Protocol):
    """Builds one architecture from validated JSON parameters and the dataset's public shape."""

    def __call__(self, params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module: ...


MODEL_REGISTRY: dict[str, ModelBuilder] = {}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Register a builder under the name jobs and artifacts use; names are unique forever."""

    def decorator(builder: ModelBuilder) -> ModelBuilder:
        if name in MODEL_REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        if name not in CATALOGUE:
            raise ValueError(f"model {name!r} is not in the zoo's catalogue (privtrain_common.zoo.catalogue)")
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


# ----------------------------------------------------------------------------- parameter checks


def check_positive_int(what: str, value: object) -> int:
    # bool is an int subclass; JSON `true` must not become a layer width.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def check_input_shape(input_shape: object) -> tuple[int, ...]:
    if not isinstance(input_shape, (tuple, list)) or len(input_shape) == 0:
        raise ValueError(f"input_shape must be a non-empty tuple of ints, got {input_shape!r}")
    return tuple(check_positive_int("input_shape entries", v) for v in input_shape)


def with_defaults(model: str, params: Mapping[str, object]) -> dict[str, object]:
    """Reject unknown keys (a typo must not silently fall back to a default) and fill the
    defaults the zoo's table declares for ``model``."""
    defaults = default_params(model)
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "none"
        raise ValueError(f"unknown parameter(s) {unknown} for model {model!r}; allowed: {allowed}")
    return {**defaults, **params}


def n_features(input_shape: tuple[int, ...]) -> int:
    return math.prod(input_shape)


def int_list(what: str, value: object, *, min_length: int = 1) -> list[int]:
    if not isinstance(value, (list, tuple)) or len(value) < min_length:
        raise ValueError(f"{what} must be a list of at least {min_length} positive integers, got {value!r}")
    return [check_positive_int(f"{what} entries", v) for v in value]


def groups_for(model: str, groups: object, channels: list[int]) -> int:
    count = check_positive_int(f"{model} groups", groups)
    bad = [c for c in channels if c % count]
    if bad:
        raise ValueError(f"{model} groups must divide every channel count, {count} does not divide {bad}")
    return count


def choice(what: str, value: object, allowed: Mapping[str, object]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{what} must be one of {sorted(allowed)}, got {value!r}")
    return value


def boolean(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false, got {value!r}")
    return value
