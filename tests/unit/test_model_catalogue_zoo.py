"""The image zoo in the torch-free catalogue: sizes equal the torch modules, shapes are checked.

Parameter counts and activation estimates are pinned against the modules the worker builds, so
the service's size limits refuse exactly the jobs the worker could not hold.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from kernel.datasets.facts import DatasetFacts
from kernel.model_catalogue import ModelIncompatible, ModelSizeLimits, get_model
from privtrain_common.zoo.architectures import Residual, SelfAttention, TransformerBlock, build_model


def _facts(shape: tuple[int, ...], n_classes: int | None = 3) -> DatasetFacts:
    """An image dataset's or a channels-first NPZ's facts: feature_shape (C, H, W)."""
    return DatasetFacts(20, shape, "classification" if n_classes else "regression", n_classes)


CASES: list[tuple[str, dict[str, Any], DatasetFacts]] = [
    ("wrn", {"depth": 10, "width": 1, "groups": 4}, _facts((3, 8, 8))),
    ("wrn", {"depth": 16, "width": 2, "weight_standardisation": False}, _facts((1, 9, 7))),
    ("resnet-gn", {"blocks": [1, 2], "width": 4, "groups": 2}, _facts((3, 9, 8), None)),
    ("resnet-gn", {"blocks": [1, 1, 1], "width": 8, "groups": 8}, _facts((3, 8, 8), 10)),
    ("cnn", {"channels": [4, 8], "groups": 4}, _facts((1, 7, 9))),
    ("cnn", {"channels": [6], "groups": 3, "activation": "tanh", "pooling": "avg"}, _facts((3, 8, 8))),
    ("vit", {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 12}, _facts((3, 8, 8))),
    ("vit", {"patch_size": 2, "dim": 6, "depth": 1, "heads": 3, "mlp_dim": 5}, _facts((1, 4, 6), 2)),
]


def _torch_sizes(name: str, params: dict[str, Any], facts: DatasetFacts) -> tuple[int, int]:
    """(parameters, activation values per example) of the module the worker builds: the input,
    every layer's output, residual sums, and attention's scores, softmax and mixed values."""
    shape = facts.feature_shape
    model = build_model(name, params, input_shape=shape, n_outputs=get_model(name).n_outputs(facts))
    produced: list[int] = []

    def leaf(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        if not isinstance(module, (nn.Flatten, nn.Unflatten, nn.Identity)):  # views, no new memory
            produced.append(output[0].numel())

    def residual(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        produced.append(output[0].numel())

    def two_sums(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        produced.append(2 * output[0].numel())

    def attention(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        assert isinstance(module, SelfAttention)
        tokens = output.shape[1]
        produced.append(2 * module.heads * tokens * tokens + output[0].numel())

    for module in model.modules():
        if not list(module.children()):
            module.register_forward_hook(leaf)
        elif isinstance(module, Residual):
            module.register_forward_hook(residual)
        elif isinstance(module, TransformerBlock):
            module.register_forward_hook(two_sums)
        elif isinstance(module, SelfAttention):
            module.register_forward_hook(attention)
    with torch.no_grad():
        model(torch.zeros((1, *shape)))
    return sum(p.numel() for p in model.parameters()), facts.n_features + sum(produced)


@pytest.mark.parametrize(("name", "params", "facts"), CASES)
def test_catalogue_sizes_equal_torch(name: str, params: dict[str, Any], facts: DatasetFacts) -> None:
    definition = get_model(name)
    normalised = definition.validate(params, facts)
    parameters, activations = _torch_sizes(name, normalised, facts)
    assert definition.parameter_count(normalised, facts) == parameters
    size = definition.size(definition.params_model.model_validate(normalised), facts, definition.n_outputs(facts))
    assert size.activations == activations


def test_reference_configs_have_their_published_sizes() -> None:
    cifar = _facts((3, 32, 32), 10)
    assert get_model("wrn").parameter_count(get_model("wrn").validate({}, cifar), cifar) == 2_751_146  # WRN-16-4
    # ResNet-18 (its per-sample gradients at the default physical batch exceed the default
    # memory limit: an operator raises PRIVTRAIN_MAX_ACTIVATION_BYTES or lowers the batch).
    assert get_model("resnet-gn").parameter_count({}, cifar) == 11_173_962


@pytest.mark.parametrize(
    ("name", "params", "facts", "message"),
    [
        ("wrn", {}, _facts((64,)), "needs image data"),
        ("vit", {}, _facts((3, 8)), "needs image data"),
        ("wrn", {"depth": 12}, _facts((3, 8, 8)), "6k \\+ 4"),
        ("wrn", {"depth": 10, "groups": 3}, _facts((3, 8, 8)), "groups"),
        ("wrn", {"wdith": 2}, _facts((3, 8, 8)), "wdith"),
        ("resnet-gn", {"width": 12, "groups": 8}, _facts((3, 8, 8)), "must divide width"),
        ("resnet-gn", {"blocks": []}, _facts((3, 8, 8)), "blocks"),
        ("cnn", {"channels": [8, 8, 8, 8]}, _facts((1, 8, 8)), "too small"),
        ("cnn", {"channels": [6, 8], "groups": 4}, _facts((3, 8, 8)), "divide every channel"),
        ("vit", {"patch_size": 3}, _facts((3, 8, 8)), "must divide the image size"),
        ("vit", {"dim": 10, "heads": 3}, _facts((3, 8, 8)), "must divide dim"),
    ],
)
def test_mismatched_configs_are_refused(name: str, params: dict[str, Any], facts: DatasetFacts, message: str) -> None:
    with pytest.raises(ModelIncompatible, match=message):
        get_model(name).validate(params, facts)


def test_refusals_agree_with_the_builders() -> None:
    """What the catalogue refuses the builder refuses too (no worker crash after admission)."""
    with pytest.raises(ValueError, match="too small"):
        build_model("cnn", {"channels": [8, 8, 8, 8]}, input_shape=(1, 8, 8), n_outputs=2)
    with pytest.raises(ValueError, match="must divide the image size"):
        build_model("vit", {"patch_size": 3}, input_shape=(3, 8, 8), n_outputs=2)
    with pytest.raises(ValueError, match="6k \\+ 4"):
        build_model("wrn", {"depth": 12}, input_shape=(3, 8, 8), n_outputs=2)


def test_oversized_configs_are_refused_by_the_size_limits() -> None:
    cifar = _facts((3, 32, 32), 10)
    limits = ModelSizeLimits(max_parameters=50_000_000, max_activation_bytes=8 * 1024**3, physical_batch_size=256)
    get_model("wrn").validate({}, cifar, limits=limits)  # WRN-16-4 fits the default limits
    get_model("vit").validate({}, cifar, limits=limits)
    with pytest.raises(ModelIncompatible, match=r"trainable parameters on this dataset; the service's limit"):
        get_model("wrn").validate({"depth": 40, "width": 20}, cifar, limits=limits)
    # 1,025 tokens per image: admitted, in chunks smaller than the service's physical batch …
    long_vit = get_model("vit").validate({"patch_size": 1, "dim": 64, "heads": 1, "depth": 2}, cifar, limits=limits)
    assert 1 <= get_model("vit").rows_per_chunk(long_vit, cifar, limits=limits) < 256
    # … but not when a single image's attention scores alone are over the limit.
    with pytest.raises(ModelIncompatible, match=r"bytes of activations and per-sample gradients for a single row"):
        get_model("vit").validate({"patch_size": 1, "dim": 64, "heads": 64, "depth": 12}, cifar, limits=limits)
