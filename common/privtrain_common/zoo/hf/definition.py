"""The `hf` model described without torch: a Transformers model built from a job's config.

``params = {"task": "sequence-classification" | "causal-lm" | "image-classification", "config": {...}}``,
the config a Transformers config as JSON (``model_type`` one of ``families.FAMILIES``). The service
validates it here, without Transformers: size-capped, only the keys its family declares (so nothing like
``auto_map`` or ``trust_remote_code`` can reach Transformers), sizes in bounds, and the dataset's
tokenizer must fit it. The vocabulary and padding id come from the dataset, as for the zoo's own
text models: ``vocab_size`` is filled in when absent and must hold every token id of the dataset,
``pad_token_id`` is the dataset's. Image models (ViT, ConvNeXt) take a classification dataset of
images instead, whose (C, H, W) must be the config's ``num_channels`` and ``image_size``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry
from privtrain_common.zoo.hf.families import DATASET_TASKS, FAMILIES, HFFamily, Sizes, sizes_of, supported_types
from privtrain_common.zoo.inputs import InputFacts, image_chw
from privtrain_common.zoo.params import object_param, param

MAX_CONFIG_BYTES = 16 * 1024
"""The largest config accepted, as compact JSON: a real Transformers config is a few hundred bytes."""

_LIMITS = {
    "vocab": 1_000_000,
    "hidden": 8192,
    "layers": 48,
    "heads": 128,
    "intermediate": 32768,
    "positions": 131_072,  # Llama 3's; a learned position table also counts against the parameter limit
    "channels": 64,
    "image": 1024,
    "patch": 256,
}
"""Upper bounds on each size (the service's parameter and activation limits apply as well)."""
_MAX_STAGES = 8
"""At most this many ConvNeXt stages (the published models have four)."""

_FREE_KINDS: dict[str, type | tuple[type, ...]] = {
    "hidden_act": str,
    "activation": str,
    "activation_function": str,
    "layer_norm_eps": (int, float),  # JSON writes 0.0 as 0 too
    "layer_norm_epsilon": (int, float),
    "rms_norm_eps": (int, float),
    "rope_theta": (int, float),
    "initializer_range": (int, float),
    "bos_token_id": int,
    "eos_token_id": int,
    "qkv_bias": bool,
    "layer_scale_init_value": (int, float),
}
_ACTIVATIONS = frozenset({"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh"})


DEFAULT_CONFIG: Mapping[str, object] = MappingProxyType(
    {
        "model_type": "bert",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
    }
)
"""What a job that gives no config gets: a small BERT, the size of transformer-classifier's defaults."""


@dataclass(frozen=True, kw_only=True)
class HFParams:
    task: Literal["sequence-classification", "causal-lm", "image-classification"] = param(
        "sequence-classification",
        description=(
            "sequence-classification (a classification dataset of text), causal-lm (a language-model dataset) "
            "or image-classification (a classification dataset of images: vit, convnext)"
        ),
    )
    config: dict[str, Any] = object_param(
        DEFAULT_CONFIG,
        description=(
            f"a Transformers config as JSON; model_type one of {', '.join(supported_types())}; "
            "vocab_size and pad_token_id are the dataset's tokenizer's when left out"
        ),
    )

    def __post_init__(self) -> None:
        family = family_of(self.config)
        if self.task not in family.tasks:
            raise ValueError(f"model_type {family.model_type!r} serves {sorted(family.tasks)}, not {self.task!r}")
        check_config(family, self.config)


def family_of(config: object) -> HFFamily:
    """The allow-listed family a config names, or ValueError naming the supported list."""
    if not isinstance(config, dict):
        raise ValueError("config must be a JSON object (a Transformers config)")
    if len(json.dumps(config, separators=(",", ":"))) > MAX_CONFIG_BYTES:
        raise ValueError(f"config is larger than {MAX_CONFIG_BYTES} bytes")
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ValueError(
            f"config.model_type {model_type!r} is not supported; supported: {', '.join(supported_types())}"
        )
    return family


def _positive_int(key: str, value: object, limit: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(f"config.{key} must be an integer between 1 and {limit}, got {value!r}")


def check_config(family: HFFamily, config: dict[str, Any]) -> None:
    """Only the family's keys, required sizes present and in bounds, heads dividing the width."""
    unknown = sorted(set(config) - family.accepted_keys)
    depth = " and stochastic depth (drop_path_rate)" if "drop_path_rate" in family.dropout_keys else ""
    if unknown:
        raise ValueError(
            f"config keys {unknown} are not accepted for model_type {family.model_type!r} (dropout{depth} is "
            f"always 0, weights are never tied); accepted: {', '.join(sorted(family.accepted_keys))}"
        )
    for size, key in family.size_keys.items():
        if key in config or size != "vocab":  # vocab_size is the dataset's when left out
            _positive_int(key, config.get(key), _LIMITS[size])
    for key in family.optional_keys:
        if key in config:
            _positive_int(key, config[key], _LIMITS["intermediate"])
    for key in family.free_keys:
        kind = _FREE_KINDS[key]
        if key in config and (
            (isinstance(config[key], bool) and kind is not bool) or not isinstance(config[key], kind)
        ):
            raise ValueError(f"config.{key} has the wrong type: {config[key]!r}")
    _check_image_keys(family, config)
    for key in ("hidden_act", "activation", "activation_function"):
        if key in config and config[key] not in _ACTIVATIONS:
            raise ValueError(f"config.{key} must be one of {sorted(_ACTIVATIONS)}, got {config[key]!r}")
    sizes = sizes_of(family, config)
    if sizes.hidden % sizes.heads:
        raise ValueError(f"the attention heads ({sizes.heads}) must divide the hidden size ({sizes.hidden})")
    if sizes.heads % sizes.kv_heads:
        raise ValueError(f"num_key_value_heads ({sizes.kv_heads}) must divide the attention heads ({sizes.heads})")
    theta = config.get("rope_theta", 10_000.0)
    if not 1.0 <= theta <= 1e9:
        raise ValueError(f"config.rope_theta must be between 1 and 1e9, got {theta!r}")
    pad_id = config.get("pad_token_id")
    if pad_id is not None and (isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0):
        raise ValueError(f"config.pad_token_id must be a token id, got {pad_id!r}")
    if "vocab_size" in config and isinstance(pad_id, int) and pad_id >= config["vocab_size"]:
        raise ValueError(f"config.pad_token_id ({pad_id}) must be below vocab_size ({config['vocab_size']})")


def _check_image_keys(family: HFFamily, config: dict[str, Any]) -> None:
    """ConvNeXt's per-stage lists (equal lengths, sizes in bounds), a patch no larger than the image,
    a layer scale that is not negative."""
    if not family.image:
        return
    for key in sorted(family.list_keys):
        value = config.get(key)
        if not isinstance(value, list) or not 1 <= len(value) <= _MAX_STAGES:
            raise ValueError(f"config.{key} must be a list of 1 to {_MAX_STAGES} sizes, one per stage, got {value!r}")
        for item in value:
            _positive_int(key, item, _LIMITS["hidden" if key == "hidden_sizes" else "layers"])
    if family.list_keys and len(config["hidden_sizes"]) != len(config["depths"]):
        raise ValueError("config.hidden_sizes and config.depths must give one size per stage each")
    if "num_stages" in config and config["num_stages"] != len(config["depths"]):
        raise ValueError(f"config.num_stages ({config['num_stages']}) must be the number of stages in config.depths")
    if config["patch_size"] > config["image_size"]:
        raise ValueError(f"config.patch_size ({config['patch_size']}) is larger than config.image_size")
    scale = config.get("layer_scale_init_value", 0)
    if scale < 0:
        raise ValueError(f"config.layer_scale_init_value must not be negative, got {scale!r}")


def _complete(params: dict[str, Any], facts: InputFacts) -> dict[str, Any]:
    """The dataset's vocabulary and padding id in the config: filled in, or refused when they do not fit
    (image models have neither: their config is taken as given)."""
    if params.get("task") == "image-classification":
        return params
    if facts.vocab_size is None or facts.pad_id is None:
        raise ModelIncompatible(
            "hf models need a text dataset (token ids with a vocabulary); upload text as JSON Lines"
        )
    config = params.get("config", DEFAULT_CONFIG)
    if not isinstance(config, Mapping):
        return params  # validation refuses it
    config = dict(config)
    given = config.setdefault("vocab_size", facts.vocab_size)
    if isinstance(given, int) and not isinstance(given, bool) and given < facts.vocab_size:
        raise ModelIncompatible(
            f"model.params.config.vocab_size is {given} but the dataset's tokenizer has {facts.vocab_size} token "
            "ids; give at least that many, or leave it out to use the dataset's"
        )
    pad_id = config.setdefault("pad_token_id", facts.pad_id)
    if pad_id != facts.pad_id:
        raise ModelIncompatible(
            f"model.params.config.pad_token_id is {pad_id!r} but the dataset's tokenizer pads with {facts.pad_id}; "
            "leave it out to use the dataset's"
        )
    return {**params, "config": config}


def _check_dataset_task(params: HFParams, facts: InputFacts) -> None:
    wanted = DATASET_TASKS[params.task]
    # The service's facts carry the dataset's task; facts without one stand for any dataset.
    if getattr(facts, "task", wanted) != wanted:
        raise ModelIncompatible(f"task {params.task!r} trains on a {wanted} dataset")


def _check_image_shape(params: HFParams, facts: InputFacts) -> None:
    """The dataset's images must be the (C, H, W) the config describes: a ViT's position embeddings
    and patch grid are sized for ``image_size``, and both families check ``num_channels``."""
    family = FAMILIES[params.config["model_type"]]
    s = sizes_of(family, params.config)
    chw = image_chw(facts)
    if chw != (s.channels, s.image, s.image):
        found = list(chw) if chw is not None else list(facts.feature_shape)
        raise ModelIncompatible(
            f"model.params.config gives num_channels {s.channels} and image_size {s.image}, so images of "
            f"{[s.channels, s.image, s.image]} (C, H, W); the dataset's rows are {found}"
        )
    if family.model_type == "convnext" and s.image < s.patch * 2 ** (len(s.stages) - 1):
        raise ModelIncompatible(
            f"a {s.image}×{s.image} image is too small for patch_size {s.patch} and {len(s.stages)} stages "
            "(each stage after the first halves the side)"
        )
    _check_dataset_task(params, facts)


def _check_shape(params: HFParams, facts: InputFacts) -> None:
    if params.task == "image-classification":
        _check_image_shape(params, facts)
        return
    if len(facts.feature_shape) != 1:
        raise ModelIncompatible(
            f"hf models take rows of token ids (max_length,), the dataset's rows are {list(facts.feature_shape)}"
        )
    family = FAMILIES[params.config["model_type"]]
    sizes = sizes_of(family, params.config)
    offset = params.config["pad_token_id"] + 1 if family.model_type == "roberta" else 0
    needed = facts.feature_shape[0] + offset
    if sizes.positions < needed:
        raise ModelIncompatible(
            f"model.params.config.{family.size_keys['positions']} is {sizes.positions}, the dataset's rows need "
            f"{needed} positions{' (RoBERTa counts its positions from pad_token_id + 1)' if offset else ''}"
        )
    _check_dataset_task(params, facts)


def _blocks(params: HFParams) -> list[str]:
    """The embeddings, each encoder or decoder layer (each ConvNeXt stage), then the head (with the
    final norm and pooler)."""
    family = FAMILIES[params.config["model_type"]]
    layers = sizes_of(family, params.config).layers
    unit = "stage" if family.list_keys else "layer"
    return ["embedding", *(f"{unit}{number}" for number in range(1, layers + 1)), "head"]


def _image_activations(family: HFFamily, s: Sizes, n_outputs: int) -> int:
    """The image, then per layer as for the text encoders (ViT: the patches and the CLS are its
    tokens); a ConvNeXt layer holds about ten (H, W, d) maps, its MLP's 4d-wide ones twice."""
    image = s.channels * s.image * s.image
    if family.model_type == "vit":
        tokens = (s.image // s.patch) ** 2 + 1
        layer = 10 * tokens * s.hidden + 2 * tokens * s.intermediate + 2 * s.heads * tokens * tokens
        return image + 3 * tokens * s.hidden + s.layers * layer + s.hidden + n_outputs
    side, total = s.image // s.patch, image
    for index, (width, depth) in enumerate(s.stages):
        side = side // 2 if index else side
        total += 2 * side * side * width + depth * 18 * side * side * width
    return total + 2 * s.hidden + n_outputs


def _size(params: HFParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    family = FAMILIES[params.config["model_type"]]
    s = sizes_of(family, params.config)
    if family.image:
        return ModelSize(
            parameters=family.parameters(s, params.task, n_outputs),
            activations=_image_activations(family, s, n_outputs),
        )
    tokens = facts.feature_shape[0]
    # As for transformer-lm: ten (T, d) tensors per layer, the MLP's hidden layer twice, scores and softmax per head.
    layer = 10 * tokens * s.hidden + 2 * tokens * s.intermediate + 2 * s.heads * tokens * tokens
    head = tokens * s.vocab if params.task == "causal-lm" else s.hidden + n_outputs
    return ModelSize(
        parameters=family.parameters(s, params.task, n_outputs),
        activations=tokens + 2 * tokens * s.hidden + s.layers * layer + tokens * s.hidden + head,
    )


def _start_from(params: dict[str, Any], init: dict[str, Any]) -> dict[str, Any]:
    """A job on a checkpoint takes its config; it may train another task (a classifier from a
    language model: the body is reused, the head is new) and any row length its positions hold."""
    config = params.get("config")
    if config is not None and (
        not isinstance(config, dict) or any(init["config"].get(key) != value for key, value in config.items())
    ):
        differ = sorted(k for k, v in config.items() if init["config"].get(k) != v) if isinstance(config, dict) else []
        raise ModelIncompatible(
            f"model.params.config differs from the config of the weights it starts from ({', '.join(differ)}); "
            "leave it out to use theirs"
        )
    return {"task": params.get("task", init["task"]), "config": dict(init["config"])}


def _check_lora(params: HFParams, targets: tuple[str, ...] | None) -> bool:
    """PEFT's adapters go on the family's accepted layers; a classifier's head trains with them (PEFT's
    ``modules_to_save``: a new head would otherwise stay random), a language model's stays frozen."""
    lora = FAMILIES[params.config["model_type"]].lora
    unknown = sorted(set(targets or ()) - lora.accepted)
    if unknown:
        raise ModelIncompatible(
            f"training.lora.target_modules {unknown} are not layers a {params.config['model_type']!r} model takes "
            f"adapters on; accepted: {', '.join(sorted(lora.accepted))} (default: {', '.join(lora.default)})"
        )
    return params.task != "causal-lm"


ENTRIES = (
    ZooEntry(
        name="hf",
        summary=(
            "A Hugging Face Transformers model from a config, trained from scratch: BERT, RoBERTa, DistilBERT "
            "classifiers, GPT-2, Llama and Qwen2 classifiers and language models, ViT and ConvNeXt image "
            "classifiers; dropout off, eager attention with the padding masked; exact per-example gradients "
            "(ghost clipping for the text models, vmap for the image models)."
        ),
        params=HFParams,
        tasks=frozenset({"classification", "language-model"}),
        check_shape=_check_shape,
        size=_size,
        blocks=_blocks,
        complete=_complete,
        start_from=_start_from,
        lora=True,
        lora_targets={
            model_type: {"default": family.lora.default, "accepted": tuple(sorted(family.lora.accepted))}
            for model_type, family in FAMILIES.items()
        },
        check_lora=_check_lora,
    ),
)
