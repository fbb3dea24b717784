"""Which parameters a fine-tuning job trains: ``full``, ``head``, ``last_k_blocks`` or ``lora``.

* the **head** is the last module (in ``model.modules()`` order) that owns parameters directly:
  the classifier layer of every zoo model;
* the **blocks** are what an architecture declares in its ``finetune_blocks`` attribute: a mapping
  from each block's name to the submodules it spans, first to last (every zoo model declares them,
  at the granularity of its residual or transformer blocks, see ``privtrain_common.zoo.architectures``; a
  plain list of submodule names is one block per name). A model that declares none falls back to
  its top-level children that hold parameters, one block each;
* **lora** adds low-rank adapters to a transformer's attention and MLP Linear layers and trains
  only them (training/lora.py); on an `hf` model, PEFT's adapters on the family's target layers,
  with a classifier's head (training/peft_lora.py).

Frozen parameters get ``requires_grad = False``: the DP engines (per-sample and ghost) and the
non-private trainers train only the parameters that require gradients, so a frozen parameter has
no per-sample gradient, is not clipped, gets no noise and is never updated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from torch import nn

from privtrain_common.zoo.architectures import FINETUNE_BLOCKS
from training.lora import LoRAConfig, apply_lora
from training.peft_lora import apply_peft_lora, is_hf_model

FinetuneMode = Literal["full", "head", "last_k_blocks", "lora"]


def head_module_name(model: nn.Module) -> str:
    """The qualified name of the last module that owns parameters directly (the classifier)."""
    last: str | None = None
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            last = name
    if last is None:
        raise ValueError("the model has no parameters")
    return last


def head_parameter_names(model: nn.Module) -> set[str]:
    """The state-dict names of the head's own parameters (e.g. ``3.weight``, ``3.bias``)."""
    head = head_module_name(model)
    module = model.get_submodule(head)
    prefix = f"{head}." if head else ""
    return {prefix + name for name, _ in module.named_parameters(recurse=False)}


def block_members(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each fine-tuning block's name and the submodules it spans, first block to last."""
    declared = getattr(model, FINETUNE_BLOCKS, None)
    if declared is None:
        return {name: (name,) for name, child in model.named_children() if any(True for _ in child.parameters())}
    if isinstance(declared, Mapping):
        blocks = {str(label): tuple(str(member) for member in members) for label, members in declared.items()}
    else:
        blocks = {str(name): (str(name),) for name in declared}
    for members in blocks.values():
        for member in members:
            model.get_submodule(member)  # AttributeError for a name that is not a submodule
    return blocks


def block_names(model: nn.Module) -> list[str]:
    """The model's fine-tuning blocks, first to last (see the module docstring)."""
    return list(block_members(model))


def apply_finetune(
    model: nn.Module, *, mode: FinetuneMode, k: int | None = None, lora: Mapping[str, object] | None = None
) -> int:
    """Freeze every parameter the mode does not train; returns how many parameters stay trainable.

    ``lora`` ({"rank", "alpha"}, the job's ``training.lora``) is read by mode "lora" only, which
    adds adapters in place and trains only them (training/lora.py)."""
    if mode == "lora":
        if lora is None:
            raise ValueError("finetune lora needs training.lora (rank and alpha)")
        rank, alpha, targets = lora.get("rank"), lora.get("alpha"), lora.get("target_modules")
        if not isinstance(rank, int) or not isinstance(alpha, (int, float)):
            raise ValueError(f"training.lora needs an integer rank and a number alpha, got {dict(lora)!r}")
        if is_hf_model(model):  # a Transformers model: PEFT's adapters (training/peft_lora.py)
            listed = [str(name) for name in targets] if isinstance(targets, list) else None
            return apply_peft_lora(model, rank=rank, alpha=float(alpha), target_modules=listed)
        return apply_lora(model, LoRAConfig(rank=rank, alpha=float(alpha)))
    if mode == "full":
        trainable = {name for name, _ in model.named_parameters()}
    elif mode == "head":
        trainable = head_parameter_names(model)
    else:
        blocks = block_members(model)
        if k is None or not 1 <= k <= len(blocks):
            raise ValueError(f"finetune_k must be between 1 and the model's {len(blocks)} blocks, got {k}")
        chosen = [member for members in list(blocks.values())[-k:] for member in members]
        trainable = {
            name for name, _ in model.named_parameters() if any(name.startswith(f"{member}.") for member in chosen)
        }
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trainable)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
