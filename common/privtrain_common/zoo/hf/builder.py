"""The torch side of the `hf` model: Transformers builds the model from the job's config.

Only ``from_config`` is ever called: random weights, no hub, no download, no remote code (the
config's keys were allow-listed by ``definition.check_config``, and this module checks them
again, whoever calls it). The model is wrapped in :class:`HFModel`, whose ``forward(ids)`` is the
zoo's text models' contract: int64 token ids (B, T) right-padded with ``pad_token_id`` in, logits
out, (B, n_classes) for a classifier and (B, T, vocab_size) for a language model.

Per-example gradients must be exact, so the builder fixes what would break them: every dropout
probability is 0 (a random forward differs per example and call), attention is Transformers'
"eager" implementation, fed a ready 4-D additive mask built from the padding (Transformers'
own mask helpers test the mask's contents in Python, which ``torch.func.vmap`` cannot trace),
and the LM head is not tied to the token embedding.

Image models (ViT, ConvNeXt; task ``image-classification``) are wrapped in :class:`HFImageModel`
instead: float pixel values (B, C, H, W) in, (B, n_classes) logits out, the same ``model.`` prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from privtrain_common.zoo.building import FINETUNE_BLOCKS, check_positive_int, register_model, with_defaults
from privtrain_common.zoo.hf.definition import HFParams
from privtrain_common.zoo.hf.families import FAMILIES, input_shape_of, sizes_of
from privtrain_common.zoo.hf.transformers_config import AUTO_CLASSES, transformers_settings

__all__ = ["HFImageModel", "HFModel", "hf_config", "transformers_model"]

_BLOCK_PATHS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    # model_type → (embedding members, the layer list, head members before the task's own head)
    "bert": (("bert.embeddings",), "bert.encoder.layer", ("bert.pooler",)),
    "roberta": (("roberta.embeddings",), "roberta.encoder.layer", ()),
    "distilbert": (("distilbert.embeddings",), "distilbert.transformer.layer", ("pre_classifier",)),
    "gpt2": (("transformer.wte", "transformer.wpe"), "transformer.h", ("transformer.ln_f",)),
    "llama": (("model.embed_tokens",), "model.layers", ("model.norm",)),
    "qwen2": (("model.embed_tokens",), "model.layers", ("model.norm",)),
    "vit": (("vit.embeddings",), "vit.layers", ("vit.layernorm",)),
    "convnext": (("convnext.embeddings",), "convnext.encoder.stages", ("convnext.layernorm",)),
}
_TASK_HEADS = {"sequence-classification": ("classifier", "score"), "causal-lm": ("lm_head",)}
_ROW_POSITIONS = frozenset({"bert", "distilbert", "gpt2"})
"""Model types whose position ids default to one (1, T) row broadcast over the batch: given (B, T)
here. RoBERTa makes (B, T) ids from the padding itself; Llama and Qwen2 use theirs for RoPE only."""
_ROW_TOKEN_TYPES = frozenset({"bert"})
"""Model types whose token type ids default to a (1, T) buffer row: given as (B, T) zeros here."""


class HFModel(nn.Module):
    """Token ids (B, T) → a Transformers model's logits, padding masked out of attention.

    A container: every parameter belongs to the Transformers model it holds (``self.model``, so
    the released state dict names are ``model.`` + Transformers' names). The mask is additive
    (0 where a position may look, the dtype's minimum elsewhere), exactly what Transformers'
    eager attention builds from a 2-D mask: the padding keys are hidden from every query, and a
    decoder's queries see no later position. Rows never mix.
    """

    def __init__(self, model: nn.Module, *, pad_id: int, decoder: bool, task: str) -> None:
        super().__init__()
        self.model = model
        self.pad_id = pad_id
        self.decoder = decoder
        self.task = task

    def attention_mask(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, T, T) additive mask: keys that are padding, and a decoder's later keys, are hidden."""
        allowed = (ids != self.pad_id)[:, None, None, :]
        if self.decoder:
            positions = torch.arange(ids.shape[1], device=ids.device)
            allowed = allowed & (positions[None, :] <= positions[:, None])[None, None]
        zero = torch.zeros((), dtype=dtype, device=ids.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)

    def _row_ids(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Position (and token type) ids of shape (B, T), where the model's defaults are one (1, T)
        row broadcast over the batch: the same ids, so the same output, but every embedding
        lookup then has the rows on dimension 0 (the ghost engine's rule needs that)."""
        model_type = getattr(getattr(self.model, "config", None), "model_type", None)
        given: dict[str, torch.Tensor] = {}
        if model_type in _ROW_POSITIONS:
            given["position_ids"] = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        if model_type in _ROW_TOKEN_TYPES:
            given["token_type_ids"] = torch.zeros_like(ids)
        return given

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        dtype = next(self.model.parameters()).dtype  # the float width attention scores are in
        extra: dict[str, Any] = {"use_cache": False} if self.decoder else {}
        mask = self.attention_mask(ids, dtype)
        logits: torch.Tensor = self.model(input_ids=ids, attention_mask=mask, **self._row_ids(ids), **extra).logits
        return logits


class HFImageModel(nn.Module):
    """Pixel values (B, C, H, W) → a Transformers image classifier's logits (B, n_classes).

    A container like :class:`HFModel` (parameters under ``self.model``, released as ``model.`` +
    Transformers' names). No mask: every patch of every image is real, and the models' layers
    act on each image alone (LayerNorm, never BatchNorm; no dropout, no stochastic depth).
    """

    def __init__(self, model: nn.Module, *, task: str) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(pixel_values=pixel_values).logits
        return logits


def _transformers() -> Any:
    """The Transformers package, or an ImportError that says which extra installs it."""
    try:
        import transformers  # optional and heavy: only when an hf model is built
    except ImportError as exc:
        raise ImportError(
            "hf models are built with Hugging Face Transformers: pip install 'privtrain-client[hf]'"
        ) from exc
    return transformers


def hf_config(config: Mapping[str, object], *, task: str, n_outputs: int) -> Any:
    """The Transformers config of the job's config (``transformers_settings``), eager attention."""
    settings = transformers_settings(config, task=task, n_outputs=n_outputs)
    built = _transformers().AutoConfig.for_model(str(settings.pop("model_type")), **settings)
    built._attn_implementation = "eager"
    return built


def transformers_model(config: Mapping[str, object], *, task: str, n_outputs: int) -> nn.Module:
    """The bare Transformers model (random init from the config) a job's params describe."""
    library = _transformers()
    auto = getattr(library, AUTO_CLASSES[task])
    built = hf_config(config, task=task, n_outputs=n_outputs)
    model: nn.Module = auto.from_config(built, attn_implementation="eager")
    return model


def _blocks(model: nn.Module, model_type: str, layers: int) -> dict[str, tuple[str, ...]]:
    embedding, layer_list, before_head = _BLOCK_PATHS[model_type]
    names = {name for name, _ in model.named_children()}
    unit = "stage" if model_type == "convnext" else "layer"
    heads = tuple(
        name for name in _TASK_HEADS["causal-lm" if "lm_head" in names else "sequence-classification"] if name in names
    )
    return {
        "embedding": tuple(f"model.{member}" for member in embedding),
        **{f"{unit}{number}": (f"model.{layer_list}.{number - 1}",) for number in range(1, layers + 1)},
        "head": tuple(f"model.{member}" for member in (*before_head, *heads)),
    }


@register_model("hf")
def _hf(params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    """A Transformers model from its config: a sequence classifier (B, n_outputs) or a causal LM
    (B, T, vocab_size), on rows of token ids of shape (max_length,); an image classifier
    (B, n_outputs) on images of shape (C, H, W)."""
    p = with_defaults("hf", params)
    declared = HFParams(task=p["task"], config=p["config"])  # type: ignore[arg-type]  # the declaration's rules
    if declared.task == "image-classification":
        return _image_model(declared, input_shape=input_shape, n_outputs=n_outputs)
    if len(input_shape) != 1:
        raise ValueError(f"hf needs rows of token ids of shape (max_length,), got {input_shape}")
    config = declared.config
    family = FAMILIES[config["model_type"]]
    pad_id = config.get("pad_token_id")
    if "vocab_size" not in config or not isinstance(pad_id, int):
        raise ValueError("hf needs config.vocab_size and config.pad_token_id (the dataset's tokenizer's)")
    outputs = check_positive_int("hf n_outputs", n_outputs)
    if declared.task == "causal-lm" and outputs > config["vocab_size"]:
        raise ValueError(f"hf causal-lm needs config.vocab_size >= the dataset's {outputs} token ids")
    model = HFModel(
        transformers_model(config, task=declared.task, n_outputs=outputs),
        pad_id=pad_id,
        decoder=family.decoder,
        task=declared.task,
    )
    setattr(model, FINETUNE_BLOCKS, _blocks(model.model, family.model_type, sizes_of(family, config).layers))
    return model


def _image_model(declared: HFParams, *, input_shape: tuple[int, ...], n_outputs: int) -> nn.Module:
    config = declared.config
    family = FAMILIES[config["model_type"]]
    wanted = input_shape_of(family, config)
    if tuple(input_shape) != wanted:
        raise ValueError(f"hf {family.model_type} takes images of shape {wanted} (C, H, W), got {input_shape}")
    outputs = check_positive_int("hf n_outputs", n_outputs)
    model = HFImageModel(transformers_model(config, task=declared.task, n_outputs=outputs), task=declared.task)
    setattr(model, FINETUNE_BLOCKS, _blocks(model.model, family.model_type, sizes_of(family, config).layers))
    return model
