"""LoRA on `hf` models through PEFT: adapters in, a PEFT adapter and merged weights out.

``training.finetune: lora`` on an `hf` model builds a ``peft.LoraConfig`` from ``training.lora`` and
the family's defaults (``privtrain_common.zoo.hf.families.LoraTargets``: the attention projections)
and injects PEFT's LoRA layers into the Transformers model in place (``inject_adapter_in_model``):
no ``PeftModel`` wrapper, so the model's forward, its parameter names and the DP engines see the
Transformers model with PEFT's ``lora.Linear`` around each targeted layer. A classifier's head
trains with the adapters as PEFT's ``modules_to_save`` (PEFT's own rule for sequence classification:
a head that is new, or fits new classes, must learn); a language model's LM head stays frozen. Every
other parameter is frozen, so only the adapters (and that head) get per-example gradients, clipping
and noise.

At release (``release_adapter``) the adapter is read out as PEFT saves it
(``get_peft_model_state_dict``, names under ``base_model.model.``, with ``adapter_config.json``'s
contents), then merged into the weights (each layer's own ``merge()``) and the wrappers removed, so
the released model is the plain Transformers architecture: ``format=hf`` and ``privtrain.load_model``
read it as any full fine-tune, and ``format=peft`` serves the adapter. Both are post-processing of
the released adapters and the public base: no privacy cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from privtrain_common.zoo.architectures import HFImageModel, HFModel
from privtrain_common.zoo.hf.families import FAMILIES

__all__ = ["PeftAdapter", "apply_peft_lora", "is_hf_model", "release_adapter"]

ADAPTER_NAME = "default"
"""PEFT's name for a model's only adapter (its files drop it from the tensor names)."""
CLASSIFIER_HEADS = ("classifier", "score")
"""The classifiers' head modules in Transformers (PEFT's ``modules_to_save`` for sequence classification)."""
_CONFIG_ATTRIBUTE = "privtrain_peft_config"
"""Where the wrapper keeps the ``LoraConfig`` its adapters were built from, until release."""
_TASK_TYPES = {"sequence-classification": "SEQ_CLS", "causal-lm": "CAUSAL_LM", "image-classification": None}
"""PEFT's task type per `hf` task: the ``PeftModel`` class ``from_pretrained`` builds (None: the plain one)."""


@dataclass(frozen=True)
class PeftAdapter:
    """A trained adapter as PEFT saves it: ``adapter_model.safetensors``'s tensors and
    ``adapter_config.json``'s contents."""

    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` is the zoo's wrapper of a Transformers model (LoRA then goes through PEFT)."""
    return isinstance(model, (HFModel, HFImageModel))


def _peft() -> Any:
    try:
        import peft  # optional and heavy: only when an hf model is fine-tuned with LoRA
    except ImportError as exc:
        raise ImportError("LoRA on hf models needs PEFT: pip install 'privtrain[worker]'") from exc
    return peft


def apply_peft_lora(
    model: nn.Module, *, rank: int, alpha: float, target_modules: list[str] | tuple[str, ...] | None = None
) -> int:
    """Inject PEFT's adapters into the `hf` model in place and freeze the rest; returns how many
    parameters train (adapters, and a classifier's head)."""
    if not is_hf_model(model):
        raise ValueError("PEFT LoRA applies to hf models")
    inner = model.get_submodule("model")
    family = FAMILIES[str(getattr(inner, "config").model_type)]  # noqa: B009  # a Transformers model's config
    task = str(getattr(model, "task"))  # noqa: B009  # the zoo wrapper's task
    targets = list(target_modules) if target_modules else list(family.lora.default)
    peft = _peft()
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,  # a random forward would differ per example and call (kernel/schemas/jobs.LoraSpec)
        target_modules=targets,
        fan_in_fan_out=family.lora.conv1d,
        bias="none",
        task_type=_TASK_TYPES[task],
        modules_to_save=None if task == "causal-lm" else list(CLASSIFIER_HEADS),
    )
    for parameter in inner.parameters():
        parameter.requires_grad_(False)
    peft.inject_adapter_in_model(config, inner, adapter_name=ADAPTER_NAME)
    setattr(model, _CONFIG_ATTRIBUTE, config)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _json_config(config: Any) -> dict[str, Any]:
    """``adapter_config.json``'s contents: PEFT's own ``to_dict`` as plain JSON (sets sorted)."""

    def plain(value: object) -> object:
        if isinstance(value, (set, frozenset)):
            return sorted(value)
        raise TypeError(f"{type(value).__name__} is not JSON")

    loaded: dict[str, Any] = json.loads(json.dumps(config.to_dict(), default=plain))
    return loaded


def _merge_in_place(model: nn.Module) -> None:
    """Each LoRA layer merged into its base layer (PEFT's ``merge``) and replaced by it; each
    ``modules_to_save`` wrapper replaced by its trained copy: the plain Transformers architecture."""
    peft = _peft()
    lora_layer = peft.tuners.lora.LoraLayer
    wrapper = peft.utils.other.ModulesToSaveWrapper
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, (lora_layer, wrapper))]
    for name, module in found:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(module, wrapper):
            replacement = module.modules_to_save[ADAPTER_NAME]
        else:
            module.merge(adapter_names=[ADAPTER_NAME])
            replacement = module.get_base_layer()
        setattr(parent, attribute, replacement)


def release_adapter(model: nn.Module) -> PeftAdapter | None:
    """The trained PEFT adapter of an `hf` model, with the model then merged in place (module
    docstring); None, and the model untouched, when it has no PEFT adapters."""
    config = getattr(model, _CONFIG_ATTRIBUTE, None)
    if config is None or not is_hf_model(model):
        return None
    peft = _peft()
    with torch.no_grad():
        inner = model.get_submodule("model")
        state = peft.get_peft_model_state_dict(inner, adapter_name=ADAPTER_NAME)
        tensors = {f"base_model.model.{name}": tensor.detach().to("cpu").clone() for name, tensor in state.items()}
        _merge_in_place(inner)
    delattr(model, _CONFIG_ATTRIBUTE)
    return PeftAdapter(tensors=tensors, config=_json_config(config))
