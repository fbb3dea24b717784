"""Tiny Transformers configs of every `hf` model type, built offline from the config alone."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from privtrain_common.zoo.architectures import build_model
from tests.unit.worker.text_fixtures import LENGTH, PAD, VOCAB

_SIZES: dict[str, dict[str, int]] = {
    "bert": {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12},
    "roberta": {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12},
    "distilbert": {"dim": 8, "n_layers": 2, "n_heads": 2, "hidden_dim": 12},
    "gpt2": {"n_embd": 8, "n_layer": 2, "n_head": 2},
    "llama": {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12},
    "qwen2": {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12},
}
_POSITIONS = {"distilbert": "max_position_embeddings", "gpt2": "n_positions"}

HF_CASES: list[tuple[str, str]] = [
    *((model_type, "sequence-classification") for model_type in _SIZES),
    *((model_type, "causal-lm") for model_type in ("gpt2", "llama", "qwen2")),
]
"""(model_type, task): every allow-listed type as a classifier, the decoders as language models too."""


def hf_config(model_type: str, *, positions: int = 16) -> dict[str, Any]:
    """A tiny config (vocabulary and padding left to the dataset) with room for ``positions`` tokens."""
    key = _POSITIONS.get(model_type, "max_position_embeddings")
    extra = {"num_key_value_heads": 1} if model_type in ("llama", "qwen2") else {}
    return {"model_type": model_type, **_SIZES[model_type], key: positions, **extra}


def hf_model(model_type: str, task: str, *, seed: int = 7, dtype: torch.dtype = torch.float64) -> nn.Module:
    """The `hf` model of the text fixtures' vocabulary (VOCAB ids, PAD, rows of LENGTH)."""
    config = {**hf_config(model_type), "vocab_size": VOCAB, "pad_token_id": PAD}
    model = build_model(
        "hf",
        {"task": task, "config": config},
        input_shape=(LENGTH,),
        n_outputs=VOCAB if task == "causal-lm" else 3,
        generator=torch.Generator().manual_seed(seed),
    )
    return model.to(dtype)
