"""The step loop every minibatch trainer shares (DP-SGD and its relatives, and sgd/adam): a cancel
honoured before each step, a checkpoint every ``checkpoint_every`` steps, the progress hook after
each, and the resumable state (model, optimizer, SecureRandom) those checkpoints hold.

Only the step itself differs between trainers; a resumed run continues bit-for-bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.profiler import record_function

from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.randomness.secure_random import SecureRandom

__all__ = ["LiveState", "run_steps"]


def _cpu_copy(value: object) -> object:
    """Deep copy with tensors detached to the CPU: a snapshot never aliases live training state."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cpu_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


@dataclass(frozen=True)
class LiveState:
    """What a minibatch trainer's checkpoint holds, live: the model, its optimizer and the job's
    SecureRandom (SECRET: the snapshots go to the worker's private checkpoint only)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    generator: SecureRandom

    def snapshot(self, step: int) -> TrainingState:
        """The state after ``step`` steps, as detached CPU copies."""
        optimizer_state = _cpu_copy(self.optimizer.state_dict())
        assert isinstance(optimizer_state, dict)
        return TrainingState(
            step=step,
            model_state={k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            optimizer_state=optimizer_state,
            generator_state=self.generator.get_state().clone(),
        )

    def restore(self, state: TrainingState) -> int:
        """Load a `snapshot`; the step to continue from."""
        self.model.load_state_dict(state.model_state, strict=True)
        self.optimizer.load_state_dict(copy.deepcopy(state.optimizer_state))
        self.generator.set_state(state.generator_state)
        return state.step


def run_steps(
    live: LiveState, *, step: int, steps: int, hooks: TrainingHooks, take_step: Callable[[int], None]
) -> TrainingResult:
    """Steps ``step`` … ``steps − 1``: ``take_step(i)`` each, unless ``hooks.should_stop`` says stop
    first; after step i, ``live``'s snapshot is saved when due and ``hooks.on_step_end(i + 1)`` called."""
    while step < steps:
        if hooks.should_stop is not None and hooks.should_stop():
            return TrainingResult(steps_run=step, stopped_early=True)
        take_step(step)
        step += 1
        with record_function("privtrain.hooks"):
            if hooks.save_checkpoint is not None and hooks.checkpoint_every > 0 and step % hooks.checkpoint_every == 0:
                hooks.save_checkpoint(live.snapshot(step))
            if hooks.on_step_end is not None:
                hooks.on_step_end(step)
    return TrainingResult(steps_run=step, stopped_early=False)
