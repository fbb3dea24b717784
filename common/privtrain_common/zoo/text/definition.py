"""transformer-classifier and transformer-lm described without torch.

Both take a text dataset's token ids (feature_shape [max_length]); vocab_size and pad_id are the
dataset's tokenizer's, filled in by ``_text_params`` when a job leaves them out. The size mirrors
the builder's ``TextTransformer`` (``privtrain_common.zoo.layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry
from privtrain_common.zoo.inputs import InputFacts
from privtrain_common.zoo.params import param


@dataclass(frozen=True, kw_only=True)
class TextTransformerParams:
    layers: int = param(2, ge=1, le=48, description="transformer blocks")
    dim: int = param(128, ge=1, le=4096, description="token width")
    heads: int = param(4, ge=1, le=64, description="attention heads; must divide dim")
    mlp_dim: int = param(256, ge=1, le=16384, description="hidden width of each block's MLP")
    vocab_size: int | None = param(
        None, ge=1, le=1_000_000, description="the dataset's vocabulary size (filled in from the dataset)"
    )
    pad_id: int | None = param(None, ge=0, description="the dataset's padding token id (filled in from the dataset)")

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide dim ({self.dim})")
        if self.vocab_size is not None and self.pad_id is not None and self.pad_id >= self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be below vocab_size ({self.vocab_size})")


@dataclass(frozen=True, kw_only=True)
class TransformerClassifierParams(TextTransformerParams):
    pooling: Literal["mean", "first"] = param(
        "mean", description="what the head sees: the mean over the non-padding tokens, or the first token"
    )


DATASET_PARAMS = ("vocab_size", "pad_id")
"""The params a text model takes from its dataset's tokenizer."""


def _text_params(params: dict[str, Any], facts: InputFacts) -> dict[str, Any]:
    """vocab_size and pad_id from the dataset's tokenizer: filled in when absent, refused when different."""
    for field in DATASET_PARAMS:
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


def _text_shape(params: TextTransformerParams, facts: InputFacts) -> None:
    if len(facts.feature_shape) != 1:
        raise ModelIncompatible(
            "transformer models take rows of token ids (max_length,), the dataset's rows are "
            f"{list(facts.feature_shape)}"
        )


def _text_blocks(params: TextTransformerParams) -> list[str]:
    """The embedding (tokens and positions), each transformer block, then the final LayerNorm with the head."""
    return ["embedding", *(f"block{number}" for number in range(1, params.layers + 1)), "head"]


def _text_size(params: TextTransformerParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    assert params.vocab_size is not None
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


ENTRIES = (
    ZooEntry(
        name="transformer-classifier",
        summary=(
            "Text classifier: token and positional embeddings, pre-norm blocks with padding-masked "
            "multi-head self-attention, mean or first-token pooling and a Linear head; exact ghost clipping."
        ),
        params=TransformerClassifierParams,
        tasks=frozenset({"classification"}),
        check_shape=_text_shape,
        size=_text_size,
        blocks=_text_blocks,
        complete=_text_params,
        dataset_params=DATASET_PARAMS,
        lora=True,
        body_from=frozenset({"transformer-lm"}),
    ),
    ZooEntry(
        name="transformer-lm",
        summary=(
            "Decoder-only language model: causal, padding-masked pre-norm blocks and a Linear to the "
            "vocabulary (not tied to the embedding, so clipping stays exact); next-token logits."
        ),
        params=TextTransformerParams,
        tasks=frozenset({"language-model"}),
        check_shape=_text_shape,
        size=_text_size,
        blocks=_text_blocks,
        complete=_text_params,
        dataset_params=DATASET_PARAMS,
        lora=True,
    ),
)
