"""Parameter averaging (training/ema.py): the EMA arithmetic on a recorded trajectory, and
that a resumed job continues the same average from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from dp.loop.state import TrainingState
from kernel.schemas.jobs import TrainingSpec
from training.artifacts import load_training_state, save_training_state
from training.ema import ParameterAverage
from worker.model_setup import parameter_average

DECAY = 0.9


def _trajectory(steps: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [  # the starting weights, then one iterate per step
        {"weight": torch.randn(2, 3, generator=generator), "bias": torch.randn(2, generator=generator)}
        for _ in range(steps + 1)
    ]


def _set(model: nn.Linear, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        model.weight.copy_(weights["weight"])
        model.bias.copy_(weights["bias"])


def _expected(trajectory: list[dict[str, torch.Tensor]], name: str) -> torch.Tensor:
    average = trajectory[0][name].clone()
    for weights in trajectory[1:]:
        average = DECAY * average + (1 - DECAY) * weights[name]
    return average


def _run(model: nn.Linear, average: ParameterAverage, trajectory: list[dict[str, torch.Tensor]], start: int) -> None:
    for step in range(start + 1, len(trajectory)):
        _set(model, trajectory[step])
        average.advance_to(step, model)
        average.advance_to(step, model)  # the checkpoint hook and on_step_end both fold a step: once


def test_the_average_is_the_ema_of_the_iterates_from_the_starting_weights() -> None:
    trajectory = _trajectory(6)
    model = nn.Linear(3, 2)
    _set(model, trajectory[0])
    average = ParameterAverage(model, decay=DECAY)
    _run(model, average, trajectory, start=0)
    assert average.updates == 6
    average.copy_to(model)
    torch.testing.assert_close(model.weight.detach(), _expected(trajectory, "weight"))
    torch.testing.assert_close(model.bias.detach(), _expected(trajectory, "bias"))
    assert not torch.allclose(model.weight.detach(), trajectory[-1]["weight"])  # not the last iterate


def test_frozen_parameters_are_neither_averaged_nor_overwritten() -> None:
    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    frozen = model.bias.detach().clone()
    average = ParameterAverage(model, decay=DECAY)
    assert set(average.average) == {"weight"}
    average.copy_to(model)
    torch.testing.assert_close(model.bias.detach(), frozen)


def test_a_step_cannot_be_skipped_and_decay_must_be_in_the_open_interval() -> None:
    model = nn.Linear(3, 2)
    average = ParameterAverage(model, decay=DECAY)
    with pytest.raises(ValueError, match="cannot skip"):
        average.advance_to(2, model)
    for decay in (0.0, 1.0):
        with pytest.raises(ValueError, match="decay"):
            ParameterAverage(model, decay=decay)


def test_a_resumed_job_continues_the_average_saved_with_its_checkpoint(tmp_path: Path) -> None:
    trajectory = _trajectory(6)
    model = nn.Linear(3, 2)
    _set(model, trajectory[0])
    average = ParameterAverage(model, decay=DECAY)
    _run(model, average, trajectory[:4], start=0)  # steps 1..3, then a checkpoint and a lost worker
    checkpoint = tmp_path / "job.safetensors"
    state = TrainingState(
        step=3,
        model_state={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer_state={"state": {}, "param_groups": []},
        generator_state=torch.zeros(4, dtype=torch.uint8),
    )
    save_training_state(checkpoint, state, extras=average.checkpoint_tensors())

    restarted = nn.Linear(3, 2)  # a fresh worker builds the model with other initial weights
    resume = load_training_state(checkpoint)
    training = TrainingSpec(steps=6, batch_size=4, learning_rate=0.1, ema_decay=DECAY)
    resumed = parameter_average(training, restarted, checkpoint, resume)
    assert resumed is not None and resumed.updates == 3
    restarted.load_state_dict(resume.model_state)
    _run(restarted, resumed, trajectory, start=3)
    resumed.copy_to(restarted)
    torch.testing.assert_close(restarted.weight.detach(), _expected(trajectory, "weight"))
    torch.testing.assert_close(restarted.bias.detach(), _expected(trajectory, "bias"))


def test_a_checkpoint_without_the_average_of_its_step_is_refused(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    checkpoint = tmp_path / "job.safetensors"
    state = TrainingState(
        step=2,
        model_state={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer_state={"state": {}, "param_groups": []},
        generator_state=torch.zeros(4, dtype=torch.uint8),
    )
    save_training_state(checkpoint, state)
    training = TrainingSpec(steps=6, batch_size=4, learning_rate=0.1, ema_decay=DECAY)
    with pytest.raises(ValueError, match="no parameter average"):
        parameter_average(training, model, checkpoint, load_training_state(checkpoint))
    assert parameter_average(TrainingSpec(steps=6), model, checkpoint, None) is None
