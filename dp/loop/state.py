"""What every training loop shares with its caller: hooks, resumable state and the result.

Kept apart from any one algorithm so that DP-SGD and its relatives (DC-DPSGD, DiceSGD, ...)
present the same surface to the job runner (worker/train.py), which calls them through the
trainer registry (algorithms/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["TrainingHooks", "TrainingResult", "TrainingState"]


@dataclass
class TrainingState:
    """Everything needed to continue a run bit-for-bit: step counter, model, optimizer, RNG.

    Tensors are detached CPU copies, so the state stays valid while training continues.
    SECRET: `generator_state` (a `SecureRandom` state: uint8 JSON of its keys) determines all
    future noise and batch choices, and the model/optimizer tensors are unreleased values. A
    checkpoint must never leave the worker's storage; only the final model is released.
    """

    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, object]
    generator_state: torch.Tensor


@dataclass
class TrainingHooks:
    """Optional callbacks from the loop. They receive public information only."""

    on_step_end: Callable[[int], None] | None = None
    """Called with the number of steps done so far (1-based), after the step (and checkpoint)."""
    should_stop: Callable[[], bool] | None = None
    """Cooperative cancel, checked before each step; True stops before taking it."""
    save_checkpoint: Callable[[TrainingState], None] | None = None
    """Called after every `checkpoint_every`-th step (including the last), if set."""
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.checkpoint_every, bool) or self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")


@dataclass(frozen=True)
class TrainingResult:
    """`steps_run` counts every step taken in this job, including those before a resume."""

    steps_run: int
    stopped_early: bool
