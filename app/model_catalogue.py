"""The model catalogue, torch-free: names, parameter schemas and shape checks.

The worker builds the torch module registered under the same name
(``worker.training.models``); checking shapes here turns a model that cannot take a dataset
into a 422 at submission instead of a worker crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    summary: str
    params_model: type[BaseModel]
    tasks: frozenset[str]
    check_shape: Callable[[BaseModel, DatasetFacts], None]

    def validate(self, params: dict[str, Any], facts: DatasetFacts) -> dict[str, Any]:
        """Validate params (defaults filled) and compatibility; returns the normalised params."""
        try:
            parsed = self.params_model.model_validate(params)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(part) for part in first["loc"])
            raise ModelIncompatible(f"model.params.{loc}: {first['msg']}") from exc
        if facts.task not in self.tasks:
            raise ModelIncompatible(
                f"model '{self.name}' supports {sorted(self.tasks)}, the dataset is {facts.task}"
            )
        self.check_shape(parsed, facts)
        return parsed.model_dump(mode="json")

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


def _cnn_shape(params: BaseModel, facts: DatasetFacts) -> None:
    assert isinstance(params, CNN2Params)
    shape = facts.feature_shape
    if len(shape) == 3:
        if params.image_shape is not None and tuple(params.image_shape) != shape:
            raise ModelIncompatible(
                f"image_shape {list(params.image_shape)} differs from the dataset's {list(shape)}"
            )
        image = shape
    elif params.image_shape is not None:
        image = tuple(params.image_shape)
        if math.prod(image) != facts.n_features:
            raise ModelIncompatible(
                f"image_shape {list(image)} has {math.prod(image)} values, rows have "
                f"{facts.n_features} features"
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
    )
)
register_model(
    ModelDefinition(
        name="linear-regression",
        summary="Linear regression (squared loss) on the flattened features.",
        params_model=NoParams,
        tasks=frozenset({"regression"}),
        check_shape=_any_shape,
    )
)
register_model(
    ModelDefinition(
        name="mlp",
        summary="Fully connected network on the flattened features.",
        params_model=MLPParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_any_shape,
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
    )
)
