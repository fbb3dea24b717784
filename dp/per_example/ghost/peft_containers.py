"""PEFT's LoRA modules, as structure for the ghost engine (LoRA on `hf` models: training/peft_lora.py).

Admitted after reading their forwards in PEFT 0.21 (the version the worker extra installs):

* ``lora.Linear`` (around an ``nn.Linear`` or GPT-2's ``Conv1D``) computes
  ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling`` for vanilla LoRA: it touches its
  children only by calling them, and owns no parameters itself. Refused where that reading does
  not hold: a LoRA variant (DoRA and the like: ``lora_variant``), merged or disabled adapters,
  several active adapters, or a dropout that is not the identity.
* ``ModulesToSaveWrapper`` (a classifier's trainable head) calls its active copy, or the original
  when adapters are off; refused when disabled or with several active adapters.
* ``nn.ModuleDict`` and ``nn.ParameterDict`` are never called: they hold the adapters by name (an
  empty ``ParameterDict`` is where PEFT would keep embedding adapters, which are not used here).

Every parameter that trains then belongs to an ``nn.Linear`` (the adapters, the head), which has
an exact rule. Imported by ``optional.load_optional_families`` once the process has imported PEFT.
"""

from __future__ import annotations

from peft.tuners.lora.layer import Linear as LoraLinear
from peft.utils.other import ModulesToSaveWrapper
from torch import nn

from dp.per_example.ghost.support import ghost_container
from dp.per_example.per_sample import supported_module

__all__ = ["PEFT_CONTAINERS"]

PEFT_CONTAINERS: tuple[type[nn.Module], ...] = (LoraLinear, ModulesToSaveWrapper, nn.ModuleDict, nn.ParameterDict)


def _one_active_adapter(module: nn.Module) -> str | None:
    if getattr(module, "disable_adapters", False):
        return "has its adapters disabled"
    if len(getattr(module, "active_adapters", ())) != 1:
        return "has several active adapters; the ghost clipping engine was checked with one"
    return None


def _lora_refusal(module: nn.Module) -> str | None:
    """A LoRA layer configured outside vanilla, unmerged, dropout-free LoRA, or None."""
    if getattr(module, "lora_variant", None):
        return "is a LoRA variant (such as DoRA); the ghost clipping engine takes vanilla LoRA only"
    if getattr(module, "merged", False):
        return "has its adapters merged into the base layer; train them unmerged"
    dropouts = getattr(module, "lora_dropout", {})
    if any(type(dropout) is not nn.Identity for dropout in dropouts.values()):
        return "has a LoRA dropout above 0: a random forward differs per call"
    return _one_active_adapter(module)


ghost_container(supported_module(LoraLinear), refusal=_lora_refusal)
ghost_container(supported_module(ModulesToSaveWrapper), refusal=_one_active_adapter)
ghost_container(supported_module(nn.ModuleDict))
ghost_container(supported_module(nn.ParameterDict))
