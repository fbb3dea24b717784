"""The Hugging Face Transformers modules of the `hf` model families, as structure for the ghost engine.

Every class below was admitted after reading its forward in Transformers 5.24 (the version the
`hf` extra installs): each touches its children's parameters only by calling them and owns none
itself; attention mixes the positions of a row, never rows (the mask is (B, 1, T, T), one per
row); the classifiers pool each row's own positions (the first token, or the last one that is not
padding, found per row). Their parameters all belong to Linear, Embedding, LayerNorm, Conv1D and
RMSNorm layers, which have exact rules (`linear_conv`, `embedding`, `norms`, `hf_layers`).

Configurations that would break that reading are refused on each instance (`container_refusal`):
attention other than "eager" (the builder asks for eager: `privtrain_common.zoo.hf.builder`),
an attention dropout above 0, and gradient checkpointing (its backward re-runs the forward, which
the recorder's hooks would not see). nn.Dropout is accepted with p = 0 only (`support`; the
builder sets every dropout probability to 0). The rotary position tables of Llama and Qwen2 are
parameter-free and computed per position, for the default RoPE only.

Rows must stay on dimension 0 for every lookup: the zoo's `HFModel` passes per-row position ids
(and BERT's token types) so that the position embeddings see (B, T) indices, not (1, T) ones
broadcast over the batch, which the embedding rule cannot attribute to rows (the recorder would
refuse them at run time). `HFModel` stays a whole subtree for the vmap engine; the containers are
also registered with `supported_module`, as `ghost_container` asks.

ConvNeXt is refused whole, at the zoo's `HFImageModel`: its layer scale is a bare parameter its
layers use directly, which no exact rule here covers; "auto" then trains it on the vmap engine,
which is exact. ViT's bare parameters (CLS token, position embeddings) have a rule (`hf_vit`).

Imported by `optional.load_optional_families` only once the process has imported Transformers.
"""

from __future__ import annotations

from torch import nn
from transformers import activations
from transformers.models.bert import modeling_bert as bert
from transformers.models.distilbert import modeling_distilbert as distilbert
from transformers.models.gpt2 import modeling_gpt2 as gpt2
from transformers.models.llama import modeling_llama as llama
from transformers.models.qwen2 import modeling_qwen2 as qwen2
from transformers.models.roberta import modeling_roberta as roberta

from dp.per_example.ghost.support import ghost_container, ghost_parameter_free
from dp.per_example.per_sample import supported_module
from privtrain_common.zoo.architectures import HFImageModel, HFModel

__all__ = ["HF_CONTAINERS", "HF_PARAMETER_FREE"]

HF_CONTAINERS: dict[str, tuple[type[nn.Module], ...]] = {
    "bert": (
        bert.BertForSequenceClassification,
        bert.BertModel,
        bert.BertEmbeddings,
        bert.BertEncoder,
        bert.BertLayer,
        bert.BertAttention,
        bert.BertSelfAttention,
        bert.BertSelfOutput,
        bert.BertIntermediate,
        bert.BertOutput,
        bert.BertPooler,
    ),
    "roberta": (
        roberta.RobertaForSequenceClassification,
        roberta.RobertaModel,
        roberta.RobertaEmbeddings,
        roberta.RobertaEncoder,
        roberta.RobertaLayer,
        roberta.RobertaAttention,
        roberta.RobertaSelfAttention,
        roberta.RobertaSelfOutput,
        roberta.RobertaIntermediate,
        roberta.RobertaOutput,
        roberta.RobertaClassificationHead,
    ),
    "distilbert": (
        distilbert.DistilBertForSequenceClassification,
        distilbert.DistilBertModel,
        distilbert.Embeddings,
        distilbert.Transformer,
        distilbert.TransformerBlock,
        distilbert.DistilBertSelfAttention,
        distilbert.FFN,
    ),
    "gpt2": (
        gpt2.GPT2ForSequenceClassification,
        gpt2.GPT2LMHeadModel,
        gpt2.GPT2Model,
        gpt2.GPT2Block,
        gpt2.GPT2Attention,
        gpt2.GPT2MLP,
    ),
    "llama": (
        llama.LlamaForSequenceClassification,
        llama.LlamaForCausalLM,
        llama.LlamaModel,
        llama.LlamaDecoderLayer,
        llama.LlamaAttention,
        llama.LlamaMLP,
    ),
    "qwen2": (
        qwen2.Qwen2ForSequenceClassification,
        qwen2.Qwen2ForCausalLM,
        qwen2.Qwen2Model,
        qwen2.Qwen2DecoderLayer,
        qwen2.Qwen2Attention,
        qwen2.Qwen2MLP,
    ),
}
"""model_type -> its container classes (the `hf` model families, privtrain_common.zoo.hf.families)."""

HF_PARAMETER_FREE: tuple[type[nn.Module], ...] = (
    activations.GELUActivation,
    activations.NewGELUActivation,
    activations.GELUTanh,
    activations.SiLUActivation,
    llama.LlamaRotaryEmbedding,
    qwen2.Qwen2RotaryEmbedding,
)
"""Element-wise activations the families' configs may name, and the rotary position tables."""


def container_refusal(module: nn.Module) -> str | None:
    """A container configured outside what its forward was read for, or None."""
    if getattr(module, "gradient_checkpointing", False):
        return (
            "has gradient checkpointing on: its backward re-runs the forward, which the ghost clipping "
            "engine does not record"
        )
    config = getattr(module, "config", None)
    implementation = getattr(config, "_attn_implementation", "eager") if config is not None else "eager"
    if implementation != "eager":
        return f"uses {implementation!r} attention; the ghost clipping engine takes eager attention only"
    dropout = getattr(module, "attention_dropout", 0.0)
    if isinstance(dropout, (int, float)) and dropout != 0:
        return "has an attention dropout above 0: a random forward differs per call"
    return None


def _rotary_refusal(module: nn.Module) -> str | None:
    rope_type = getattr(module, "rope_type", None)
    if rope_type != "default":
        return f"uses RoPE type {rope_type!r}; the ghost clipping engine takes the default RoPE only"
    return None


def _image_refusal(module: nn.Module) -> str | None:
    """ConvNeXt: its layer scale is a bare parameter its layers use directly, which no exact rule
    covers (ViT's bare parameters have one: `hf_vit`)."""
    if getattr(getattr(getattr(module, "model", None), "config", None), "model_type", None) == "vit":
        return None
    return (
        "is a ConvNeXt image model: its layer scale is a bare parameter its layers use directly, which the "
        "ghost clipping engine has no exact rule for; the vmap engine (engine auto or vmap) trains it exactly"
    )


ghost_container(HFModel)  # its forward calls the Transformers model, with a per-row mask and ids
ghost_container(HFImageModel, refusal=_image_refusal)  # ConvNeXt refused whole, so "auto" picks vmap
for _classes in HF_CONTAINERS.values():
    for _container in _classes:
        ghost_container(supported_module(_container), refusal=container_refusal)
_ROTARY = (llama.LlamaRotaryEmbedding, qwen2.Qwen2RotaryEmbedding)
for _module in HF_PARAMETER_FREE:
    ghost_parameter_free(supported_module(_module), refusal=_rotary_refusal if _module in _ROTARY else None)
