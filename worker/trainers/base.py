"""The trainer registry: worker-side implementations of catalogue algorithms, by the same names.

Each trainer receives the job's charged parameters (σ, q, steps) straight from the job row, so the
noise it draws is exactly the event the API reserved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from app.registry import Registry
from worker.optimizers.secure_random import SecureRandom
from worker.optimizers.state import TrainingHooks, TrainingResult, TrainingState


@dataclass(frozen=True)
class TrainingRequest:
    model: nn.Module
    X: torch.Tensor
    y: torch.Tensor
    task: str
    spec: dict[str, Any]
    noise_multiplier: float
    sampling_probability: float
    expected_batch_size: float
    steps: int
    max_physical_batch_size: int
    generator: SecureRandom
    """The job's secret stream for every privacy-protecting draw (never a torch.Generator)."""
    hooks: TrainingHooks
    resume_from: TrainingState | None
    device: torch.device


Trainer = Callable[[TrainingRequest], TrainingResult]
TRAINERS: Registry[Trainer] = Registry("trainer")
register_trainer = TRAINERS.register
get_trainer = TRAINERS.get


Preflight = Callable[[nn.Module, dict[str, Any]], None]
PREFLIGHTS: Registry[Preflight] = Registry("preflight")
register_preflight = PREFLIGHTS.register


def preflight(name: str, model: nn.Module, spec: dict[str, Any]) -> None:
    """Checks that need the built model (parameter names, sizes), run before the data is opened.

    A ValueError here fails the job before TOUCH, so its reservation is released, not spent.
    """
    if name in PREFLIGHTS:
        PREFLIGHTS.get(name)(model, spec)
