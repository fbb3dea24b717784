"""Worker-side implementations of catalogue algorithms, registered by the catalogue's names.

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
from worker.optimizers.dp_sgd import DPSGDConfig, train_dp_sgd
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
    generator: torch.Generator
    hooks: TrainingHooks
    resume_from: TrainingState | None
    device: torch.device


Trainer = Callable[[TrainingRequest], TrainingResult]
TRAINERS: Registry[Trainer] = Registry("trainer")
register_trainer = TRAINERS.register
get_trainer = TRAINERS.get


@register_trainer("dp-sgd")
def run_dp_sgd(request: TrainingRequest) -> TrainingResult:
    hyper = request.spec["algorithm"]["hyperparameters"]
    config = DPSGDConfig(
        steps=request.steps,
        sampling_probability=request.sampling_probability,
        noise_multiplier=request.noise_multiplier,
        clipping_norm=float(hyper["clipping_norm"]),
        learning_rate=float(request.spec["training"]["learning_rate"]),
        momentum=float(hyper["momentum"]),
        weight_decay=float(hyper["weight_decay"]),
        loss="cross_entropy" if request.task == "classification" else "mse",
        max_physical_batch_size=request.max_physical_batch_size,
        expected_batch_size=request.expected_batch_size,
    )
    return train_dp_sgd(
        request.model,
        request.X,
        request.y,
        config=config,
        generator=request.generator,
        hooks=request.hooks,
        resume_from=request.resume_from,
        device=request.device,
    )
