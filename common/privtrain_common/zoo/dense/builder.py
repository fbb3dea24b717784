"""The torch modules of logistic-regression, linear-regression and mlp."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from privtrain_common.zoo.building import (
    ACTIVATIONS,
    check_positive_int,
    declare_blocks,
    n_features,
    register_model,
    with_defaults,
)


@register_model("logistic-regression")
def _logistic_regression(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Multinomial logistic regression: logits for cross-entropy over n_outputs classes."""
    with_defaults("logistic-regression", params)
    return declare_blocks(nn.Sequential(nn.Flatten(), nn.Linear(n_features(input_shape), n_outputs)), {"head": [1]})


@register_model("linear-regression")
def _linear_regression(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Least squares: output (batch, 1); the mse loss squeezes it, the model does not."""
    with_defaults("linear-regression", params)
    if n_outputs != 1:
        raise ValueError(f"linear-regression has exactly one output, got n_outputs={n_outputs}")
    return declare_blocks(nn.Sequential(nn.Flatten(), nn.Linear(n_features(input_shape), 1)), {"head": [1]})


@register_model("mlp")
def _mlp(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Fully connected network: Linear/activation stacks, then a Linear to n_outputs."""
    p = with_defaults("mlp", params)
    hidden = p["hidden_sizes"]
    if not isinstance(hidden, (list, tuple)) or len(hidden) == 0:
        raise ValueError(
            f"mlp hidden_sizes must be a non-empty list of positive ints, got {hidden!r} "
            "(use logistic-regression for a model without hidden layers)"
        )
    sizes = [check_positive_int("mlp hidden_sizes entries", h) for h in hidden]
    activation = p["activation"]
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"mlp activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    blocks: dict[str, list[int]] = {}
    width = n_features(input_shape)
    for number, size in enumerate(sizes, start=1):
        blocks[f"hidden{number}"] = [len(layers)]
        layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
        width = size
    blocks["head"] = [len(layers)]
    layers.append(nn.Linear(width, n_outputs))
    return declare_blocks(nn.Sequential(*layers), blocks)
