"""The `hf` model described without torch: a Transformers model built from a job's config.

``params = {"task": "sequence-classification" | "causal-lm", "config": {...}}``, the config a
Transformers config as JSON (``model_type`` one of ``families.FAMILIES``). The service validates
it here, without Transformers: size-capped, only the keys its family declares (so nothing like
``auto_map`` or ``trust_remote_code`` can reach Transformers), sizes in bounds, and the dataset's
tokenizer must fit it. The vocabulary and padding id come from the dataset, as for the zoo's own
text models: ``vocab_size`` is filled in when absent and must hold every token id of the dataset,
``pad_token_id`` is the dataset's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry
from privtrain_common.zoo.hf.families import DATASET_TASKS, FAMILIES, HFFamily, sizes_of, supported_types
from privtrain_common.zoo.inputs import InputFacts
from privtrain_common.zoo.params import object_param, param

MAX_CONFIG_BYTES = 16 * 1024
"""The largest config accepted, as compact JSON: a real Transformers config is a few hundred bytes."""

_LIMITS = {"vocab": 1_000_000, "hidden": 8192, "layers": 48, "heads": 128, "intermediate": 32768, "positions": 8192}
"""Upper bounds on each size (the service's parameter and activation limits apply as well)."""

_FREE_KINDS: dict[str, type | tuple[type, ...]] = {
    "hidden_act": str,
    "activation": str,
    "activation_function": str,
    "layer_norm_eps": (int, float),  # JSON writes 0.0 as 0 too
    "layer_norm_epsilon": (int, float),
    "rms_norm_eps": (int, float),
    "initializer_range": (int, float),
    "bos_token_id": int,
    "eos_token_id": int,
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
    task: Literal["sequence-classification", "causal-lm"] = param(
        "sequence-classification",
        description="sequence-classification (a classification dataset) or causal-lm (a language-model dataset)",
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
    if unknown:
        raise ValueError(
            f"config keys {unknown} are not accepted for model_type {family.model_type!r} (dropout is "
            f"always 0, weights are never tied); accepted: {', '.join(sorted(family.accepted_keys))}"
        )
    for size, key in family.size_keys.items():
        if key in config or size != "vocab":  # vocab_size is the dataset's when left out
            _positive_int(key, config.get(key), _LIMITS[size])
    for key in family.optional_keys:
        if key in config:
            _positive_int(key, config[key], _LIMITS["intermediate"])
    for key in family.free_keys:
        if key in config and (isinstance(config[key], bool) or not isinstance(config[key], _FREE_KINDS[key])):
            raise ValueError(f"config.{key} has the wrong type: {config[key]!r}")
    for key in ("hidden_act", "activation", "activation_function"):
        if key in config and config[key] not in _ACTIVATIONS:
            raise ValueError(f"config.{key} must be one of {sorted(_ACTIVATIONS)}, got {config[key]!r}")
    sizes = sizes_of(family, config)
    if sizes.hidden % sizes.heads:
        raise ValueError(f"the attention heads ({sizes.heads}) must divide the hidden size ({sizes.hidden})")
    if sizes.heads % sizes.kv_heads:
        raise ValueError(f"num_key_value_heads ({sizes.kv_heads}) must divide the attention heads ({sizes.heads})")
    pad_id = config.get("pad_token_id")
    if pad_id is not None and (isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0):
        raise ValueError(f"config.pad_token_id must be a token id, got {pad_id!r}")
    if "vocab_size" in config and isinstance(pad_id, int) and pad_id >= config["vocab_size"]:
        raise ValueError(f"config.pad_token_id ({pad_id}) must be below vocab_size ({config['vocab_size']})")


def _complete(params: dict[str, Any], facts: InputFacts) -> dict[str, Any]:
    """The dataset's vocabulary and padding id in the config: filled in, or refused when they do not fit."""
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


def _check_shape(params: HFParams, facts: InputFacts) -> None:
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
    wanted = DATASET_TASKS[params.task]
    # The service's facts carry the dataset's task; facts without one stand for any dataset.
    if getattr(facts, "task", wanted) != wanted:
        raise ModelIncompatible(f"task {params.task!r} trains on a {wanted} dataset")


def _blocks(params: HFParams) -> list[str]:
    """The embeddings, each encoder or decoder layer, then the head (with the final norm and pooler)."""
    family = FAMILIES[params.config["model_type"]]
    layers = sizes_of(family, params.config).layers
    return ["embedding", *(f"layer{number}" for number in range(1, layers + 1)), "head"]


def _size(params: HFParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    family = FAMILIES[params.config["model_type"]]
    s = sizes_of(family, params.config)
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


ENTRIES = (
    ZooEntry(
        name="hf",
        summary=(
            "A Hugging Face Transformers model from a config, trained from scratch: BERT, RoBERTa, DistilBERT "
            "classifiers, GPT-2, Llama and Qwen2 classifiers and language models; dropout off, eager "
            "attention with the padding masked; exact per-example gradients (ghost clipping)."
        ),
        params=HFParams,
        tasks=frozenset({"classification", "language-model"}),
        check_shape=_check_shape,
        size=_size,
        blocks=_blocks,
        complete=_complete,
        start_from=_start_from,
    ),
)
