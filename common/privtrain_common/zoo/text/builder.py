"""The torch modules of transformer-classifier and transformer-lm.

Both take int64 token ids (B, T), right-padded with `pad_id`, T = input_shape[0] (the dataset's
max_length). `vocab_size` and `pad_id` are the dataset's tokenizer's: the service fills them in
from the dataset when a job leaves them out.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from privtrain_common.zoo.building import FINETUNE_BLOCKS, check_positive_int, choice, register_model, with_defaults
from privtrain_common.zoo.layers import TextTransformer


def _text_transformer(
    model: str,
    params: Mapping[str, object],
    *,
    input_shape: tuple[int, ...],
    n_outputs: int,
    pooling: str | None,
) -> nn.Module:
    p = with_defaults(model, params)
    if len(input_shape) != 1:
        raise ValueError(f"{model} needs rows of token ids of shape (max_length,), got {input_shape}")
    if p["vocab_size"] is None or p["pad_id"] is None:
        raise ValueError(f"{model} needs vocab_size and pad_id (the dataset's tokenizer's)")
    vocab_size = check_positive_int(f"{model} vocab_size", p["vocab_size"])
    pad_id = p["pad_id"]
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
        raise ValueError(f"{model} pad_id must be a token id in [0, vocab_size), got {pad_id!r}")
    dim = check_positive_int(f"{model} dim", p["dim"])
    heads = check_positive_int(f"{model} heads", p["heads"])
    if dim % heads:
        raise ValueError(f"{model} dim must be divisible by heads, got dim={dim}, heads={heads}")
    layers = check_positive_int(f"{model} layers", p["layers"])
    chosen = pooling if pooling is not None else choice(f"{model} pooling", p["pooling"], {"mean": 0, "first": 0})
    if pooling == "none" and n_outputs != vocab_size:
        raise ValueError(f"{model} has one output per token id: n_outputs must be vocab_size {vocab_size}")
    model_module = TextTransformer(
        vocab_size=vocab_size,
        pad_id=pad_id,
        positions=input_shape[0],
        dim=dim,
        heads=heads,
        mlp_dim=check_positive_int(f"{model} mlp_dim", p["mlp_dim"]),
        layers=layers,
        n_outputs=n_outputs,
        pooling=chosen,
        causal=pooling == "none",
    )
    blocks = {
        "embedding": ["embedding", "positions"],
        **{f"block{number}": [f"blocks.{number - 1}"] for number in range(1, layers + 1)},
        "head": ["norm", "head"],
    }
    setattr(model_module, FINETUNE_BLOCKS, {name: tuple(members) for name, members in blocks.items()})
    return model_module


@register_model("transformer-classifier")
def _transformer_classifier(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Text classifier: token embedding and learned positions, `layers` pre-norm blocks with
    padding-masked multi-head self-attention and a GELU MLP, a final LayerNorm, then `pooling`
    ("mean" over the non-padding tokens, or the "first" token) and a Linear head: (B, n_outputs)."""
    return _text_transformer(
        "transformer-classifier", params, input_shape=input_shape, n_outputs=n_outputs, pooling=None
    )


@register_model("transformer-lm")
def _transformer_lm(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """Decoder-only language model: the same blocks with a causal and padding mask (position t sees
    the real tokens at positions <= t), a final LayerNorm and a Linear to the vocabulary, giving
    next-token logits (B, T, vocab_size).

    The output Linear is NOT tied to the token embedding: a weight shared between an Embedding and
    a Linear has per-sample gradients that are the sum of two layers' terms, which the ghost
    clipping engine cannot compute exactly (it refuses tied parameters), so the two are separate
    parameters (vocab_size × dim more of them)."""
    return _text_transformer("transformer-lm", params, input_shape=input_shape, n_outputs=n_outputs, pooling="none")
