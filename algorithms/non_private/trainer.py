"""Trainers of the non-private optimizers (``sgd``, ``adam``): public datasets only.

Plain minibatch training: each step draws ``training.batch_size`` rows uniformly without
replacement, averages the loss and steps the optimizer. No clipping and no noise: the catalogue
(algorithms.non_private.definition) and the job lifecycle admit these jobs on public datasets only.
Frozen parameters (``requires_grad=False``, fine-tuning) are left out of the optimizer. With
``training.augmult`` = K the loss is averaged over K augmented views of each drawn image; with
``training.precision`` = bf16 the forward runs under bf16 autocast.
"""

from __future__ import annotations

import torch
from torch import nn

from algorithms.non_private.definition import SGD, Adam, AdamHyperparameters, SGDHyperparameters
from algorithms.trainers import TrainingRequest, register_trainer
from algorithms.training_fields import learning_rate_of
from dp.loop.augmult import forward_views
from dp.loop.state import TrainingResult
from dp.loop.steps import LiveState, run_steps
from dp.losses import get_loss, prepare_targets
from dp.per_example.per_sample import trainable_parameters
from dp.precision import autocast_context


def _mean_loss(output: torch.Tensor, target: torch.Tensor, loss: str) -> torch.Tensor:
    """The task's registered loss (a sum of per-row terms) averaged over the minibatch's rows."""
    spec = get_loss(loss)
    return spec.fn(output, prepare_targets(spec, target, dtype=output.dtype)) / max(1, output.shape[0])


def run_minibatches(
    request: TrainingRequest[SGDHyperparameters] | TrainingRequest[AdamHyperparameters],
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
) -> TrainingResult:
    """The shared loop: uniform minibatches, resumable from a checkpoint, cooperative stop."""
    hooks, generator = request.hooks, request.generator
    features, y = request.features, request.y.to(request.device)
    n = features.n_rows
    batch_size = max(1, min(n, round(request.expected_batch_size)))
    live = LiveState(model, optimizer, generator)
    step = live.restore(request.resume_from) if request.resume_from is not None else 0
    model.train()
    views = request.training.augmult
    precision = request.training.precision or "fp32"  # bf16: the forward under autocast, the loss in fp32

    def take_step(step: int) -> None:
        rows = generator.permutation(n)[:batch_size].to(y.device)
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(precision, device_type=request.device.type):
            outputs, targets = forward_views(
                model, features.take(rows), y[rows], views=views, generator=generator, step=step
            )
        _mean_loss(outputs.float(), targets, request.loss).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return run_steps(live, step=step, steps=request.steps, hooks=hooks, take_step=take_step)


@register_trainer(SGD)
def run_sgd(request: TrainingRequest[SGDHyperparameters]) -> TrainingResult:
    model = request.model.to(request.device)
    hyper = request.hyperparameters
    optimizer = torch.optim.SGD(
        list(trainable_parameters(model).values()),
        lr=learning_rate_of(request.training),
        momentum=hyper.momentum,
        weight_decay=hyper.weight_decay,
    )
    return run_minibatches(request, optimizer, model)


@register_trainer(Adam)
def run_adam(request: TrainingRequest[AdamHyperparameters]) -> TrainingResult:
    model = request.model.to(request.device)
    hyper = request.hyperparameters
    optimizer = torch.optim.Adam(
        list(trainable_parameters(model).values()),
        lr=learning_rate_of(request.training),
        betas=(hyper.beta1, hyper.beta2),
        eps=hyper.eps,
        weight_decay=hyper.weight_decay,
    )
    return run_minibatches(request, optimizer, model)
