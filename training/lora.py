"""LoRA fine-tuning (``training.finetune: lora``): low-rank adapters on a transformer's Linear layers.

Each targeted Linear — attention's q, k, v and out, and the two Linears of every block's MLP — is
replaced by `LoRALinear`: the frozen base layer plus a trainable update (alpha/r)·B·A, with A
(`lora_a`, d → r) and B (`lora_b`, r → o, zero at the start, so training starts from the base
model exactly). Every other parameter is frozen, so only the adapters get per-sample gradients,
are clipped and receive noise. The adapters are plain bias-free Linear layers applied per position
and `LoRALinear` only calls its children, so both per-sample engines handle it exactly with their
existing Linear rules.

The released model is merged (`merge_lora`): W + (alpha/r)·B·A in the plain architecture, so
`privtrain.load_model` reads it with no LoRA code; merging is post-processing of the released
adapters and the public base, so it costs no privacy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from dp.per_example.ghost import ghost_container
from dp.per_example.per_sample import supported_module
from privtrain_common.zoo.architectures import SelfAttention, TransformerBlock

__all__ = ["ATTENTION_TARGETS", "LoRAConfig", "LoRALinear", "apply_lora", "lora_targets", "merge_lora"]

ATTENTION_TARGETS = ("q", "k", "v", "out")
"""The Linear layers of `SelfAttention` that get adapters (with every Linear of a block's MLP)."""


@dataclass(frozen=True)
class LoRAConfig:
    """The adapters' rank r and scale alpha: the update is (alpha / r)·B·A."""

    rank: int
    alpha: float

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"lora rank must be a positive integer, got {self.rank!r}")
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha < float("inf")):
            raise ValueError(f"lora alpha must be positive and finite, got {self.alpha!r}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@ghost_container
@supported_module
class LoRALinear(nn.Module):
    """base(x) + (alpha/r)·lora_b(lora_a(x)): a frozen Linear with a trainable low-rank update.

    A container: it owns no parameters itself and only calls its three Linear children."""

    def __init__(self, base: nn.Linear, config: LoRAConfig) -> None:
        super().__init__()
        self.base = base
        self.scale = config.scale
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_a = nn.Linear(base.in_features, config.rank, bias=False, **factory)
        self.lora_b = nn.Linear(config.rank, base.out_features, bias=False, **factory)
        nn.init.zeros_(self.lora_b.weight)  # the update starts at zero: step 0 is the base model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + self.lora_b(self.lora_a(x)) * self.scale
        return out

    def merged(self) -> nn.Linear:
        """The plain Linear with weight W + (alpha/r)·B·A (and the base's bias)."""
        base = self.base
        merged = nn.Linear(
            base.in_features,
            base.out_features,
            bias=base.bias is not None,
            device=base.weight.device,
            dtype=base.weight.dtype,
        )
        with torch.no_grad():
            update = self.lora_b.weight @ self.lora_a.weight
            merged.weight.copy_(base.weight + self.scale * update)
            if base.bias is not None:
                assert merged.bias is not None
                merged.bias.copy_(base.bias)
        return merged


def lora_targets(model: nn.Module) -> Iterator[tuple[nn.Module, str]]:
    """(parent, attribute) of every Linear that gets an adapter: attention's q/k/v/out and each
    Linear of a transformer block's MLP."""
    for module in list(model.modules()):
        if type(module) is SelfAttention:
            for name in ATTENTION_TARGETS:
                if type(getattr(module, name)) is nn.Linear:
                    yield module, name
        elif type(module) is TransformerBlock:
            for name, child in module.mlp.named_children():
                if type(child) is nn.Linear:
                    yield module.mlp, name


def apply_lora(model: nn.Module, config: LoRAConfig) -> int:
    """Put adapters on every target Linear and freeze everything else; returns how many parameters train.

    Raises ValueError for a model without attention or MLP Linear layers (only transformers have them)."""
    targets = list(lora_targets(model))
    if not targets:
        raise ValueError("finetune lora needs a transformer (attention and MLP Linear layers); this model has none")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parent, name in targets:
        base = getattr(parent, name)
        assert isinstance(base, nn.Linear)
        setattr(parent, name, LoRALinear(base, config))  # new adapters: trainable, the base stays frozen
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge_lora(model: nn.Module) -> bool:
    """Replace every `LoRALinear` in place by its merged plain Linear; True if there was any."""
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    for name, module in found:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, module.merged())
    return bool(found)
