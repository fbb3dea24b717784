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

HFTask = Literal["sequence-classification", "causal-lm", "image-classification"]

DATASET_TASKS: Mapping[str, str] = MappingProxyType(
    {
        "sequence-classification": "classification",
        "causal-lm": "language-model",
        "image-classification": "classification",
    }
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
    channels: int = 0
    """Image families: the channels, side and patch side of the (C, H, W) images they take."""
    image: int = 0
    patch: int = 0
    qkv_bias: bool = True
    """ViT: whether the query, key and value projections have a bias."""
    stages: tuple[tuple[int, int], ...] = ()
    """ConvNeXt: (width, depth) of each stage."""
    layer_scale: bool = True
    """ConvNeXt: whether each layer scales its branch by a learned vector (layer_scale_init_value > 0)."""


@dataclass(frozen=True)
class LoraTargets:
    """Where ``training.finetune: lora`` may put PEFT's adapters in a family: the layer names a job's
    ``training.lora.target_modules`` may give (matched, as PEFT does, on a module name's last part),
    and the default, the attention projections (PEFT's own default where it has one)."""

    default: tuple[str, ...]
    accepted: frozenset[str]
    conv1d: bool = False
    """The layers are GPT-2's Conv1D (weights stored transposed: PEFT's ``fan_in_fan_out``)."""


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
    image: bool = False
    """Takes images (B, C, H, W) rather than token ids: no vocabulary, no padding."""
    list_keys: frozenset[str] = frozenset()
    """Keys whose value is a list of sizes, one per stage (ConvNeXt's ``hidden_sizes``, ``depths``)."""
    lora: LoraTargets

    @property
    def accepted_keys(self) -> frozenset[str]:
        text = () if self.image else ("pad_token_id",)
        return frozenset(
            {"model_type", *text, *self.size_keys.values(), *self.optional_keys, *self.free_keys, *self.list_keys}
        )


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
_LLAMA_FREE = frozenset(
    {"hidden_act", "rms_norm_eps", "initializer_range", "bos_token_id", "eos_token_id", "rope_theta"}
)
"""``rope_theta``: the default RoPE's base frequency (Llama 10,000; Qwen2 checkpoints often 10⁶)."""
_BERT_LORA = LoraTargets(default=("query", "value"), accepted=frozenset({"query", "key", "value"}))
"""BERT-style attention (BERT, RoBERTa): PEFT's default, the query and value projections."""
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
        lora=_BERT_LORA,
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
        lora=_BERT_LORA,
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
        lora=LoraTargets(
            default=("q_lin", "v_lin"), accepted=frozenset({"q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"})
        ),
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
        lora=LoraTargets(default=("c_attn",), accepted=frozenset({"c_attn", "c_proj", "c_fc"}), conv1d=True),
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
            lora=LoraTargets(
                default=("q_proj", "v_proj"),
                accepted=frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
            ),
        )
    )


def _vit(s: Sizes, task: str, n_outputs: int) -> int:
    """Patch Conv2d, CLS token, one position embedding per patch and the CLS; pre-norm layers with
    separate Q, K, V (bias per ``qkv_bias``) and output projections; the final LayerNorm; the
    classifier on the CLS token (no pooler)."""
    h, i = s.hidden, s.intermediate
    patches = (s.image // s.patch) ** 2
    embeddings = s.channels * s.patch * s.patch * h + h + h + (patches + 1) * h
    layer = 3 * _linear(h, h, bias=s.qkv_bias) + _linear(h, h) + 2 * (2 * h) + _linear(h, i) + _linear(i, h)
    return embeddings + s.layers * layer + 2 * h + _linear(h, n_outputs)


def _convnext(s: Sizes, task: str, n_outputs: int) -> int:
    """Patchify Conv2d and its LayerNorm; per stage a downsampling LayerNorm and 2×2 Conv2d (all but
    the first), then layers of a 7×7 depthwise Conv2d, LayerNorm, two Linears (4× wide) and the layer
    scale; the final LayerNorm on the pooled features and the classifier."""
    first = s.stages[0][0]
    total = s.channels * s.patch * s.patch * first + first + 2 * first
    previous = first
    for index, (width, depth) in enumerate(s.stages):
        if index:
            total += 2 * previous + previous * width * 4 + width
        layer = 49 * width + width + 2 * width + _linear(width, 4 * width) + _linear(4 * width, width)
        total += depth * (layer + (width if s.layer_scale else 0))
        previous = width
    return total + 2 * previous + _linear(previous, n_outputs)


_IMAGE = frozenset({"image-classification"})
_IMAGE_KEYS = MappingProxyType({"channels": "num_channels", "image": "image_size", "patch": "patch_size"})

register_family(
    HFFamily(
        model_type="vit",
        tasks=_IMAGE,
        size_keys=MappingProxyType(
            {
                "hidden": "hidden_size",
                "layers": "num_hidden_layers",
                "heads": "num_attention_heads",
                "intermediate": "intermediate_size",
                **_IMAGE_KEYS,
            }
        ),
        optional_keys=MappingProxyType({}),
        free_keys=frozenset({"hidden_act", "layer_norm_eps", "initializer_range", "qkv_bias"}),
        dropout_keys=("hidden_dropout_prob", "attention_probs_dropout_prob"),
        decoder=False,
        parameters=_vit,
        image=True,
        # Transformers 5 names ViT's projections as Llama's (it saves them under the earlier names).
        lora=LoraTargets(
            default=("q_proj", "v_proj"), accepted=frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"})
        ),
    )
)
register_family(
    HFFamily(
        model_type="convnext",
        tasks=_IMAGE,
        size_keys=_IMAGE_KEYS,
        optional_keys=MappingProxyType({"num_stages": None}),
        free_keys=frozenset({"hidden_act", "layer_norm_eps", "initializer_range", "layer_scale_init_value"}),
        dropout_keys=("drop_path_rate",),  # stochastic depth drops a row's whole branch at random
        decoder=False,
        parameters=_convnext,
        image=True,
        # No attention: the default is each layer's two pointwise Linears (its MLP).
        lora=LoraTargets(default=("pwconv1", "pwconv2"), accepted=frozenset({"pwconv1", "pwconv2"})),
        list_keys=frozenset({"hidden_sizes", "depths"}),
    )
)


def sizes_of(family: HFFamily, config: Mapping[str, object]) -> Sizes:
    """The sizes a validated config gives (its optional keys at their Transformers defaults)."""

    def number(key: str, default: int) -> int:
        value = config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def numbers(key: str) -> list[int]:
        value = config.get(key)
        return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []

    keys = family.size_keys
    widths, depths = numbers("hidden_sizes"), numbers("depths")
    hidden = number(keys.get("hidden", ""), widths[-1] if widths else 0)
    heads = number(keys.get("heads", ""), 1)
    intermediate_key = keys.get("intermediate", "n_inner")
    scale = config.get("layer_scale_init_value", 1e-6)
    return Sizes(
        vocab=number(keys.get("vocab", ""), 0),
        hidden=hidden,
        layers=number(keys.get("layers", ""), len(depths)),
        heads=heads,
        kv_heads=number("num_key_value_heads", heads),
        intermediate=number(intermediate_key, 4 * hidden),
        positions=number(keys.get("positions", ""), 0),
        token_types=number("type_vocab_size", 2) if "type_vocab_size" in family.optional_keys else 0,
        channels=number("num_channels", 3),
        image=number("image_size", 224),
        patch=number("patch_size", 16 if family.model_type == "vit" else 4),
        qkv_bias=config.get("qkv_bias", True) is not False,
        stages=tuple(zip(widths, depths, strict=False)),
        layer_scale=not isinstance(scale, (int, float)) or scale > 0,
    )


def input_shape_of(family: HFFamily, config: Mapping[str, object]) -> tuple[int, ...]:
    """The row shape a model of this config takes: (C, H, W) images, or (positions,) token ids."""
    s = sizes_of(family, config)
    return (s.channels, s.image, s.image) if family.image else (s.positions,)
