"""The model catalogue, torch-free: names, parameter schemas and shape checks.

The worker builds the torch module registered under the same name
(``privtrain_common.zoo.architectures``); checking shapes here turns a model that cannot take a dataset
into a 422 at submission instead of a worker crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernel.config import Settings, get_settings
from kernel.datasets.facts import DatasetFacts
from kernel.errors import FinetuneKOutOfRange
from kernel.registry import Registry, UnknownName


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

    @classmethod
    def for_gpu(cls, settings: Settings, *, device_memory_bytes: int) -> ModelSizeLimits:
        """A GPU worker's chunks: up to ``gpu_max_physical_batch_size`` rows in a share of the
        device's memory (at least the service's ``max_activation_bytes``, which the API checks a
        single row against, so a model the API admitted always fits one row)."""
        share = int(settings.gpu_activation_memory_fraction * device_memory_bytes)
        return cls(
            max_parameters=settings.max_model_parameters,
            max_activation_bytes=max(settings.max_activation_bytes, share),
            physical_batch_size=settings.gpu_max_physical_batch_size,
        )

    def rows_per_chunk(self, size: ModelSize) -> int:
        """Rows per per-sample-gradient chunk for this model: the service's physical batch, or fewer
        when that many rows would not fit ``max_activation_bytes`` (0: not even one row fits).
        Chunking never changes a result, so a long-sequence model trains in smaller chunks
        instead of being refused."""
        return min(self.physical_batch_size, self.max_activation_bytes // size.batch_bytes(1))


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    summary: str
    params_model: type[BaseModel]
    tasks: frozenset[str]
    check_shape: Callable[[BaseModel, DatasetFacts], None]
    size: Callable[[BaseModel, DatasetFacts, int], ModelSize]
    """(params, facts, n_outputs) → the model's size; runs only after check_shape passed."""
    blocks: Callable[[BaseModel], list[str]]
    """params → the names of the model's fine-tuning blocks, first to last, as the worker's module
    declares them (``privtrain_common.zoo.architectures.FINETUNE_BLOCKS``; tests pin the two together)."""
    complete: Callable[[dict[str, Any], DatasetFacts], dict[str, Any]] | None = None
    """Fills params that belong to the dataset (a text model's vocab_size and pad_id) before
    validation, refusing a given value that differs (ModelIncompatible)."""
    lora: bool = False
    """Whether ``training.finetune: lora`` applies: the model has attention and MLP Linear layers."""

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
        if self.complete is not None:
            params = self.complete(dict(params), facts)
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

    def facts_for_weights(
        self, params: dict[str, Any], *, input_shape: tuple[int, ...], n_outputs: int
    ) -> DatasetFacts:
        """Facts standing for any dataset that weights of this architecture fit (a base-model upload
        has no dataset): a language model's task when it takes one, else classification with
        ``n_outputs`` classes (regression for one output); a text model's vocab_size and pad_id are
        the ones its params give."""
        if "language-model" in self.tasks:
            task = "language-model"
        elif n_outputs > 1:
            task = "classification"
        else:
            task = "regression"
        vocabulary = {field: params.get(field) for field in _TEXT_FACTS} if self.complete is not None else {}
        return DatasetFacts(
            n_rows=1,
            feature_shape=input_shape,
            task=task,
            n_classes=n_outputs if task == "classification" else None,
            **vocabulary,
        )

    def rows_per_chunk(self, params: dict[str, Any], facts: DatasetFacts, *, limits: ModelSizeLimits) -> int:
        """Rows per per-sample-gradient chunk the worker uses for this model (params must be valid)."""
        parsed = self.params_model.model_validate(params)
        return max(1, limits.rows_per_chunk(self.size(parsed, facts, self.n_outputs(facts))))

    def parameter_count(self, params: dict[str, Any], facts: DatasetFacts) -> int:
        """Trainable parameters of the model the worker would build; params must be valid."""
        parsed = self.params_model.model_validate(params)
        return self.size(parsed, facts, self.n_outputs(facts)).parameters

    def block_names(self, params: dict[str, Any]) -> list[str]:
        """The fine-tuning blocks ``last_k_blocks`` counts from the end; params must be valid."""
        return self.blocks(self.params_model.model_validate(params))

    def block_count(self, params: dict[str, Any]) -> int:
        """How many fine-tuning blocks the model has: the largest ``training.finetune_k``."""
        return len(self.block_names(params))

    def check_finetune_k(self, params: dict[str, Any], finetune_k: int) -> None:
        """Refuse a ``finetune_k`` above the block count at submission, not on the worker."""
        names = self.block_names(params)
        if finetune_k > len(names):
            raise FinetuneKOutOfRange(model=self.name, finetune_k=finetune_k, blocks=names)

    def _check_size(self, size: ModelSize, limits: ModelSizeLimits) -> None:
        if size.parameters > limits.max_parameters:
            raise ModelIncompatible(
                f"model '{self.name}' with these params has {size.parameters} trainable "
                f"parameters on this dataset; the service's limit is {limits.max_parameters}"
            )
        if limits.rows_per_chunk(size) < 1:
            raise ModelIncompatible(
                f"model '{self.name}' with these params needs about {size.batch_bytes(1)} bytes of "
                f"activations and per-sample gradients for a single row ({size.parameters} parameters, "
                f"{size.activations} activations per row); the service's limit per physical batch is "
                f"{limits.max_activation_bytes} bytes"
            )

    def n_outputs(self, facts: DatasetFacts) -> int:
        if facts.task == "regression":
            return 1
        if facts.task == "language-model":  # next-token logits: one output per token id
            assert facts.vocab_size is not None
            return facts.vocab_size
        assert facts.n_classes is not None
        return facts.n_classes


MODELS: Registry[ModelDefinition] = Registry("model")
get_model = MODELS.get


def register_model(definition: ModelDefinition) -> ModelDefinition:
    return MODELS.add(definition.name, definition)


def _numeric_features(_params: BaseModel, facts: DatasetFacts) -> None:
    """Any shape of numbers (flattened); token ids are not: their values are names, not magnitudes."""
    if facts.vocab_size is not None:
        raise ModelIncompatible(
            "this model reads its features as numbers, and a text dataset's rows are token ids (their "
            "values name tokens, they do not measure anything); use transformer-classifier for text "
            "classification or transformer-lm for language modelling"
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


def _head_only(params: BaseModel) -> list[str]:
    """Logistic and linear regression: one Linear, the head."""
    return ["head"]


def _mlp_blocks(params: BaseModel) -> list[str]:
    """One block per Linear: each hidden layer, then the head."""
    assert isinstance(params, MLPParams)
    return [*(f"hidden{number}" for number in range(1, len(params.hidden_sizes) + 1)), "head"]


def _cnn2_blocks(params: BaseModel) -> list[str]:
    """Each conv with its GroupNorm, the hidden Linear, the head."""
    return ["conv1", "conv2", "fc", "head"]


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


def image_chw(facts: DatasetFacts) -> tuple[int, int, int] | None:
    """(C, H, W) of the images the model receives, None when the rows are not images.

    A 3-D feature shape is channels-first, (C, H, W): an NPZ of floats with X of shape
    (n, C, H, W), and an image dataset, whose public feature shape is the layout the worker feeds
    the model (its uint8 array is stored channels-last and transposed batch by batch).
    """
    if len(facts.feature_shape) != 3:
        return None
    channels, height, width = facts.feature_shape
    return channels, height, width


def _cnn_image(params: CNN2Params, facts: DatasetFacts) -> tuple[int, int, int]:
    image = image_chw(facts)
    if image is not None:
        return image
    assert params.image_shape is not None  # _cnn_shape refused flat rows without one
    return params.image_shape


def _cnn_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    """Mirrors privtrain_common.zoo.architectures._cnn2_gn layer by layer (tests pin it against torch)."""
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
        check_shape=_numeric_features,
        size=_linear_size,
        blocks=_head_only,
    )
)
register_model(
    ModelDefinition(
        name="linear-regression",
        summary="Linear regression (squared loss) on the flattened features.",
        params_model=NoParams,
        tasks=frozenset({"regression"}),
        check_shape=_numeric_features,
        size=_linear_size,
        blocks=_head_only,
    )
)
register_model(
    ModelDefinition(
        name="mlp",
        summary="Fully connected network on the flattened features.",
        params_model=MLPParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_numeric_features,
        size=_mlp_size,
        blocks=_mlp_blocks,
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
        blocks=_cnn2_blocks,
    )
)


# ----------------------------------------------------------------------------- the image zoo
#
# wrn, resnet-gn, cnn and vit take images (C, H, W) (see image_chw). Each size function
# mirrors its privtrain_common.zoo.architectures builder layer by layer: parameters exactly, activations as
# the input plus every layer's output, residual sums and attention's score matrices
# (tests/unit/test_model_catalogue_zoo.py pins both against torch).


class WRNParams(_Params):
    depth: int = Field(default=16, ge=10, le=100, description="6k + 4: 16 is WRN-16 (two blocks per stage)")
    width: int = Field(default=4, ge=1, le=20, description="channel multiplier: stages have 16, 32, 64 × width")
    groups: Literal[1, 2, 4, 8, 16] = Field(default=16, description="GroupNorm groups")
    weight_standardisation: bool = Field(
        default=True, description="standardise every conv's weight per output channel (De et al. 2022)"
    )

    @model_validator(mode="after")
    def _depth_is_6k_plus_4(self) -> WRNParams:
        if (self.depth - 4) % 6:
            raise ValueError(f"depth must be 6k + 4 (10, 16, 22, 28, ...), got {self.depth}")
        return self


class ResNetGNParams(_Params):
    blocks: list[int] = Field(
        default_factory=lambda: [2, 2, 2, 2],
        min_length=1,
        max_length=6,
        description="basic blocks per stage; [2, 2, 2, 2] is ResNet-18",
    )
    width: int = Field(default=64, ge=1, le=512, description="channels of the first stage, doubled per stage")
    groups: int = Field(default=32, ge=1, le=512, description="GroupNorm groups; must divide width")

    @model_validator(mode="after")
    def _consistent(self) -> ResNetGNParams:
        if any(count < 1 or count > 16 for count in self.blocks):
            raise ValueError("blocks entries must be between 1 and 16")
        if self.width % self.groups:
            raise ValueError(f"groups ({self.groups}) must divide width ({self.width})")
        return self


class CNNParams(_Params):
    channels: list[int] = Field(
        default_factory=lambda: [32, 64, 128],
        min_length=1,
        max_length=8,
        description="output channels of each stage (3x3 conv, GroupNorm, activation, 2x2 pooling)",
    )
    groups: int = Field(default=8, ge=1, le=1024, description="GroupNorm groups; must divide every channel count")
    activation: Literal["tanh", "relu"] = "relu"
    pooling: Literal["max", "avg"] = "max"

    @model_validator(mode="after")
    def _consistent(self) -> CNNParams:
        if any(c < 1 or c > 1024 for c in self.channels):
            raise ValueError("channels entries must be between 1 and 1024")
        bad = [c for c in self.channels if c % self.groups]
        if bad:
            raise ValueError(f"groups ({self.groups}) must divide every channel count, not {bad}")
        return self


class ViTParams(_Params):
    patch_size: int = Field(default=4, ge=1, le=64, description="side of the square patches; must divide H and W")
    dim: int = Field(default=192, ge=1, le=4096, description="token width")
    depth: int = Field(default=6, ge=1, le=48, description="transformer blocks")
    heads: int = Field(default=3, ge=1, le=64, description="attention heads; must divide dim")
    mlp_dim: int = Field(default=384, ge=1, le=16384, description="hidden width of each block's MLP")

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> ViTParams:
        if self.dim % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide dim ({self.dim})")
        return self


def _conv_out(size: int, *, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _needs_images(model: str) -> ModelIncompatible:
    return ModelIncompatible(
        f"{model} needs image data: upload an image dataset (an NPZ with uint8 X of shape (n, H, W, C) "
        "or a ZIP of images), or an NPZ with float X of shape (n, C, H, W)"
    )


def _image_or_refuse(model: str, facts: DatasetFacts) -> tuple[int, int, int]:
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


def _wrn_blocks(params: BaseModel) -> list[str]:
    """The stem conv, each residual block, then the final GroupNorm with the Linear head."""
    assert isinstance(params, WRNParams)
    return ["stem", *_stage_blocks([(params.depth - 4) // 6] * 3), "head"]


def _resnet_blocks(params: BaseModel) -> list[str]:
    """The stem (conv and GroupNorm), each basic block, then the Linear head."""
    assert isinstance(params, ResNetGNParams)
    return ["stem", *_stage_blocks(params.blocks), "head"]


def _configurable_cnn_blocks(params: BaseModel) -> list[str]:
    """Each stage's conv with its GroupNorm, then the Linear head."""
    assert isinstance(params, CNNParams)
    return [*(f"stage{stage}" for stage in range(1, len(params.channels) + 1)), "head"]


def _vit_blocks(params: BaseModel) -> list[str]:
    """The embedding (patch projection, class token, positions), each transformer block, then the
    final LayerNorm with the Linear head."""
    assert isinstance(params, ViTParams)
    return ["embedding", *(f"block{number}" for number in range(1, params.depth + 1)), "head"]


def _wrn_shape(params: BaseModel, facts: DatasetFacts) -> None:
    _image_or_refuse("wrn", facts)


def _wrn_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    assert isinstance(params, WRNParams)
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


def _resnet_shape(params: BaseModel, facts: DatasetFacts) -> None:
    _image_or_refuse("resnet-gn", facts)


def _resnet_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    assert isinstance(params, ResNetGNParams)
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


def _configurable_cnn_shape(params: BaseModel, facts: DatasetFacts) -> None:
    assert isinstance(params, CNNParams)
    _, height, width = _image_or_refuse("cnn", facts)
    if not _cnn_stages_fit(params, height, width):
        side = 2 ** len(params.channels)
        raise ModelIncompatible(
            f"images of {height}x{width} are too small for cnn with {len(params.channels)} pooling stages "
            f"(needs at least {side}x{side}; use fewer channels entries)"
        )


def _configurable_cnn_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    assert isinstance(params, CNNParams)
    current, height, width = _image_or_refuse("cnn", facts)
    parameters, activations = 0, current * height * width
    for out in params.channels:
        parameters += current * out * 9 + out + 2 * out
        activations += 3 * out * height * width  # conv, GroupNorm, activation
        current, height, width = out, height // 2, width // 2
        activations += current * height * width  # pooling
    parameters += current * height * width * n_outputs + n_outputs
    return ModelSize(parameters=parameters, activations=activations + n_outputs)


def _vit_shape(params: BaseModel, facts: DatasetFacts) -> None:
    assert isinstance(params, ViTParams)
    _, height, width = _image_or_refuse("vit", facts)
    if height % params.patch_size or width % params.patch_size:
        raise ModelIncompatible(f"vit patch_size {params.patch_size} must divide the image size {height}x{width}")


def _vit_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    assert isinstance(params, ViTParams)
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


register_model(
    ModelDefinition(
        name="wrn",
        summary=(
            "WideResNet-depth-width (De et al. 2022's WRN-16-4 by default) with GroupNorm, pre-activation "
            "residual blocks and optional weight standardisation, for images."
        ),
        params_model=WRNParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_wrn_shape,
        size=_wrn_size,
        blocks=_wrn_blocks,
    )
)
register_model(
    ModelDefinition(
        name="resnet-gn",
        summary="ResNet-18-style network (basic blocks per stage, configurable) with GroupNorm, for images.",
        params_model=ResNetGNParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_resnet_shape,
        size=_resnet_size,
        blocks=_resnet_blocks,
    )
)
register_model(
    ModelDefinition(
        name="cnn",
        summary="A configurable CNN for small images: per stage a 3x3 conv, GroupNorm, activation and 2x2 pooling.",
        params_model=CNNParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_configurable_cnn_shape,
        size=_configurable_cnn_size,
        blocks=_configurable_cnn_blocks,
    )
)
register_model(
    ModelDefinition(
        name="vit",
        summary=(
            "Vision Transformer: patch embedding, class token, positional embedding and pre-norm "
            "multi-head self-attention blocks, all with exact ghost clipping."
        ),
        params_model=ViTParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_vit_shape,
        size=_vit_size,
        blocks=_vit_blocks,
        lora=True,
    )
)


# ----------------------------------------------------------------------------- text models
#
# transformer-classifier and transformer-lm take a text dataset's token ids (feature_shape
# [max_length]); vocab_size and pad_id are the dataset's tokenizer's, filled in by `_text_params`
# when a job leaves them out. The size mirrors privtrain_common.zoo.architectures.TextTransformer.


class TextTransformerParams(_Params):
    layers: int = Field(default=2, ge=1, le=48, description="transformer blocks")
    dim: int = Field(default=128, ge=1, le=4096, description="token width")
    heads: int = Field(default=4, ge=1, le=64, description="attention heads; must divide dim")
    mlp_dim: int = Field(default=256, ge=1, le=16384, description="hidden width of each block's MLP")
    vocab_size: int | None = Field(
        default=None, ge=1, le=1_000_000, description="the dataset's vocabulary size (filled in from the dataset)"
    )
    pad_id: int | None = Field(
        default=None, ge=0, description="the dataset's padding token id (filled in from the dataset)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> TextTransformerParams:
        if self.dim % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide dim ({self.dim})")
        if self.vocab_size is not None and self.pad_id is not None and self.pad_id >= self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be below vocab_size ({self.vocab_size})")
        return self


class TransformerClassifierParams(TextTransformerParams):
    pooling: Literal["mean", "first"] = Field(
        default="mean", description="what the head sees: the mean over the non-padding tokens, or the first token"
    )


_TEXT_FACTS = ("vocab_size", "pad_id")


def _text_params(params: dict[str, Any], facts: DatasetFacts) -> dict[str, Any]:
    """vocab_size and pad_id from the dataset's tokenizer: filled in when absent, refused when different."""
    for field in _TEXT_FACTS:
        known = getattr(facts, field)
        if known is None:
            raise ModelIncompatible(
                "transformer models need a text dataset (token ids with a vocabulary and a padding id); "
                "upload text as JSON Lines"
            )
        given = params.get(field)
        if given is None:
            params[field] = known
        elif given != known:
            raise ModelIncompatible(
                f"model.params.{field} is {given!r} but the dataset's tokenizer has {field} {known}; "
                "leave it out to use the dataset's"
            )
    return params


def _text_shape(params: BaseModel, facts: DatasetFacts) -> None:
    if len(facts.feature_shape) != 1:
        raise ModelIncompatible(
            "transformer models take rows of token ids (max_length,), the dataset's rows are "
            f"{list(facts.feature_shape)}"
        )


def _text_blocks(params: BaseModel) -> list[str]:
    """The embedding (tokens and positions), each transformer block, then the final LayerNorm with the head."""
    assert isinstance(params, TextTransformerParams)
    return ["embedding", *(f"block{number}" for number in range(1, params.layers + 1)), "head"]


def _text_size(params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
    assert isinstance(params, TextTransformerParams) and params.vocab_size is not None
    d, m, layers = params.dim, params.mlp_dim, params.layers
    tokens = facts.feature_shape[0]
    per_token_head = not isinstance(params, TransformerClassifierParams)  # a language model's logits
    block_parameters = 2 * d + 4 * (d * d + d) + 2 * d + (d * m + m) + (m * d + d)
    # As for vit: ten (T, d) tensors, the MLP's hidden layer and GELU, the scores and softmax per head.
    block_activations = 10 * tokens * d + 2 * tokens * m + 2 * params.heads * tokens * tokens
    parameters = params.vocab_size * d + tokens * d + layers * block_parameters + 2 * d + d * n_outputs + n_outputs
    head_activations = tokens * n_outputs if per_token_head else d + n_outputs
    activations = tokens + 2 * tokens * d + layers * block_activations + tokens * d + head_activations
    return ModelSize(parameters=parameters, activations=activations)


register_model(
    ModelDefinition(
        name="transformer-classifier",
        summary=(
            "Text classifier: token and positional embeddings, pre-norm blocks with padding-masked "
            "multi-head self-attention, mean or first-token pooling and a Linear head; exact ghost clipping."
        ),
        params_model=TransformerClassifierParams,
        tasks=frozenset({"classification"}),
        check_shape=_text_shape,
        size=_text_size,
        blocks=_text_blocks,
        complete=_text_params,
        lora=True,
    )
)
register_model(
    ModelDefinition(
        name="transformer-lm",
        summary=(
            "Decoder-only language model: causal, padding-masked pre-norm blocks and a Linear to the "
            "vocabulary (not tied to the embedding, so clipping stays exact); next-token logits."
        ),
        params_model=TextTransformerParams,
        tasks=frozenset({"language-model"}),
        check_shape=_text_shape,
        size=_text_size,
        blocks=_text_blocks,
        complete=_text_params,
        lora=True,
    )
)
