"""The trainers: worker-side implementations of catalogue algorithms, by the same names.

Each family's ``trainer.py`` registers its trainers with ``@register_trainer(Entry)``; the
families are algorithms/catalogue.py's one list, and the first lookup here imports all their
trainer modules (`load_trainers`), so no list of them is kept anywhere else.

Each trainer receives the job's charged parameters (σ, q, steps) straight from the job row, so the
noise it draws is exactly the event the API reserved, and the hyperparameters and training spec
that the catalogue re-derived (and re-validated) from the stored spec, typed: a trainer is
registered for its catalogue class, so ``request.hyperparameters`` has that class's model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

import torch
from pydantic import BaseModel
from torch import nn

from algorithms.catalogue import load_trainers
from algorithms.registry import AlgorithmDefinition, H
from dp.data.rows import Rows
from dp.data.units import UnitIndex
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.losses import loss_for_task
from dp.randomness.secure_random import SecureRandom
from kernel.registry import Registry
from kernel.schemas.jobs import TrainingSpec

__all__ = [
    "PREFLIGHTS",
    "TRAINERS",
    "Trainer",
    "TrainerOf",
    "TrainingRequest",
    "get_trainer",
    "preflight",
    "register_preflight",
    "register_trainer",
    "trainer_names",
]


@dataclass(frozen=True)
class TrainingRequest(Generic[H]):
    model: nn.Module
    features: Rows
    """The training rows' features, read batch by batch (on the device, or memory-mapped)."""
    y: torch.Tensor
    task: str
    hyperparameters: H
    """Validated by the catalogue entry that priced the job (the worker re-derives them)."""
    training: TrainingSpec
    """The accepted training spec: the fields the algorithm reads are present."""
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
    units: UnitIndex | None = None
    """The training rows' privacy units (a dataset with a privacy unit column); None: a unit is a row.
    Only trainers of algorithms with ``privacy_units`` read it; submission refuses the others."""

    @property
    def loss(self) -> str:
        """The registered loss of the dataset's task (dp/losses.py `loss_for_task`)."""
        return loss_for_task(self.task, token_loss=self.training.token_loss)


TrainerOf = Callable[[TrainingRequest[H]], TrainingResult]
"""A trainer of the algorithm whose hyperparameters model is H."""
Trainer = Callable[[TrainingRequest[Any]], TrainingResult]
TRAINERS: Registry[Trainer] = Registry("trainer")
"""Filled by the families' trainer modules as `load_trainers` imports them: read it through
`get_trainer` / `trainer_names`, which load them first."""


def get_trainer(name: str) -> Trainer:
    """The trainer of an algorithm name. The request's hyperparameters must come from the catalogue
    entry of the same name (as worker.runner builds them): this lookup is the one place where that
    pairing is taken as given instead of checked by types."""
    load_trainers()
    return TRAINERS.get(name)


def trainer_names() -> list[str]:
    """Every algorithm name with a trainer, sorted."""
    load_trainers()
    return TRAINERS.names()


def register_trainer(algorithm: type[AlgorithmDefinition[H]]) -> Callable[[TrainerOf[H]], TrainerOf[H]]:
    """Decorator: the trainer of ``algorithm`` (registered under its name), typed by its model."""

    def add(trainer: TrainerOf[H]) -> TrainerOf[H]:
        TRAINERS.add(algorithm.name, trainer)
        return trainer

    return add


Preflight = Callable[[nn.Module, Any], None]
PREFLIGHTS: Registry[Preflight] = Registry("preflight")


def register_preflight(
    algorithm: type[AlgorithmDefinition[H]],
) -> Callable[[Callable[[nn.Module, H], None]], Callable[[nn.Module, H], None]]:
    """Decorator: a check of ``algorithm``'s hyperparameters against the built model."""

    def add(check: Callable[[nn.Module, H], None]) -> Callable[[nn.Module, H], None]:
        PREFLIGHTS.add(algorithm.name, check)
        return check

    return add


def preflight(name: str, model: nn.Module, hyperparameters: BaseModel) -> None:
    """Checks that need the built model (parameter names, sizes), run before the data is opened.

    A ValueError here fails the job before TOUCH, so its reservation is released, not spent.
    """
    load_trainers()  # the checks are registered beside the trainers
    if name in PREFLIGHTS:
        PREFLIGHTS.get(name)(model, hyperparameters)
