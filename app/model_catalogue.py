"""The model catalogue, torch-free: names, parameter schemas and shape checks.

The worker builds the torch module registered under the same name
(``privtrain.architectures``); checking shapes here turns a model that cannot take a dataset
into a 422 at submission instead of a worker crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.config import Settings, get_settings
from app.facts import DatasetFacts
from app.registry import Registry, UnknownName


class ModelIncompatible(ValueError):
    """The model cannot be trained on the dataset (task or shape)."""


UnknownModel = UnknownName


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoParams(_Params):
    pass


class MLPParams(_Params):
    hidden_sizes: list[int] = Field(default_factory=lambda: [128], min_length=1, max_length=8)
    activation: Literal["tanh", "relu"] = "tanh"

    def model_post_init(self, _context: Any) -> None:
        if any(size < 1 or size > 16384 for size in self.hidden_sizes):
            raise ValueError("hidden_sizes entries must be between 1 and 16384")


class CNN2Params(_Params):
    groups: Literal[1, 2, 4, 8, 16] = 4
    image_shape: tuple[int, int, int] | None = Field(
        default=None, description="[C, H, W] to reshape flat (CSV) rows into images"
    )


_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class ModelSize:
    """What a model costs in memory, computed without torch from its params and feature shape."""

    parameters: int
    """Trainable parameters: the same count as torch's sum(p.numel() for p in parameters())."""
    activations: int
    """Values one example's forward pass produces (its input and every layer's output)."""

    def batch_bytes(self, batch_size: int) -> int:
        """Float32 bytes one physical batch holds: forward and backward activations, and one
        per-sample gradient per row (the per-sample engine materialises chunk × parameters)."""
        return batch_size * _FLOAT32_BYTES * (2 * self.activations + self.parameters)


@dataclass(frozen=True)
class ModelSizeLimits:
    """The service's bounds on a model, checked before any budget is reserved."""

    max_parameters: int
    max_activation_bytes: int
    physical_batch_size: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelSizeLimits:
        return cls(
            max_parameters=settings.max_model_parameters,
            max_activation_bytes=settings.max_activation_bytes,
            physical_batch_size=settings.max_physical_batch_size,
        )


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    summary: str
    params_model: type[BaseModel]
    tasks: frozenset[str]
    check_shape: Callable[[BaseModel, DatasetFacts], None]
    size: Callable[[BaseModel, DatasetFacts, int], ModelSize]
    """(params, facts, n_outputs) → the model's size; runs only after check_shape passed."""

    def validate(
        self,
        params: dict[str, Any],
        facts: DatasetFacts,
        *,
        limits: ModelSizeLimits | None = None,
    ) -> dict[str, Any]:
        """Validate params (defaults filled), compatibility and size; returns the normalised params.

        ``limits`` defaults to the process settings, so the planner needs no extra argument; a
        model too large for the worker is refused here instead of failing there after its
        privacy reservation was made (and committed).
        """
        try:
            parsed = self.params_model.model_validate(params)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(part) for part in first["loc"])
            raise ModelIncompatible(f"model.params.{loc}: {first['msg']}") from exc
        if facts.task not in self.tasks:
            raise ModelIncompatible(f"model '{self.name}' supports {sorted(self.tasks)}, the dataset is {facts.task}")
        self.check_shape(parsed, facts)
        self._check_size(
            self.size(parsed, facts, self.n_outputs(facts)),
            limits or ModelSizeLimits.from_settings(get_settings()),
        )
        return parsed.model_dump(mode="json")

    def parameter_count(self, params: dict[str, Any], facts: DatasetFacts) -> int:
        """Trainable parameters of the model the worker would build; params must be valid."""
        parsed = self.params_model.model_validate(params)
        return self.size(parsed, facts, self.n_outputs(facts)).parameters

    def _check_size(self, size: ModelSize, limits: ModelSizeLimits) -> None:
        if size.parameters > limits.max_parameters:
            raise ModelIncompatible(
                f"model '{self.name}' with these params has {size.parameters} trainable "
                f"parameters on this dataset; the service's limit is {limits.max_parameters}"
            )
        needed = size.batch_bytes(limits.physical_batch_size)
        if needed > limits.max_activation_bytes:
            raise ModelIncompatible(
                f"model '{self.name}' with these params needs about {needed} bytes of activations "
                f"and per-sample gradients per physical batch of {limits.physical_batch_size} rows "
                f"({size.parameters} parameters, {size.activations} activations per row); the "
                f"service's limit is {limits.max_activation_bytes} bytes"
            )

    def n_outputs(self, facts: DatasetFacts) -> int:
        if facts.task == "regression":
            return 1
        assert facts.n_classes is not None
        return facts.n_classes


MODELS: Registry[ModelDefinition] = Registry("model")
get_model = MODELS.get


def register_model(definition: ModelDefinition) -> ModelDefinition:
    return MODELS.add(definition.name, definition)


def _any_shape(_params: BaseModel, _facts: DatasetFacts) -> None:
    return None


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


def _linear_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    """Flatten → Linear(d, k): logistic and linear regression."""
    d = facts.n_features
    return ModelSize(parameters=d * n_outputs + n_outputs, activations=d + n_outputs)


def _mlp_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    """Flatten → (Linear, activation) per hidden size → Linear(last, k)."""
    assert isinstance(params, MLPParams)
    width, parameters, activations = facts.n_features, 0, facts.n_features
    for size in [*params.hidden_sizes, n_outputs]:
        parameters += width * size + size
        activations += 2 * size  # the Linear's output and the activation's
        width = size
    return ModelSize(parameters=parameters, activations=activations - n_outputs)


def _cnn_image(params: CNN2Params, facts: DatasetFacts) -> tuple[int, int, int]:
    if len(facts.feature_shape) == 3:
        channels, height, width = facts.feature_shape
        return channels, height, width
    assert params.image_shape is not None  # _cnn_shape refused flat rows without one
    return params.image_shape


def _cnn_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    """Mirrors privtrain.architectures._cnn2_gn layer by layer (tests pin it against torch)."""
    assert isinstance(params, CNN2Params)
    channels, height, width = _cnn_image(params, facts)
    out = cnn2_output_hw(height, width)
    assert out is not None  # _cnn_shape refused images that are too small

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


def _cnn_shape(params: BaseModel, facts: DatasetFacts) -> None:
    assert isinstance(params, CNN2Params)
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


register_model(
    ModelDefinition(
        name="logistic-regression",
        summary="Multinomial logistic regression on the flattened features.",
        params_model=NoParams,
        tasks=frozenset({"classification"}),
        check_shape=_any_shape,
        size=_linear_size,
    )
)
register_model(
    ModelDefinition(
        name="linear-regression",
        summary="Linear regression (squared loss) on the flattened features.",
        params_model=NoParams,
        tasks=frozenset({"regression"}),
        check_shape=_any_shape,
        size=_linear_size,
    )
)
register_model(
    ModelDefinition(
        name="mlp",
        summary="Fully connected network on the flattened features.",
        params_model=MLPParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_any_shape,
        size=_mlp_size,
    )
)
register_model(
    ModelDefinition(
        name="cnn2-gn",
        summary=(
            "The two-layer CNN of the DC-DPSGD paper's MNIST experiments (conv 16@8x8 s2, "
            "conv 32@4x4 s2, FC 32, tanh) with GroupNorm."
        ),
        params_model=CNN2Params,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_cnn_shape,
        size=_cnn_size,
    )
)
