"""Parameter averaging of the released weights (``training.ema_decay``), for every per-step trainer.

The runner keeps w̄ ← d·w̄ + (1 − d)·w of the trainable parameters after each optimizer step
(plain EMA, no warm-up: w̄ starts at the starting weights, which keep weight d^T after T steps)
and releases w̄ instead of the last iterate. w̄ is a function of the iterates only, which are
themselves released by the DP analysis, so averaging is post-processing: it costs no privacy
(docs/pretraining-and-finetuning.md, "Training options").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import torch
from torch import nn

from dp.per_example.per_sample import trainable_parameters

__all__ = ["CHECKPOINT_PREFIX", "ParameterAverage"]

CHECKPOINT_PREFIX: Final[str] = "ema/"
"""Reserved prefix of the average's tensors in a training checkpoint (training/artifacts.py)."""
_UPDATES_KEY: Final[str] = "updates"


class ParameterAverage:
    """The exponential moving average of a model's trainable parameters over optimizer steps.

    ``advance_to(step, model)`` is idempotent per step: the runner calls it both before writing a
    checkpoint and after each step, so the checkpoint of step t holds the average of steps 1..t.
    """

    def __init__(self, model: nn.Module, *, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay!r}")
        self.decay = decay
        self.updates = 0
        self.average: dict[str, torch.Tensor] = {
            name: p.detach().clone() for name, p in trainable_parameters(model).items()
        }

    @torch.no_grad()
    def advance_to(self, step: int, model: nn.Module) -> None:
        """Fold the model's current parameters in as step ``step``; a step already folded is a no-op."""
        if step <= self.updates:
            return
        if step != self.updates + 1:
            raise ValueError(f"parameter average at step {self.updates} cannot skip to step {step}")
        params = trainable_parameters(model)
        if not params:  # nothing to average (and _foreach ops refuse empty lists)
            self.updates = step
            return
        for name, p in params.items():
            average = self.average[name]
            if average.device != p.device or average.dtype != p.dtype:
                self.average[name] = average.to(device=p.device, dtype=p.dtype)
        averages = [self.average[name] for name in params]
        # Two fused kernels for the whole model on a GPU, not two per tensor (wrn 16-4: 60 tensors);
        # the same arithmetic as average.mul_(d).add_(p, alpha=1 − d) tensor by tensor.
        torch._foreach_mul_(averages, self.decay)
        torch._foreach_add_(averages, [p.detach() for p in params.values()], alpha=1.0 - self.decay)
        self.updates = step

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Replace the model's trainable parameters by their average (what is saved and evaluated)."""
        for name, p in trainable_parameters(model).items():
            p.copy_(self.average[name].to(device=p.device, dtype=p.dtype))

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The average and its step count as checkpoint tensors under :data:`CHECKPOINT_PREFIX`."""
        tensors = {f"{CHECKPOINT_PREFIX}param/{name}": value for name, value in self.average.items()}
        tensors[f"{CHECKPOINT_PREFIX}{_UPDATES_KEY}"] = torch.tensor(self.updates, dtype=torch.int64)
        return tensors

    def restore(self, tensors: Mapping[str, torch.Tensor], *, step: int) -> None:
        """Continue from a checkpoint's tensors; they must hold the average of exactly ``step`` steps."""
        key = f"{CHECKPOINT_PREFIX}{_UPDATES_KEY}"
        if key not in tensors or int(tensors[key].item()) != step:
            raise ValueError(f"the checkpoint of step {step} holds no parameter average of that step")
        prefix = f"{CHECKPOINT_PREFIX}param/"
        saved = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        if saved.keys() != self.average.keys():
            raise ValueError("the checkpoint's parameter average does not match the model's trainable parameters")
        self.average = {name: value.clone() for name, value in saved.items()}
        self.updates = step
