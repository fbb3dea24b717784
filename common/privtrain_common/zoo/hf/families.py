"""The Transformers model types the `hf` model accepts, described without torch or Transformers.

A job's Transformers config is data: each family declares which config keys it accepts (anything
else is refused, so no key can switch on code we have not checked, such as ``auto_map``), which
of them give the model's size, the parameter count those sizes give, the tasks the family serves
and its fine-tuning blocks. The counts are exact: tests build every family with Transformers and
compare ``sum(p.numel())``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

HFTask = Literal["sequence-classification", "causal-lm"]

DATASET_TASKS: Mapping[str, str] = MappingProxyType(
    {"sequence-classification": "classification", "causal-lm": "language-model"}
)
"""An `hf` task → the dataset task it trains on."""


@dataclass(frozen=True)
class Sizes:
    """The numbers a family's parameter count and activations depend on."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    positions: int
    token_types: int


@dataclass(frozen=True, kw_only=True)
class HFFamily:
    """One allow-listed ``model_type``: its config keys, sizes and parameter count."""

    model_type: str
    tasks: frozenset[str]
    """The `hf` tasks it serves (encoders classify, decoders also model language)."""
    size_keys: Mapping[str, str]
    """Size → the config key that gives it (hidden, layers, heads, intermediate, positions, vocab)."""
    optional_keys: Mapping[str, int | None]
    """Further size keys a config may give, with the default Transformers uses when absent
    (None: derived from the other sizes, e.g. GPT-2's MLP width is 4 × hidden)."""
    free_keys: frozenset[str]
    """Keys that change no shape (activation, epsilons, init scale, token ids)."""
    dropout_keys: tuple[str, ...]
    """Set to 0 by the builder: per-example gradients need a deterministic forward."""
    decoder: bool
    """Causal attention (a decoder) or bidirectional (an encoder)."""
    parameters: Callable[[Sizes, str, int], int]
    """(sizes, task, n_outputs) → trainable parameters of the model Transformers builds."""

    @property
    def accepted_keys(self) -> frozenset[str]:
        return frozenset({"model_type", "pad_token_id", *self.size_keys.values(), *self.optional_keys, *self.free_keys})


FAMILIES: dict[str, HFFamily] = {}


def register_family(family: HFFamily) -> HFFamily:
    """Add a model type to the allow-list; a model type is declared once."""
    if family.model_type in FAMILIES:
        raise ValueError(f"hf model type {family.model_type!r} is declared twice")
    FAMILIES[family.model_type] = family
    return family


def supported_types() -> list[str]:
    return sorted(FAMILIES)


def _linear(inputs: int, outputs: int, *, bias: bool = True) -> int:
    return inputs * outputs + (outputs if bias else 0)


def _encoder_layer(s: Sizes) -> int:
    """BERT-style post-norm layer: Q, K, V and output projections, two LayerNorms, the MLP."""
    h, i = s.hidden, s.intermediate
    return 4 * _linear(h, h) + 2 * (2 * h) + _linear(h, i) + _linear(i, h)


def _bert(s: Sizes, task: str, n_outputs: int) -> int:
    embeddings = (s.vocab + s.positions + s.token_types) * s.hidden + 2 * s.hidden
    pooler = _linear(s.hidden, s.hidden)
    return embeddings + s.layers * _encoder_layer(s) + pooler + _linear(s.hidden, n_outputs)


def _roberta(s: Sizes, task: str, n_outputs: int) -> int:
    embeddings = (s.vocab + s.positions + s.token_types) * s.hidden + 2 * s.hidden
    head = _linear(s.hidden, s.hidden) + _linear(s.hidden, n_outputs)  # dense then out_proj, no pooler
    return embeddings + s.layers * _encoder_layer(s) + head


def _distilbert(s: Sizes, task: str, n_outputs: int) -> int:
    embeddings = (s.vocab + s.positions) * s.hidden + 2 * s.hidden
    head = _linear(s.hidden, s.hidden) + _linear(s.hidden, n_outputs)  # pre_classifier, classifier
    return embeddings + s.layers * _encoder_layer(s) + head


def _decoder_head(s: Sizes, task: str, n_outputs: int) -> int:
    """A decoder's head: the score Linear (no bias) or the LM head (no bias, not tied)."""
    return s.hidden * (s.vocab if task == "causal-lm" else n_outputs)


def _gpt2(s: Sizes, task: str, n_outputs: int) -> int:
    h, i = s.hidden, s.intermediate
    block = 2 * (2 * h) + _linear(h, 3 * h) + _linear(h, h) + _linear(h, i) + _linear(i, h)
    return (s.vocab + s.positions) * h + s.layers * block + 2 * h + _decoder_head(s, task, n_outputs)


def _llama_style(*, qkv_bias: bool) -> Callable[[Sizes, str, int], int]:
    def count(s: Sizes, task: str, n_outputs: int) -> int:
        h, i = s.hidden, s.intermediate
        head_dim = h // s.heads
        attention = (
            _linear(h, s.heads * head_dim, bias=qkv_bias)
            + 2 * _linear(h, s.kv_heads * head_dim, bias=qkv_bias)
            + _linear(s.heads * head_dim, h, bias=False)
        )
        layer = attention + 3 * h * i + 2 * h  # gate, up, down; two RMSNorm weights
        return s.vocab * h + s.layers * layer + h + _decoder_head(s, task, n_outputs)

    return count


_BERT_KEYS = MappingProxyType(
    {
        "hidden": "hidden_size",
        "layers": "num_hidden_layers",
        "heads": "num_attention_heads",
        "intermediate": "intermediate_size",
        "positions": "max_position_embeddings",
        "vocab": "vocab_size",
    }
)
_LLAMA_KEYS = _BERT_KEYS
_ENCODER_FREE = frozenset({"hidden_act", "layer_norm_eps", "initializer_range"})
_LLAMA_FREE = frozenset({"hidden_act", "rms_norm_eps", "initializer_range", "bos_token_id", "eos_token_id"})
_CLASSIFY = frozenset({"sequence-classification"})
_BOTH = frozenset({"sequence-classification", "causal-lm"})

register_family(
    HFFamily(
        model_type="bert",
        tasks=_CLASSIFY,
        size_keys=_BERT_KEYS,
        optional_keys=MappingProxyType({"type_vocab_size": 2}),
        free_keys=_ENCODER_FREE,
        dropout_keys=("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
        decoder=False,
        parameters=_bert,
    )
)
register_family(
    HFFamily(
        model_type="roberta",
        tasks=_CLASSIFY,
        size_keys=_BERT_KEYS,
        optional_keys=MappingProxyType({"type_vocab_size": 2}),
        free_keys=_ENCODER_FREE,
        dropout_keys=("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
        decoder=False,
        parameters=_roberta,
    )
)
register_family(
    HFFamily(
        model_type="distilbert",
        tasks=_CLASSIFY,
        size_keys=MappingProxyType(
            {
                "hidden": "dim",
                "layers": "n_layers",
                "heads": "n_heads",
                "intermediate": "hidden_dim",
                "positions": "max_position_embeddings",
                "vocab": "vocab_size",
            }
        ),
        optional_keys=MappingProxyType({}),
        free_keys=frozenset({"activation", "initializer_range"}),
        dropout_keys=("dropout", "attention_dropout", "seq_classif_dropout", "qa_dropout"),
        decoder=False,
        parameters=_distilbert,
    )
)
register_family(
    HFFamily(
        model_type="gpt2",
        tasks=_BOTH,
        size_keys=MappingProxyType(
            {
                "hidden": "n_embd",
                "layers": "n_layer",
                "heads": "n_head",
                "positions": "n_positions",
                "vocab": "vocab_size",
            }
        ),
        optional_keys=MappingProxyType({"n_inner": None}),
        free_keys=frozenset(
            {"activation_function", "layer_norm_epsilon", "initializer_range", "bos_token_id", "eos_token_id"}
        ),
        dropout_keys=("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"),
        decoder=True,
        parameters=_gpt2,
    )
)
for _model_type, _qkv_bias in (("llama", False), ("qwen2", True)):
    register_family(
        HFFamily(
            model_type=_model_type,
            tasks=_BOTH,
            size_keys=_LLAMA_KEYS,
            optional_keys=MappingProxyType({"num_key_value_heads": None}),
            free_keys=_LLAMA_FREE,
            dropout_keys=("attention_dropout",),
            decoder=True,
            parameters=_llama_style(qkv_bias=_qkv_bias),
        )
    )


def sizes_of(family: HFFamily, config: Mapping[str, object]) -> Sizes:
    """The sizes a validated config gives (its optional keys at their Transformers defaults)."""

    def number(key: str, default: int) -> int:
        value = config.get(key)
        return value if isinstance(value, int) else default

    keys = family.size_keys
    hidden = number(keys["hidden"], 0)
    heads = number(keys["heads"], 1)
    intermediate_key = keys.get("intermediate", "n_inner")
    return Sizes(
        vocab=number(keys["vocab"], 0),
        hidden=hidden,
        layers=number(keys["layers"], 0),
        heads=heads,
        kv_heads=number("num_key_value_heads", heads),
        intermediate=number(intermediate_key, 4 * hidden),
        positions=number(keys["positions"], 0),
        token_types=number("type_vocab_size", 2) if "type_vocab_size" in family.optional_keys else 0,
    )
